"""A stopping gateway does not wait on a master that stopped reading.

Container engines send SIGTERM and, 10 s later by default, SIGKILL (``docker stop``, ``podman
stop``); a gateway killed mid-suspend leaves its sessions as after a crash. A master that is
attached but reads nothing (a frozen laptop, a stalled proxy) never answers the close frame, and
its socket may be too full to take it: the gateway must give up on it within the close timeout
(``CLOSE_TIMEOUT_SEC``, docs/limits.md) and still suspend every session cleanly.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import time

import aiohttp

from gateway.storage.state_dir import RECORD
from tests.support.gateway_peer import SUBPROTOCOL, envelope
from tests.support.serve_process import serve

ENGINE_STOP_TIMEOUT_SEC = 10.0  # docker stop / podman stop, before SIGKILL


def stalled_master(url: str, session_id: str, prompt: str) -> socket.socket:
    """A raw WebSocket client that upgrades, sends ``prompt`` and then never reads again, with a
    small receive buffer so that the gateway's writes back up."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /v1/session/{session_id}/ws HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Protocol: {SUBPROTOCOL}\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    frame = envelope(session_id, "control.prompt.request", {"prompt_text": prompt})
    sock.sendall(masked_text(json.dumps(frame).encode()))
    return sock


def masked_text(data: bytes) -> bytes:
    """One client-to-server text frame (masked, RFC 6455 §5.3)."""
    mask = os.urandom(4)
    n = len(data)
    head = bytes([0x81, 0x80 | n]) if n < 126 else bytes([0x81, 0x80 | 126]) + n.to_bytes(2, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


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
    async with serve(*args) as (proc, url), aiohttp.ClientSession() as http:
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
