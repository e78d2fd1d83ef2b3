"""A ``rawp-gateway serve`` process a test drives itself (its arguments, signals, stderr), and a
master attached to one of its sessions over the network."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from tests.support.gateway_peer import SUBPROTOCOL, Master
from tests.support.servers import CLI, free_port, wait_http


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


async def attached(http: aiohttp.ClientSession, url: str, agent: str) -> Master:
    """A new session of ``agent`` on the gateway at ``url`` and a master attached to it."""
    async with http.post(url + "/v1/session", json={"agent": agent}) as resp:
        assert resp.status == 201, await resp.text()
        session = await resp.json()
    ws = await http.ws_connect(url + session["ws_path"], protocols=(SUBPROTOCOL,))
    return Master(ws, session["session_id"])
