"""``rawp-gateway serve`` as a real process: the command, a free loopback port, waiting until it
answers."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import aiohttp

CLI = [sys.executable, "-m", "gateway"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_http(url: str, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Until ``url``/healthz answers 200; fails at once (with its stderr) if ``proc`` exits."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    async with aiohttp.ClientSession() as http:
        while loop.time() < end:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                async with http.get(url + "/healthz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    raise TimeoutError("gateway did not start")
