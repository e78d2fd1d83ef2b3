"""``rawp-gateway serve`` as a real process: the command, a free loopback port (a block of ports
per pytest-xdist worker), waiting until it answers."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from gateway.local_token import local_token

CLI = [sys.executable, "-m", "gateway"]


# A port found free here is bound by the server only later (often by another process), so it must
# not be one the kernel could hand to anybody else meanwhile: ports come from below the kernel's
# ephemeral range (net.ipv4.ip_local_port_range, 32768 and up by default), which no bind(0) and no
# outgoing connection uses, and each pytest-xdist worker has a block of its own there.
PORTS = range(20000, 32000)


def _worker_ports() -> range:
    """This worker's block of PORTS (``PYTEST_XDIST_WORKER`` is "gw<n>"; all of it when serial)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return PORTS
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1)
    size = len(PORTS) // count
    start = PORTS.start + int(worker[2:]) * size
    return range(start, start + size)


# Round the block, so a port comes back only after all the others (and its TIME_WAIT is over);
# started at a place of this process's own, so a pytest run inside a test uses other ports.
_turn = itertools.count(os.getpid())


def free_port_on(addresses: tuple[str, ...] = ("127.0.0.1",)) -> int:
    """A TCP port of this worker's block that is free now on every one of ``addresses``."""
    block = _worker_ports()
    for _ in range(len(block)):
        port = block[next(_turn) % len(block)]
        try:
            for address in addresses:
                with socket.socket() as s:  # no SO_REUSEADDR: a port in TIME_WAIT is passed over
                    s.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port of {block} is free on all of " + ", ".join(addresses))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now and that no other test worker will pick."""
    return free_port_on(("127.0.0.1",))


async def wait_http(
    url: str, proc: subprocess.Popen, timeout: float = 20.0, path: str = "/healthz"
) -> None:
    """Until ``url`` + ``path`` answers 200; fails at once (with its stderr) if ``proc`` exits. If it
    never answers, the failure says what the last try saw and where the process was: it is sent
    SIGABRT, on which Python's faulthandler (on in every test's child, tests/conftest.py) prints
    each thread's stack to the stderr read here."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    seen = "nothing"
    async with aiohttp.ClientSession() as http:
        while loop.time() < end:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                async with http.get(url + path) as resp:
                    if resp.status == 200:
                        return
                    seen = f"HTTP {resp.status}"
            except aiohttp.ClientError as err:
                seen = repr(err)
            await asyncio.sleep(0.05)
    where = ""
    if proc.poll() is None:
        proc.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if proc.stderr is not None:
            where = "\n" + proc.stderr.read().decode(errors="replace")[-6000:]
    raise TimeoutError(f"gateway did not start within {timeout} s at {url}: last try {seen}{where}")


def user_headers(url: str) -> dict[str, str]:
    """What the user's own client sends to a gateway at ``url`` started without a token: the token
    it made, found as ``chat`` and ``acp`` find it (gateway/local_token.py); none for another."""
    token = local_token(url)
    return {"Authorization": f"Bearer {token}"} if token else {}


def stop(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM, and SIGKILL if ``proc`` is still there after ``grace`` seconds; reaped."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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
        stop(proc, 30)
        assert proc.stderr is not None
        proc.stderr.close()
