"""End to end: Codex, Gemini and the ACP agents get a session's MCP servers their own way (the
control plane's "MCP servers", docs/mcp.md) and call their tools, with the pinned CLIs against
the rig's scripted model servers and real MCP servers made with the official SDK
(tests/support/mcp_servers.py): a stdio one whose tool answers the digest of the secret variable
it was started with, and a Streamable HTTP one on 127.0.0.1 that answers only its bearer token.
No frame, log record or session object holds either secret."""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from acp import PROTOCOL_VERSION, connect_to_agent, text_block
from acp.schema import ClientCapabilities, EnvVariable, McpServerStdio
from acp.ws.client import create_websocket_stream

from gateway.config import McpSettings
from gateway.protocol.mcp_servers import ServerSpec, server_from_table
from gateway.server import SESSIONS
from tests.e2e.test_e2e_acp import adapter_acp
from tests.server.test_acp_master_sdk import Recorder
from tests.support import mcp_servers as T
from tests.support import realcli
from tests.support.gateway_peer import (
    Master,
    base_url,
    create_session,
    of,
    prompt_and_wait,
)
from tests.support.servers import user_headers

pytestmark = pytest.mark.realcli

TURN = 120.0  # a bound on a hang (the CLI's start under load), not a measure


def configured(name: str, **table: Any) -> ServerSpec:
    """A server of ``[mcp.servers.NAME]``, as the configuration reads one (values expanded)."""
    return server_from_table(table, "config", name=name)


@contextlib.asynccontextmanager
async def servers() -> AsyncIterator[tuple[tuple[ServerSpec, ...], tuple[str, str]]]:
    """The two test servers as a session's configured ``docs`` (stdio) and ``tracker`` (http),
    and their two secrets."""
    stdio_secret, http_secret = f"stdio-{secrets.token_hex(8)}", f"http-{secrets.token_hex(8)}"
    async with T.http_server(http_secret) as url:
        docs = configured("docs", command=T.stdio_command(), env={T.SECRET_VARIABLE: stdio_secret})
        tracker = configured("tracker", url=url, headers={"Authorization": f"Bearer {http_secret}"})
        yield (docs, tracker), (stdio_secret, http_secret)


def check_no_secret(said: list[Any], caplog: pytest.LogCaptureFixture, *values: str) -> None:
    """Secrets never reach a master, a frame, a log line or the session object: every frame,
    every record of the gateway's log (its message and fields) and ``GET /v1/session``'s JSON.
    ``said``: what a master got; at least one record of the gateway's log is read."""
    assert any(r.name.startswith("rawp_gateway") for r in caplog.records)
    texts = [json.dumps(x) for x in said]
    texts += [
        f"{r.getMessage()} {r.__dict__!r}"
        for r in caplog.records
        if r.name.startswith(("rawp_gateway", "aiohttp"))  # the gateway's; not a client library's
    ]
    for value in values:
        assert not [t for t in texts if value in t]


def statuses(info: dict[str, Any]) -> dict[str, str]:
    """What ``GET /v1/session/{id}`` says became of each of the session's servers."""
    return {s["name"]: s["status"] for s in info["mcp_servers"]}


def results(frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {f["payload"]["tool_name"]: f["payload"] for f in of(frames, "tool.invoke.result")}


# --- Codex: -c mcp_servers.<name>... -----------------------------------------------------------


def codex_steps(
    steps: list[tuple[str, str, dict[str, Any], str]],
    final: str,
    prompt: str | None = None,
    *,
    acp: bool = False,
) -> list[dict[str, Any]]:
    """The model's answers for Codex calling MCP tools in turn: each step ``(server, tool,
    arguments, a text of its answer)`` calls the tool once the one before answered; then
    ``final`` is said. ``prompt``: only in the turn of that prompt.

    Codex does not wait for its MCP servers before its first model request. The CLI (0.171.0)
    offers their tools behind ``tool_search``, and announces a server that came up late to the
    model ("Added deferred tool namespaces: - mcp__<server>"): the first step waits until
    Codex's last word on the namespace offers it (``namespaces_offered``), then searches. A
    mention anywhere would not do: a resumed Codex resends the history of the process before it,
    whose server was up, then says "Removed" of its own until that one is up. codex-acp's Codex
    (0.137.0, ``acp``) offers a server's tools as the namespace ``mcp__<server>`` among its tools
    once it is up: the first step waits for it. Until then the model runs a short command
    (``WAITS``, which a scenario lists last)."""
    calls: list[dict[str, Any]] = []
    turn = {"last_user_contains": prompt} if prompt else {}
    namespace = f"mcp__{steps[0][0]}"
    gate: dict[str, Any] = (
        {"tools_include": [namespace]} if acp else {"namespaces_offered": [namespace]}
    )
    for server, tool, arguments, mark in steps:
        call = {"type": "function_call", "namespace": f"mcp__{server}", "name": tool}
        if not acp:
            search = {"type": "tool_search_call", "arguments": {"query": tool}}
            calls.append({"match": {**gate, **turn}, "output": [search]})
            gate = {**gate, "tool_output": True}
        calls.append({"match": {**gate, **turn}, "output": [{**call, "arguments": arguments}]})
        gate = {"input_contains": mark}
    calls.append({"match": {**gate, **turn}, "output": [{"type": "message", "text": final}]})
    return calls


WAIT = {"type": "function_call", "name": "exec_command", "arguments": {"cmd": "sleep 0.2"}}
WAITS = [{"output": [WAIT]} for _ in range(100)]  # at most 20 s of waiting for a slow start
DOCS_DIGEST = ("docs", "secret_digest", {})
CODEX_CALLS = [
    *codex_steps(
        [(*DOCS_DIGEST, T.STDIO_MARK), ("tracker", "add", {"a": 2, "b": 3}, f"{T.HTTP_MARK}: 5")],
        "Both servers answered.",
    ),
    *WAITS,
]


@pytest.mark.parametrize("mode", realcli.MODES)
async def test_codex_calls_a_stdio_and_an_http_servers_tools(mode, caplog):
    """Codex is given both servers by ``-c`` overrides, the stdio one's secret in its
    environment and the bearer token through ``env_http_headers``: it starts the one with the
    secret set (in the sandbox, inside it) and reaches the other with the token."""
    caplog.set_level(logging.DEBUG)
    async with servers() as (specs, (stdio_secret, http_secret)):
        scenario = realcli.scenario("codex", CODEX_CALLS)
        mcp = {"mcp": McpSettings(specs)}
        async with realcli.gateway(scenario, "codex", server=mcp, isolation_mode=mode) as rig:
            session_id, master = await rig.master()
            frames = await prompt_and_wait(master, "Use both servers.", timeout=TURN)
            got = results(frames)
            digest = got["mcp__docs__secret_digest"]
            assert digest["status"] == "success"
            assert digest["output"] == f"{T.STDIO_MARK}: {T.digest(stdio_secret)}"
            assert got["mcp__tracker__add"]["output"] == f"{T.HTTP_MARK}: 5"
            assert of(frames, "agent.text.done")[-1]["payload"]["full_text"] == (
                "Both servers answered."
            )
            info = await rig.info(session_id)
            # The CLI says nothing of its servers' start: pending, as far as masters can know.
            assert statuses(info) == {"docs": "pending", "tracker": "pending"}
            check_no_secret([*master.frames, info], caplog, stdio_secret, http_secret)


CODEX_RESUMED = [
    {"match": {"last_user_contains": "First"}, "output": [{"type": "message", "text": "First."}]},
    *codex_steps([(*DOCS_DIGEST, T.STDIO_MARK)], "Still there.", prompt="Second"),
    *WAITS,
]


async def test_codex_resume_keeps_the_servers():
    """DPS-18-respawn: the second prompt is a new ``codex exec resume`` process, given the same
    servers."""
    async with servers() as (specs, (stdio_secret, _)):
        scenario = realcli.scenario("codex", CODEX_RESUMED)
        async with realcli.gateway(scenario, "codex", server={"mcp": McpSettings(specs)}) as rig:
            _, master = await rig.master()
            await prompt_and_wait(master, "First", timeout=TURN)
            frames = await prompt_and_wait(master, "Second", timeout=TURN)
            assert results(frames)["mcp__docs__secret_digest"]["output"] == (
                f"{T.STDIO_MARK}: {T.digest(stdio_secret)}"
            )


# --- Gemini: its settings file -----------------------------------------------------------------

GEMINI_CALLS = [
    {
        "match": {"tools_include": ["mcp_docs_secret_digest", "mcp_tracker_add"]},
        "parts": [{"functionCall": {"name": "mcp_docs_secret_digest", "args": {}}}],
    },
    {
        "match": {"function_response": True, "contents_contain": T.STDIO_MARK},
        "parts": [{"functionCall": {"name": "mcp_tracker_add", "args": {"a": 2, "b": 3}}}],
    },
    {
        "match": {"function_response": True, "contents_contain": f"{T.HTTP_MARK}: 5"},
        "parts": [{"text": "Both servers answered."}],
    },
]


@pytest.mark.parametrize("mode", realcli.MODES)
async def test_gemini_calls_a_stdio_and_an_http_servers_tools(mode, caplog):
    """Gemini reads the servers from the settings file of the session's home (outside the
    sandbox a home of the session's own, ``GEMINI_CLI_HOME``; in it, the session's HOME), which
    names its secrets as variables of its environment; ``--allowed-mcp-server-names`` lets
    exactly these run, over the rig's own settings that allow none."""
    caplog.set_level(logging.DEBUG)
    async with servers() as (specs, (stdio_secret, http_secret)):
        scenario = realcli.scenario("gemini", GEMINI_CALLS)
        async with realcli.gateway(
            scenario, "gemini", server={"mcp": McpSettings(specs)}, isolation_mode=mode
        ) as rig:
            session_id, master = await rig.master()
            frames = await prompt_and_wait(master, "Use both servers.", timeout=TURN)
            got = results(frames)
            assert got["mcp_docs_secret_digest"]["output"] == (
                f"{T.STDIO_MARK}: {T.digest(stdio_secret)}"
            )
            assert got["mcp_tracker_add"]["output"] == f"{T.HTTP_MARK}: 5"
            settings = Path(rig.session(session_id).home()) / ".gemini" / "settings.json"
            written = settings.read_text()
            assert set(json.loads(written)["mcpServers"]) == {"docs", "tracker"}
            assert stdio_secret not in written and http_secret not in written
            assert stat.S_IMODE(settings.stat().st_mode) == 0o600
            info = await rig.info(session_id)
            # The CLI says nothing of its servers' start: pending, as far as masters can know.
            assert statuses(info) == {"docs": "pending", "tracker": "pending"}
            check_no_secret([*master.frames, info], caplog, stdio_secret, http_secret)


# --- ACP agents: session/new, session/load -----------------------------------------------------


def codex_acp(
    calls: list[dict[str, Any]], specs: tuple[ServerSpec, ...] = (), **changes: Any
) -> contextlib.AbstractAsyncContextManager[Any]:
    """The codex-acp profile against the rig's Responses server, with ``specs`` configured;
    ``changes``: the profile's fields."""
    return adapter_acp("codex-acp", calls, changes=changes, mcp=McpSettings(specs))


async def allowed_turn(master: Master, text: str) -> list[dict[str, Any]]:
    """A prompt whose questions the master allows (claude-agent-acp asks before an MCP tool,
    codex-acp before a tool it does not know to be read-only); the turn's frames, to its end."""
    start = len(master.frames)
    await master.send("control.prompt.request", {"prompt_text": text})
    while (frame := await master.next(timeout=TURN))["type"] != "session.turn.end":
        if frame["type"] == "agent.interaction.request":
            await master.send(
                "control.interaction.response",
                {"interaction_id": frame["payload"]["interaction_id"], "selected_value": "allow"},
            )
    return master.frames[start:]


def adding(prompt: str, a: int, b: int) -> list[dict[str, Any]]:
    """The model's answers to ``prompt``: the tracker's ``add`` of ``a`` and ``b``, then done."""
    step = ("tracker", "add", {"a": a, "b": b}, f"{T.HTTP_MARK}: {a + b}")
    return codex_steps([step], f"{prompt} done.", prompt=prompt, acp=True)


async def test_codex_acp_gets_the_servers_in_session_new_and_again_in_session_load():
    """DPS-18-respawn: the configured http server reaches the ACP agent in ``session/new``, and
    its tool answers (the agent sent the bearer token it was given), allowed by the profile's
    ``auto_allow`` by its ``mcp__<server>__<tool>`` name. A turn then stalls: the
    watchdog stops the agent and starts it again, which loads its session (ACP keeps no MCP
    server across a load: the gateway gives them again), and the tool still answers."""
    async with servers() as (specs, _):
        stall = {"match": {"last_user_contains": "Stall"}, "output": [], "hang": True}
        calls = [*adding("First", 2, 3), stall, *adding("Second", 4, 5), *WAITS]
        # auto_allow names the MCP tool as every agent's is named (docs/mcp.md): never asked.
        changes = {
            "stall_warning_sec": 1.0,
            "stall_timeout_sec": 2.0,
            "auto_allow": frozenset({"mcp__tracker__add"}),
        }
        async with codex_acp(calls, specs[1:], **changes) as (_, gw):
            sid = (await create_session(gw, "codex-acp"))["session_id"]
            master = await Master.attach(gw, sid)
            frames = await allowed_turn(master, "First")
            (result,) = [r for r in of(frames, "tool.invoke.result") if r["payload"]["output"]]
            assert result["payload"]["tool_name"] == "mcp__tracker__add"  # as Claude Code's
            assert f"{T.HTTP_MARK}: 5" in json.dumps(result["payload"])

            first = gw.server.app[SESSIONS][sid].process
            frames = await allowed_turn(master, "Stall")
            assert of(frames, "session.turn.end")[-1]["payload"]["stop_reason"] == "error"
            frames = await allowed_turn(master, "Second")
            assert gw.server.app[SESSIONS][sid].process is not first  # a new agent process
            assert f"{T.HTTP_MARK}: 9" in json.dumps(of(frames, "tool.invoke.result"))
            assert of(frames, "agent.text.done")[-1]["payload"]["full_text"] == "Second done."
            asked = [
                json.dumps(f["payload"]) for f in of(master.frames, "agent.interaction.request")
            ]
            assert not [q for q in asked if "mcp__tracker" in q]


async def test_claude_acp_starts_a_stdio_server_given_in_session_new():
    """claude-agent-acp 0.23.1 has been seen to drop stdio servers: the pinned one starts the
    configured stdio server given in ``session/new`` (without ``type``, which it refuses: see
    docs/mcp.md) and Claude Code calls its tool, after the master allows it."""
    async with servers() as (specs, (stdio_secret, _)):
        calls = [
            {"content": [{"type": "tool_use", "name": "mcp__docs__secret_digest", "input": {}}]},
            {
                "match": {"tool_result": True},
                "content": [{"type": "text", "text": "The digest came."}],
            },
        ]
        async with adapter_acp("claude-acp", calls, mcp=McpSettings(specs[:1])) as (_, gw):
            sid = (await create_session(gw, "claude-acp"))["session_id"]
            master = await Master.attach(gw, sid)
            frames = await allowed_turn(master, "Use the docs server.")
            (result,) = of(frames, "tool.invoke.result")
            assert result["payload"]["tool_name"] == "mcp__docs__secret_digest"
            assert f"{T.STDIO_MARK}: {T.digest(stdio_secret)}" in json.dumps(result["payload"])


async def test_an_editors_servers_reach_the_agent_through_acp(caplog):
    """An editor (the official ACP Python SDK over ``/acp``) is told the agent takes http servers
    (``mcpCapabilities``) and sends its own stdio server in ``session/new``: the gateway checks
    it as a master's and hands it to the session's agent, whose tool then answers with the digest
    of the editor's secret. The secret is in no frame and no log record."""
    caplog.set_level(logging.DEBUG)
    secret = f"editor-{secrets.token_hex(8)}"
    steps = [(*DOCS_DIGEST, T.STDIO_MARK)]
    calls = [*codex_steps(steps, "Editor done.", "Editor", acp=True), *WAITS]
    async with codex_acp(calls) as (cli, gw):
        url = base_url(gw).replace("http", "ws", 1) + "/acp?agent=codex-acp"
        editor = Recorder(choose="allow")
        stream = await create_websocket_stream(url, headers=user_headers(base_url(gw)))
        conn = connect_to_agent(editor, stream)
        try:
            init = await conn.initialize(
                protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities()
            )
            caps = init.agent_capabilities.mcp_capabilities
            assert (caps.http, caps.sse) == (True, False)
            program, *args = T.stdio_command()
            env = [EnvVariable(name=T.SECRET_VARIABLE, value=secret)]
            docs = McpServerStdio(name="docs", command=program, args=args, env=env)
            new = await conn.new_session(cwd=str(cli.cwd), mcp_servers=[docs])
            done = await conn.prompt(session_id=new.session_id, prompt=[text_block("Editor")])
            assert done.stop_reason == "end_turn"
            said = [u.model_dump_json() for _, u in editor.updates]
            assert [u for u in said if f"{T.STDIO_MARK}: {T.digest(secret)}" in u]
            assert editor.text().endswith("Editor done.")
            session = gw.server.app[SESSIONS][new.session_id]
            assert [(s.name, s.origin) for s in session.mcp_servers] == [("docs", "editor")]
            buffered = [f.decode() for f in session.buffer.everything().frames]
            check_no_secret([*said, *buffered], caplog, secret)
        finally:
            await conn.close()
