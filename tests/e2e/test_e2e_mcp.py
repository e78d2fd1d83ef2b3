"""A session's MCP servers with the real Claude Code CLI (docs/mcp.md): the gateway runs as a real
``serve`` process with ``[mcp.servers.NAME]`` in its configuration (``${NAME}`` from its
environment), a master adds servers in ``POST /v1/session``, and the scripted model calls the tools
of a real stdio MCP server and a real Streamable HTTP one (tests/support/mcp_servers.py, the
official MCP Python SDK) through the CLI: with ``auto_allow`` and a policy rule naming the tools, a
failing server beside them, a restart in between, and no secret in any frame, log line, audit
record or session object."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.agent.mcp import CLAUDE_CONFIG_FILE
from gateway.agent.profiles import builtin_profiles
from gateway.config import McpSettings
from gateway.protocol.mcp_servers import ServerSpec, finished
from tests.e2e.test_e2e_restart import Gateway, _toml, attach
from tests.support import mcp_servers as servers
from tests.support import realcli
from tests.support.gateway_peer import Master, of, prompt_and_wait
from tests.support.inside import check_process
from tests.support.procs import cmdline, descendants
from tests.support.realcli import MODES
from tests.support.rig.env import require_cli
from tests.support.rig.run import CliSetup, scripted_cli
from tests.support.rig.scenario import parse_scenario
from tests.support.servers import user_headers, wait_http
from tests.support.waiting import eventually

pytestmark = pytest.mark.realcli

# Each secret is a value no other text holds, so finding it anywhere is the leak.
STDIO_SECRET = "stdio-secret-5b1f0c7e9a"  # the configured stdio server's env, via ${...}
HTTP_SECRET = "http-secret-a83d2e61c4"  # the master's http server's bearer token
BROKEN_SECRET = "broken-secret-77c0d41f2b"  # the env of a server that cannot start
SECRETS = (STDIO_SECRET, HTTP_SECRET, BROKEN_SECRET)

CALLS = [
    {"content": [{"type": "tool_use", "name": "mcp__local__secret_digest", "input": {}}]},
    {"match": {"tool_result": True}, "content": [{"type": "text", "text": "Digest seen."}]},
    {
        "match": {"last_user_contains": "now add"},
        "content": [{"type": "tool_use", "name": "mcp__remote__add", "input": {"a": 2, "b": 40}}],
    },
    {"match": {"tool_result": True}, "content": [{"type": "text", "text": "Sum seen."}]},
]


class Serve(Gateway):
    """``rawp-gateway serve`` on one state directory (test_e2e_restart's), with an environment of
    its own and its log (JSON) kept in a file per start."""

    def __init__(self, cli: CliSetup, config: Path, env: dict[str, str]) -> None:
        super().__init__(cli, cli.root / "state", config)
        self.env = env
        self.logs: list[Path] = []

    async def start(self) -> None:
        cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(self.config)]
        cmd += ["--port", str(self.port), "--state-dir", str(self.state), "--log-format", "json"]
        log = self.cli.root / f"serve-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as out:  # a file: a pipe nobody reads could fill and stop it
            self.proc = subprocess.Popen(cmd, stderr=out, stdin=subprocess.DEVNULL, env=self.env)
        await wait_http(self.url, self.proc)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        status = super().stop(sig)
        assert status == 0
        return status


@contextlib.asynccontextmanager
async def serving(http_url: str) -> AsyncIterator[Serve]:
    """The gateway for CALLS: ``local`` (stdio) configured with ``${MCP_TEST_SECRET}`` from its
    environment, auto-allowed by name; a policy rule allowing ``remote``'s tools."""
    require_cli("claude-code")
    sc = parse_scenario({"run": {}, "calls": CALLS}, name="e2e-mcp", agent="claude-code")
    async with scripted_cli(sc, agent="claude-code") as cli:
        base = builtin_profiles(claude=str(cli.binary))["claude-code"]
        command = servers.stdio_command()
        config = cli.root / "gateway.toml"
        config.write_text(
            "[server]\n"
            f"workspace_root = {_toml(str(cli.cwd))}\n"
            "[auth]\n"
            f"audit_log = {_toml(str(cli.root / 'audit.jsonl'))}\n"
            "[agents.claude-code]\n"
            f"command = {_toml(list(base.command))}\n"
            f"env = {_toml(cli.env)}\n"
            'auto_allow = ["Read", "mcp__local__secret_digest"]\n'
            "[mcp.servers.local]\n"
            f"command = {_toml(command)}\n"
            f'env = {{ {servers.SECRET_VARIABLE} = "${{MCP_TEST_SECRET}}" }}\n'
            "[[policy.rules]]\n"
            'name = "team-tracker"\n'
            'tools = ["mcp__remote__*"]\n'
            'decision = "allow"\n'
        )
        env = {**os.environ, "MCP_TEST_SECRET": STDIO_SECRET}
        gw = Serve(cli, config, env)
        await gw.start()
        try:
            async with asyncio.timeout(180):
                yield gw
        finally:
            gw.kill()


def request_servers(http_url: str) -> list[dict[str, Any]]:
    return [
        {"name": "remote", "url": http_url, "headers": {"Authorization": f"Bearer {HTTP_SECRET}"}},
        {"name": "broken", "command": ["/nonexistent/mcp-server"], "env": {"K": BROKEN_SECRET}},
    ]


def results(frames: list[dict[str, Any]]) -> str:
    return json.dumps([f["payload"] for f in of(frames, "tool.invoke.result")])


def statuses(frame: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {
        s["name"]: (s["kind"], s["origin"], s["status"])
        for s in frame["metadata"]["rawp_mcp_servers"]
    }


async def catalog_with_reason(master: Master) -> dict[str, Any]:
    """The catalog that says why ``broken`` failed (after the one of the agent's start: the shell
    reads Claude Code's MCP log), whether it came in the turn or comes after it."""

    def explained(frame: dict[str, Any]) -> bool:
        said = (frame.get("metadata") or {}).get("rawp_mcp_servers", [])
        return any(s["name"] == "broken" and "reason" in s for s in said)

    for frame in of(master.frames, "tool.catalog.publish"):
        if explained(frame):
            return frame
    while True:
        frame = await master.until("tool.catalog.publish", timeout=60)
        if explained(frame):
            return frame


def everything_written(gw: Serve) -> dict[str, str]:
    """Every file the gateway wrote but the session's own record and its agent's HOME (which
    hold a master's servers whole, by design: docs/mcp.md#what-is-kept): logs, audit, frames."""
    out = {}
    for path in [*gw.logs, gw.cli.root / "audit.jsonl", *gw.state.rglob("frames.log")]:
        out[str(path)] = path.read_text(errors="replace")
    return out


async def test_claude_code_calls_a_stdio_and_an_http_server_across_a_restart_and_no_secret_leaks():
    """The configured stdio server's tool runs (auto_allow names it) and answers the digest of the
    secret it got from ${MCP_TEST_SECRET}; after a graceful restart the respawned CLI gets the
    same servers and the master's http server's tool runs (a policy rule allows it) with its
    bearer header; the server that cannot start is reported failed, with Claude Code's own reason,
    and the session goes on. No secret is in a frame, the log, the audit log or the session
    object; the --mcp-config file is 0600 in the session's HOME."""
    async with (
        servers.http_server(HTTP_SECRET) as http_url,
        serving(http_url) as gw,
        aiohttp.ClientSession() as http,
    ):
        headers = user_headers(gw.url)
        body = {"agent": "claude-code", "mcp_servers": request_servers(http_url)}
        async with http.post(f"{gw.url}/v1/session", json=body, headers=headers) as resp:
            assert resp.status == 201, await resp.text()
            created = await resp.json()
        sid = created["session_id"]
        master = await attach(http, gw, sid)
        frames = await prompt_and_wait(master, "digest please", idle=True, timeout=90)
        assert f"stdio-mcp-ran: {servers.digest(STDIO_SECRET)}" in results(frames)
        assert not of(frames, "control.interaction.request")  # auto_allow named the tool
        catalog = await catalog_with_reason(master)
        assert statuses(catalog) == {
            "local": ("stdio", "config", "connected"),
            "remote": ("http", "request", "connected"),
            "broken": ("stdio", "request", "failed"),
        }
        broken = [s for s in catalog["metadata"]["rawp_mcp_servers"] if s["name"] == "broken"]
        assert "ENOENT" in broken[0]["reason"]
        names = {t["name"] for t in catalog["payload"]["tools"]}
        assert {"mcp__local__echo", "mcp__local__secret_digest", "mcp__remote__add"} <= names
        # The session's own directory (without the sandbox it holds only what the gateway wrote).
        mode = (gw.state / "sessions" / sid / "home" / CLAUDE_CONFIG_FILE).stat().st_mode
        assert stat.S_IMODE(mode) == 0o600

        stopping = asyncio.to_thread(gw.stop)
        await asyncio.gather(master.drain_until_closed(timeout=30), stopping)
        seen = list(master.frames)
        await gw.start()
        again = await attach(http, gw, sid, seen[-1]["message_id"])
        await again.until("session.history", timeout=60)
        frames = await prompt_and_wait(again, "now add them", idle=True, timeout=90)
        assert "http-mcp-ran: 42" in results(frames)
        assert not of(frames, "control.interaction.request")  # the policy rule allowed it
        async with http.get(f"{gw.url}/v1/session/{sid}", headers=user_headers(gw.url)) as got:
            session = await got.json()
        assert {s["name"] for s in session["mcp_servers"]} == {"local", "remote", "broken"}
        async with http.get(f"{gw.url}/v1/agents", headers=user_headers(gw.url)) as got:
            agents = {a["name"]: a for a in (await got.json())["agents"]}
        assert agents["claude-code"]["mcp"] == ["stdio", "http"]
        assert agents["demo"]["mcp"] == []
        gw.stop()

        said = {
            "frames": json.dumps(seen + again.frames),
            "created": json.dumps(created),
            "session": json.dumps(session),
            **everything_written(gw),
        }
        leaks = [(where, s) for where, text in said.items() for s in SECRETS if s in text]
        assert leaks == []
        # What was searched says the servers, by name: the audit of the create, the frames.
        audit = [
            json.loads(line) for line in (gw.cli.root / "audit.jsonl").read_text().splitlines()
        ]
        create = [a for a in audit if a.get("action") == "session.create"]
        assert [s["name"] for s in create[0]["detail"]["mcp_servers"]] == [
            "local",
            "remote",
            "broken",
        ]
        assert "mcp__remote__add" in said["frames"] and "session restored" in said[str(gw.logs[1])]
        assert json.dumps(session).count("Authorization") == 1  # a header's name may be said


async def test_a_request_may_not_replace_a_configured_server_and_nothing_is_created():
    async with (
        servers.http_server(HTTP_SECRET) as http_url,
        serving(http_url) as gw,
        aiohttp.ClientSession() as http,
    ):
        headers = user_headers(gw.url)
        for entries, said in [
            ([{"name": "local", "command": ["/bin/true"]}], "never replaced"),
            ([{"name": "x", "url": "file:///etc/passwd"}], "http:// or https://"),
            ({"name": "x"}, "must be a list"),
        ]:
            body = {"agent": "claude-code", "mcp_servers": entries}
            async with http.post(f"{gw.url}/v1/session", json=body, headers=headers) as resp:
                assert resp.status == 400
                error = await resp.json()
            assert error["error_code"] == "INVALID_MCP_SERVERS" and said in error["message"]
        async with http.get(f"{gw.url}/v1/sessions", headers=headers) as resp:
            assert (await resp.json())["sessions"] == []
        await eventually(lambda: not list(gw.state.glob("sessions/*")), "no session directory")


@pytest.mark.parametrize("mode", MODES)
async def test_a_stdio_server_runs_as_the_agents_child_where_its_isolation_says(mode):
    """The stdio server is started by the CLI, below it: in the sandbox inside it (in namespaces
    other than the gateway's, its HOME the session's own), and its tool answers from there."""
    sandboxed = realcli.isolation(mode).sandboxed
    local = finished(
        ServerSpec(command=tuple(servers.stdio_command()), env={servers.SECRET_VARIABLE: "v"}),
        "local",
        "config",
    )
    calls = [CALLS[0], {"content": [{"type": "text", "text": "Digest seen."}]}]
    async with realcli.gateway(
        realcli.scenario("claude-code", calls),
        "claude-code",
        server={"mcp": McpSettings((local,))},
        auto_allow=frozenset({"mcp__local__secret_digest"}),
        isolation_mode=mode,
    ) as rig:
        sid, master = await rig.master()
        frames = await prompt_and_wait(master, "digest please", idle=True, timeout=90)
        assert f"stdio-mcp-ran: {servers.digest('v')}" in results(frames)
        session = rig.session(sid)
        check_process(session, sandboxed)  # the agent and all below it
        live = session.process
        assert live is not None and live.pid is not None
        below = [pid for pid in descendants(live.pid) if str(servers.SCRIPT) in cmdline(pid)]
        assert below, "the stdio server runs below the agent"
        config = Path(session.home()) / CLAUDE_CONFIG_FILE
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        assert (rig.home(sid) == Path(session.home())) is sandboxed
