"""``rawp-gateway acp`` follows a gateway started again on its port (docs/identities.md, "The
local token"): the relay found the token in the port's file, the new gateway made a new one, and
the relay reads the file again before it reconnects instead of being refused for ever."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from gateway.local_token import local_token
from tests.support.acp_editors import TURN, prompt, python_editor, relay_argv, relay_env
from tests.support.servers import CLI, free_port, wait_http
from tests.support.waiting import eventually

STOP_SEC = 20.0  # a bound on a hang


def start(port: int, workspace: Path, state: Path) -> subprocess.Popen:
    argv = [*CLI, "serve", "--workspace-root", str(workspace), "--state-dir", str(state)]
    return subprocess.Popen([*argv, "--port", str(port)], stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def killed_at_the_end(procs: list[subprocess.Popen]) -> Iterator[None]:
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def test_the_relay_reads_the_made_token_again_after_the_gateway_restarts(tmp_path):
    """The official Python SDK drives the relay; the gateway (a state dir: its sessions survive)
    is stopped with SIGTERM and started again on the same port with a new made token. The relay
    reconnects, loads the session again, and the next prompt on it is answered."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    state = tmp_path / "state"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    procs = [start(port, workspace, state)]
    with killed_at_the_end(procs):
        await wait_http(url, procs[0])
        first = local_token(url)
        assert first
        async with python_editor(relay_argv(url, agent="demo"), relay_env(), tmp_path) as ed:
            init = {"protocolVersion": 1, "clientCapabilities": {}}
            await ed.request("initialize", init)
            sid = (await ed.request("session/new", {"cwd": str(workspace)}))["sessionId"]
            done = await asyncio.wait_for(ed.request("session/prompt", prompt(sid, "hello")), TURN)
            assert done["stopReason"] == "end_turn"

            procs[0].send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(procs[0].wait, STOP_SEC) == 0
            await eventually(lambda: "connection to the gateway lost" in ed.stderr(), "the drop")
            procs.append(start(port, workspace, state))
            await wait_http(url, procs[1])
            assert local_token(url) not in (None, first), "the new gateway made a new token"

            await eventually(lambda: "sessions loaded again" in ed.stderr(), "the reload", TURN)
            again = ed.request("session/prompt", prompt(sid, "hello again"))
            done = await asyncio.wait_for(again, TURN)
            assert done["stopReason"] == "end_turn"
            assert "reconnected; loading 1 session(s) again" in ed.stderr()
