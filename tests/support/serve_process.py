"""A ``rawp-gateway serve`` process a test drives itself (its arguments, signals, stderr), and a
master attached to one of its sessions over the network."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp

from tests.support.gateway_peer import SUBPROTOCOL, Master, envelope
from tests.support.servers import CLI, free_port, user_headers, wait_http


@contextlib.asynccontextmanager
async def serve(*args: str, **popen: Any) -> AsyncIterator[tuple[subprocess.Popen, str]]:
    """``rawp-gateway serve`` with ``args`` on a free port, stderr piped (``popen``: more of
    Popen's keywords); the process and its URL once it answers. Killed afterwards unless the
    test stopped it; its stderr is left for the test to read."""
    port = free_port()
    proc = subprocess.Popen(
        [*CLI, "serve", *args, "--port", str(port)], stderr=subprocess.PIPE, **popen
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_http(url, proc)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def sighup_until(proc: subprocess.Popen, done: Callable[[], Awaitable[bool]]) -> None:
    """Send SIGHUP (read the users file and the rules again) and wait until ``done()`` says the
    gateway took it: the signal is handled soon after it is sent."""
    proc.send_signal(signal.SIGHUP)
    async with asyncio.timeout(20):
        while not await done():
            await asyncio.sleep(0.05)


def logged_until(
    proc: subprocess.Popen, about: str, last: str, timeout_sec: float = 20
) -> list[str]:
    """Read the log of a ``serve --log-format json`` process as it writes it, until a message that
    starts with ``last``: the messages that mention ``about``, in order. Read before the process is
    stopped, so a stop cannot overtake what the test waits for (a signal sent just before SIGTERM
    may be handled after it)."""
    assert proc.stderr is not None
    fd, pending, found = proc.stderr.fileno(), b"", []
    deadline = time.monotonic() + timeout_sec
    while not (found and found[-1].startswith(last)):
        left = deadline - time.monotonic()
        assert left > 0, f"no log message starting {last!r}; seen {found}"
        if not select.select([fd], [], [], left)[0]:
            continue
        chunk = os.read(fd, 65536)
        assert chunk, f"the gateway ended before {last!r}; seen {found}"
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line.startswith(b"{") and about in (msg := json.loads(line)["msg"]):
                found.append(msg)
    return found


def reload_refused(proc: subprocess.Popen, what: str) -> str:
    """SIGHUP after one good reload, with a file that cannot be used: the gateway's log says
    ``what`` (``users file``, ``policy rules``) was reloaded once, then not, keeping the one
    before; the second message, which says why. The gateway is then stopped (SIGTERM, exit 0)."""
    proc.send_signal(signal.SIGHUP)
    reloads = logged_until(proc, what, f"{what} not reloaded")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert reloads == [f"{what} reloaded", reloads[1]]
    assert reloads[1].startswith(f"{what} not reloaded, the 1 ")
    return reloads[1]


async def attached(http: aiohttp.ClientSession, url: str, agent: str) -> Master:
    """A new session of ``agent`` on the gateway at ``url`` and a master attached to it."""
    headers = {} if "Authorization" in http.headers else user_headers(url)
    async with http.post(url + "/v1/session", json={"agent": agent}, headers=headers) as resp:
        assert resp.status == 201, await resp.text()
        session = await resp.json()
    ws = await http.ws_connect(url + session["ws_path"], protocols=(SUBPROTOCOL,), headers=headers)
    return Master(ws, session["session_id"])


def stalled_master(
    url: str, session_id: str, prompt: str, headers: dict[str, str] | None = None
) -> socket.socket:
    """A raw WebSocket client that upgrades (with ``headers``), sends ``prompt`` and then never
    reads again, with a small receive buffer so that the gateway's writes back up."""
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
            + "".join(f"{k}: {v}\r\n" for k, v in (headers or user_headers(url)).items())
            + f"Sec-WebSocket-Protocol: {SUBPROTOCOL}\r\n\r\n"
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
