"""``rawp-gateway serve`` as a real process: the command, a free loopback port, waiting until it
answers."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

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


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, **server: object) -> AsyncIterator[str]:
    """``rawp-gateway serve`` on a free port with ``[server]`` keys ``server`` (TOML values as
    written), workspace root ``tmp_path``; its URL, until it is stopped with SIGTERM."""
    port = free_port()
    toml = tmp_path / "gateway.toml"
    lines = [f"[server]\nworkspace_root = '{tmp_path}'"]
    lines += [f"{key} = {value}" for key, value in server.items()]
    toml.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(
        [*CLI, "serve", "--config", str(toml), "--port", str(port)],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_http(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
