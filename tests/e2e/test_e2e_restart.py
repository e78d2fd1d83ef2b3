"""Sessions survive a restart of ``rawp-gateway serve``, with the real Claude Code CLI: the gateway
runs as a real process on a state directory, is stopped (SIGTERM, or SIGKILL as in an OOM kill) and
started again on the same directory; a real WebSocket master reattaches with its last message id,
and the next prompt reaches the scripted model server with the earlier turn in its request (the CLI
was spawned again with ``--resume``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.agent.profiles import builtin_profiles
from tests.support.gateway_peer import Master, prompt_and_wait
from tests.support.paths import RIG
from tests.support.procs import session_processes
from tests.support.rig.anthropic import last_user_text
from tests.support.rig.env import require_cli
from tests.support.rig.run import CliSetup, scripted_cli
from tests.support.servers import free_port, user_headers, wait_http
from tests.support.waiting import eventually

pytestmark = pytest.mark.realcli

SCENARIO = RIG / "scenarios" / "claude-code-e2e" / "restart.toml"
SUBPROTOCOL = "rawp-dps-1.0"


def _toml(value: Any) -> str:
    """A TOML value for strings, lists of strings and tables of strings (JSON's string syntax is
    TOML's basic string syntax)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


class Gateway:
    """``rawp-gateway serve`` as a process, started again and again on one state directory."""

    def __init__(self, cli: CliSetup, state: Path, config: Path) -> None:
        self.cli, self.state, self.config = cli, state, config
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(self.config)]
        cmd += ["--port", str(self.port), "--state-dir", str(self.state)]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        await wait_http(self.url, self.proc)

    def stop(self, sig: int) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextlib.asynccontextmanager
async def restartable() -> AsyncIterator[Gateway]:
    require_cli("claude-code")
    async with scripted_cli(SCENARIO) as cli:
        base = builtin_profiles(claude=str(cli.binary))["claude-code"]
        config = cli.root / "gateway.toml"
        config.write_text(
            "[server]\n"
            f"workspace_root = {_toml(str(cli.cwd))}\n"
            "[agents.claude-code]\n"
            f"command = {_toml(list(base.command))}\n"
            f"env = {_toml(cli.env)}\n"
        )
        gw = Gateway(cli, cli.root / "state", config)
        await gw.start()
        try:
            async with asyncio.timeout(120):
                yield gw
        finally:
            gw.kill()


async def attach(http: aiohttp.ClientSession, gw: Gateway, sid: str, last: str | None = None):
    params = {"last_message_id": last} if last else {}
    ws = await http.ws_connect(
        f"{gw.url}/v1/session/{sid}/ws",
        protocols=(SUBPROTOCOL,),
        params=params,
        headers=user_headers(gw.url),  # read again: a restarted serve made a new token
    )
    return Master(ws, sid)


def model_requests(gw: Gateway) -> list[Any]:
    return [r for r in gw.cli.server.requests if r.path.startswith("/v1/messages")]


def conversation(body: dict[str, Any]) -> str:
    """The request's messages as text (what the model is shown of earlier turns)."""
    return json.dumps(body.get("messages", []))


async def first_turn(http: aiohttp.ClientSession, gw: Gateway) -> tuple[str, Master]:
    async with http.post(
        f"{gw.url}/v1/session", json={"agent": "claude-code"}, headers=user_headers(gw.url)
    ) as resp:
        assert resp.status == 201, await resp.text()
        sid = (await resp.json())["session_id"]
    master = await attach(http, gw, sid)
    await prompt_and_wait(master, "the first question", idle=True)
    return sid, master


async def test_graceful_restart_with_the_real_cli_is_lossless_and_the_cli_resumes():
    """SIGTERM: the master is closed with 1012, reattaches after the restart with its last
    message id and gets exactly nothing it missed (DPS-7.1-history, truncated false); the next
    prompt is answered by a CLI spawned with --resume, whose request carries the first turn."""
    async with restartable() as gw, aiohttp.ClientSession() as http:
        sid, master = await first_turn(http, gw)
        agent_session = (
            await (
                await http.get(f"{gw.url}/v1/session/{sid}", headers=user_headers(gw.url))
            ).json()
        )["agent_session_id"]
        stopping = asyncio.to_thread(gw.stop, signal.SIGTERM)
        _, status = await asyncio.gather(master.drain_until_closed(timeout=30), stopping)
        assert master.end is not None and master.end.data == 1012, master.end
        assert status == 0
        last = master.frames[-1]["message_id"]

        await gw.start()
        listed = (
            await (await http.get(f"{gw.url}/v1/sessions", headers=user_headers(gw.url))).json()
        )["sessions"]
        assert [(s["session_id"], s["state"]) for s in listed] == [(sid, "DETACHED")]
        assert listed[0]["agent_session_id"] == agent_session
        again = await attach(http, gw, sid, last)
        history = await again.until("session.history", timeout=60)
        assert history["payload"]["frames"] == []
        assert history["payload"]["buffer_status"]["truncated"] is False

        await again.send("control.prompt.request", {"prompt_text": "the third question"})
        start = await again.until("session.turn.start", timeout=60)
        assert start["payload"]["turn_index"] == 1
        await again.until("session.turn.end", timeout=60)
        texts = "".join(
            f["payload"]["text"] for f in again.frames if f["type"] == "agent.text.delta"
        )
        assert texts == "The third answer, after the restart."
        last_request = model_requests(gw)[-1].body
        assert last_user_text(last_request).endswith("the third question")
        assert "the first question" in conversation(last_request)
        assert "forty-two" in conversation(last_request)


async def test_sigkill_mid_turn_closes_the_turn_and_the_cli_resumes():
    """SIGKILL in the middle of a streamed answer: after the restart the master gets what was
    written down, truncated (frames may be missing), each frame once and in order, then the turn
    closed in history: open text done with is_cancelled, agent.error GATEWAY_RESTARTED
    (recoverable), session.turn.end error and session.usage (DPS-7.5.3-cleanup order). The next
    prompt reaches the model with the first turn in its request."""
    async with restartable() as gw, aiohttp.ClientSession() as http:
        sid, master = await first_turn(http, gw)
        await master.send("control.prompt.request", {"prompt_text": "the second question"})
        start = await master.until("session.turn.start", timeout=60)
        for _ in range(3):
            await master.until("agent.text.delta", timeout=60)
        gw.stop(signal.SIGKILL)
        await master.drain_until_closed(timeout=30)
        seen = [f["message_id"] for f in master.frames]
        # The orphaned CLI ends when its stdin closes; wait so two CLIs never share the session.
        await eventually(lambda: not session_processes(sid), "the orphaned CLI to end")

        await gw.start()
        again = await attach(http, gw, sid, seen[-1])
        history = (await again.until("session.history", timeout=60))["payload"]
        assert history["buffer_status"]["truncated"] is True
        got = history["frames"]
        ids = [f["message_id"] for f in got]
        assert len(ids) == len(set(ids)) and not set(ids) & set(seen)
        stamps = [f["timestamp"] for f in got]
        assert stamps == sorted(stamps)
        types = [f["type"] for f in got]
        assert types[-4:-1] == ["agent.error", "session.turn.end", "session.usage"]
        assert "agent.text.done" in types
        done = got[types.index("agent.text.done")]["payload"]
        assert done["is_cancelled"] is True
        error = got[types.index("agent.error")]["payload"]
        assert (error["error_code"], error["recoverable"]) == ("GATEWAY_RESTARTED", True)
        ended = got[types.index("session.turn.end")]
        assert ended["payload"]["stop_reason"] == "error"
        assert ended["turn_id"] == start["payload"]["turn_id"]

        await again.send("control.prompt.request", {"prompt_text": "the third question"})
        await again.until("session.turn.end", timeout=60)
        last_request = model_requests(gw)[-1].body
        assert last_user_text(last_request).endswith("the third question")
        assert "forty-two" in conversation(last_request)
