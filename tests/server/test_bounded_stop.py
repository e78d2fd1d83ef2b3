"""A stopping gateway does not wait on a master that stopped reading.

Container engines send SIGTERM and, 10 s later by default, SIGKILL (``docker stop``, ``podman
stop``); a gateway killed mid-suspend leaves its sessions as after a crash. A master that is
attached but reads nothing (a frozen laptop, a stalled proxy) never answers the close frame, and
its socket may be too full to take it: the gateway must give up on it within the close timeout
(``CLOSE_TIMEOUT_SEC``, docs/limits.md) and still suspend every session cleanly.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp
import pytest

from gateway.storage.state_dir import RECORD
from tests.client.test_acp_relay_sdks import prompt
from tests.support.acp_editors import EditorError, python_editor, relay_argv, relay_env
from tests.support.serve_process import attached, serve, stalled_master
from tests.support.servers import user_headers
from tests.support.waiting import eventually

ENGINE_STOP_TIMEOUT_SEC = 10.0  # docker stop / podman stop, before SIGKILL


async def info(http: aiohttp.ClientSession, url: str, session_id: str) -> dict:
    return await (await http.get(f"{url}/v1/session/{session_id}")).json()


async def test_sigterm_with_a_master_that_reads_nothing_exits_in_bounded_time(tmp_path):
    """One turn's answer (a 60 KB file read) is written towards a master that never reads and
    holds a 4 KB window; then SIGTERM. The gateway exits 0 before an engine's SIGKILL, and the
    session is saved as a clean stop."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "big.txt").write_text("x" * 60_000 + "\n")
    state = tmp_path / "state"
    args = ("--workspace-root", str(workspace), "--state-dir", str(state))
    async with (
        serve(*args) as (proc, url),
        aiohttp.ClientSession(headers=user_headers(url)) as http,
    ):
        resp = await http.post(f"{url}/v1/session", json={"agent": "demo"})
        assert resp.status == 201, await resp.text()
        session_id = (await resp.json())["session_id"]
        sock = stalled_master(url, session_id, "read big.txt")
        try:
            async with asyncio.timeout(30):
                while (await info(http, url, session_id))["turn_index"] < 1:
                    await asyncio.sleep(0.05)
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            # Past this an engine would have SIGKILLed it (TimeoutExpired fails the test).
            code = await asyncio.to_thread(proc.wait, ENGINE_STOP_TIMEOUT_SEC)
            print(f"stopped {time.monotonic() - started:.1f} s after SIGTERM")
        finally:
            sock.close()
    assert code == 0
    record = json.loads((state / "sessions" / session_id / RECORD).read_text())
    assert record["clean"] is True


SHUTDOWN_GRACE_SEC = 5.0  # [server] shutdown_grace_sec's default
# docs/limits.md: a stop takes at most shutdown_grace_sec + 4 s (the last frames, then the close
# handshake, 2 s each): every connection is closed by then.
STOP_BOUND_SEC = SHUTDOWN_GRACE_SEC + 4.0


async def closed_by_the_gateway(ws: aiohttp.ClientWebSocketResponse) -> int | None:
    """Read until the socket ends: the close code the gateway sent (a close frame, which only a
    running gateway can send), or None when it just dropped (the process was gone)."""
    async for _ in ws:
        pass
    return ws.close_code if ws.close_code != aiohttp.WSCloseCode.ABNORMAL_CLOSURE else None


async def rpc(ws: aiohttp.ClientWebSocketResponse, n: int, method: str, params: dict) -> dict:
    await ws.send_json({"jsonrpc": "2.0", "id": n, "method": method, "params": params})
    async with asyncio.timeout(30):
        while True:
            got = await ws.receive_json()
            if got.get("id") == n:
                return got


async def test_sigterm_without_a_state_dir_closes_every_connection_and_says_so(tmp_path):
    """No state dir: SIGTERM deletes the sessions, and every connection is closed by the gateway
    itself before it exits within the documented bound: a DPS master's WebSocket (1000), an
    ``/acp`` WebSocket attached to a session and one attached to none (1001: the sessions ended
    with the gateway), a Streamable HTTP ``/acp`` connection's event streams (the connection's
    and a session's: ended), and ``rawp-gateway acp`` run by an editor (the official Python SDK), whose
    waiting prompt and next prompt are told that the session ended with the gateway. The log says
    a shutdown deleted the sessions."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    args = ("--workspace-root", str(workspace), "--log-format", "json")
    async with serve(*args) as (proc, url), aiohttp.ClientSession() as http:
        master = await attached(http, url, "demo")
        acp = await http.ws_connect(url + "/acp", headers=user_headers(url))
        init = {"protocolVersion": 1, "clientCapabilities": {}}
        assert "result" in await rpc(acp, 1, "initialize", init)
        load = {"sessionId": master.session_id, "cwd": str(workspace)}
        assert "result" in await rpc(acp, 2, "session/load", load)
        idle = await http.ws_connect(url + "/acp", headers=user_headers(url))
        # A Streamable HTTP /acp connection: its connection's and a session's event streams.
        body = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}
        opened = await http.post(url + "/acp", json=body, headers=user_headers(url))
        assert opened.status == 200, await opened.text()
        sse = {
            **user_headers(url),
            "Acp-Connection-Id": opened.headers["Acp-Connection-Id"],
            "Accept": "text/event-stream",
        }
        streams = [
            await http.get(url + "/acp", headers=sse),
            await http.get(url + "/acp", headers={**sse, "Acp-Session-Id": master.session_id}),
        ]
        assert [s.status for s in streams] == [200, 200]
        argv = relay_argv(url, agent="demo")
        async with python_editor(argv, relay_env(), tmp_path) as ed:
            await ed.request("initialize", init)
            sid = (await ed.request("session/new", {"cwd": str(workspace)}))["sessionId"]
            turn = asyncio.ensure_future(ed.request("session/prompt", prompt(sid, "write a.txt")))
            await eventually(lambda: ed.questions, "the permission question", 30)
            proc.send_signal(signal.SIGTERM)
            closes = asyncio.gather(*(closed_by_the_gateway(ws) for ws in (master.ws, acp, idle)))
            # Each event stream's end, written by the gateway (a chunked body the process just
            # dropped would not read to its end: ClientPayloadError).
            ends = asyncio.gather(*(s.read() for s in streams))
            # TimeoutExpired fails the test: past the bound the gateway still ran.
            code = await asyncio.to_thread(proc.wait, STOP_BOUND_SEC)
            assert code == 0
            assert await asyncio.wait_for(closes, 5) == [1000, 1001, 1001]
            await asyncio.wait_for(ends, 5)
            # The running turn ended with its session (DPS: session.turn.end error), and why.
            with pytest.raises(EditorError) as ended:
                # What came instead of the error, if anything did, is the failure's message (once
                # seen under a loaded suite, not yet explained).
                got = await asyncio.wait_for(turn, 30)
                pytest.fail(
                    f"the running turn's prompt was answered {got!r}; stderr: {ed.stderr()}"
                )
            assert ended.value.data["error_code"] == "TURN_FAILED"
            assert ended.value.data["agentError"] == {
                "error_code": "GATEWAY_STOPPED",
                "message": "the gateway stopped; the session ended with it",
            }
            # The relay knows: the next prompt is told so, not "send it again" or "load it".
            with pytest.raises(EditorError) as again:
                await asyncio.wait_for(ed.request("session/prompt", prompt(sid, "hello")), 30)
            assert again.value.data["error_code"] == "SESSION_TERMINATED"
            assert "ended with the gateway" in str(again.value)
            assert "start a new session" in str(again.value)
            await eventually(lambda: "the gateway stopped" in ed.stderr(), "the relay's word", 30)
    assert proc.stderr is not None
    logs = [json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith(b"{")]
    deleted = [r for r in logs if r["msg"] == "session deleted"]
    assert len(deleted) == 2
    assert all((r["reason"], r["deleted_by"]) == ("shutdown", "gateway") for r in deleted)
