"""The relays under test and the masters that read them, shared by the relay benches.

Theory of operation
-------------------
Every relay runs in a process of its own, as it would in production, so that its CPU time can be
read from ``/proc/<pid>/stat`` (its own user + system time, not its children's: the agents are
children of both relays):

* ``Gateway``: this file run as ``python relay_rig.py gateway PORT`` serves ``gateway.server.run``
  on uvloop with one extra agent profile, ``synth``: ``bench/synth_agent.py`` behind the Claude
  Code parser.
* ``Websocketd``: Debian's ``websocketd`` running ``synth_agent.py`` once per connection; it relays
  each stdout line as one WebSocket message without parsing it.

A master is one aiohttp WebSocket client. It asks for a burst (``BURST <lines> <rate>``: a DPS
``control.prompt.request`` to the gateway, a bare text message to websocketd), then reads until the
``END-OF-BURST`` marker, noting for every message that carries one the latency from the agent's
``@T<ns>;`` stamp (CLOCK_MONOTONIC, shared by every process) to its own receive.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
AGENT = [sys.executable, str(HERE / "synth_agent.py")]
SUBPROTOCOL = "rawp-dps-1.0"
INSTALL_WEBSOCKETD = ROOT / "scripts" / "install-websocketd.sh"
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def wait_port(port: int, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return


class Relay:
    name = "relay"
    proc: subprocess.Popen

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def rss(self) -> int:
        return rss_bytes(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Gateway(Relay):
    """The gateway of this checkout, or of another one (``tree``: a baseline to compare with)."""

    def __init__(
        self, tree: Path = ROOT, name: str = "rawp-gateway", *, state_dir: bool = False
    ) -> None:
        """``state_dir``: the gateway keeps its sessions on disk (a temporary state directory)."""
        self.name = name
        self.port = free_port()
        self.workspace = tempfile.mkdtemp(prefix="bench-gw-")
        argv = [sys.executable, __file__, "gateway", str(self.port), self.workspace, str(tree)]
        if state_dir:
            argv.append(str(Path(self.workspace) / ".rawp-state"))
        self.proc = subprocess.Popen(argv, cwd=tree)

    async def ready(self) -> None:
        await wait_port(self.port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def new_session(self, http: aiohttp.ClientSession) -> str:
        async with http.post(f"{self.url}/v1/session", json={"agent": "synth"}) as resp:
            body = await resp.json()
            if resp.status != 201:
                raise RuntimeError(f"session not created: {body}")
            return body["session_id"]

    async def attach(self, http: aiohttp.ClientSession, session_id: str) -> Master:
        ws = await http.ws_connect(
            f"{self.url}/v1/session/{session_id}/ws", protocols=(SUBPROTOCOL,), max_msg_size=0
        )
        master = Master(ws, session_id)
        caps = {
            "protocol_version": SUBPROTOCOL,
            "supported_namespaces": ["agent", "tool", "control", "session"],
            "features": {},
        }
        await master.send_frame("session.capabilities", caps)
        return master

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.workspace, ignore_errors=True)


class Websocketd(Relay):
    name = "websocketd"

    def __init__(self) -> None:
        exe = websocketd_path()
        self.port = free_port()
        self.proc = subprocess.Popen(
            [exe, "--address=127.0.0.1", f"--port={self.port}", "--loglevel=error", *AGENT],
            stdout=subprocess.DEVNULL,
            # websocketd 0.4.1 logs a recovered panic when a master closes while the agent still
            # writes (the lines after the end marker); nothing else goes there at this log level.
            stderr=subprocess.DEVNULL,
        )

    async def ready(self) -> None:
        await wait_port(self.port)

    async def attach(self, http: aiohttp.ClientSession) -> Master:
        ws = await http.ws_connect(f"http://127.0.0.1:{self.port}/", max_msg_size=0)
        return Master(ws, None)


def websocketd_path() -> str:
    exe = shutil.which("websocketd")
    if exe is None:
        print(f"websocketd is missing: running {INSTALL_WEBSOCKETD.name}", file=sys.stderr)
        subprocess.run(["sh", str(INSTALL_WEBSOCKETD)], check=True)
        exe = shutil.which("websocketd")
        if exe is None:
            raise SystemExit("websocketd could not be installed (Debian's package websocketd)")
    return exe


@dataclass
class Master:
    ws: aiohttp.ClientWebSocketResponse
    session_id: str | None
    latencies_ns: list[int] = field(default_factory=list)
    messages: int = 0
    first_ns: int = 0
    end_ns: int = 0

    async def send_frame(self, type_: str, payload: dict) -> None:
        frame = {
            "v": 1,
            "type": type_,
            "message_id": str(uuid.uuid4()),
            "timestamp": "2026-11-30T00:00:00.000Z",
            "session_id": self.session_id,
            "payload": payload,
        }
        await self.ws.send_str(json.dumps(frame))

    async def request_burst(self, lines: int, rate: int) -> None:
        text = f"BURST {lines} {rate}"
        if self.session_id is None:
            await self.ws.send_str(text)
        else:
            await self.send_frame("control.prompt.request", {"prompt_text": text})

    async def read_burst(self, timeout: float = 120.0) -> None:
        """Read until the end marker; latencies of the stamped messages."""
        self.latencies_ns, self.messages, self.first_ns = [], 0, 0
        clock = time.monotonic_ns
        lat = self.latencies_ns
        receive = self.ws.receive
        async with asyncio.timeout(timeout):
            while True:
                msg = await receive()
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    raise ConnectionError(f"connection ended: {msg.type} {msg.extra!r}")
                now = clock()
                data = msg.data
                if not self.first_ns and 'delta"' in data:
                    # The first agent line relayed (a text delta, raw or as agent.text.delta): the
                    # gateway's own frames for the prompt come before the agent has even built
                    # its burst, and must not count as relaying time.
                    self.first_ns = now
                self.messages += 1
                i = data.find("@T")
                # One stamp: a text delta (agent.text.done repeats every stamp of its block).
                if i >= 0 and data.find("@T", i + 2) < 0:
                    lat.append(now - int(data[i + 2 : data.index(";", i)]))
                if "END-OF-BURST" in data:
                    self.end_ns = now
                    return


def quantile(values: list[int], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def serve_gateway(port: int, workspace: str, tree: str, state_dir: str | None = None) -> None:
    sys.path.insert(0, tree)
    from dataclasses import replace

    from gateway import server
    from gateway.config import Config, builtin_profiles

    agents = dict(builtin_profiles())
    agents["synth"] = replace(
        agents["demo"], name="synth", command=tuple(AGENT), env={}, description="bench agent"
    )
    extra = {}
    if "max_sessions" in Config.__dataclass_fields__:  # bench_fanout runs 100 sessions and more
        extra["max_sessions"] = 1000
    if state_dir is not None:
        extra["state_dir"] = Path(state_dir)
    config = Config(
        port=port, workspace_root=Path(workspace), agents=agents, reattach_window_sec=600.0, **extra
    )
    import logging

    logging.basicConfig(level=logging.WARNING)
    server.serve(config)


async def run_masters(url: str, session_ids: list[str], lines: int, rate: int, ask: bool) -> None:
    """One master per session id; after "go" on stdin, the first asks for the burst when ``ask``
    (every master when there are many sessions), all read it; their latencies (ns) as JSON."""
    gateway = Gateway.__new__(Gateway)
    gateway.port = int(url.rsplit(":", 1)[1])
    async with aiohttp.ClientSession() as http:
        masters = [await gateway.attach(http, sid) for sid in session_ids]
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        if ask:
            askers = masters if len(set(session_ids)) > 1 else masters[:1]
            await asyncio.gather(*(m.request_burst(lines, rate) for m in askers))
        await asyncio.gather(*(m.read_burst() for m in masters))
        for m in masters:
            await m.ws.close()
    print(json.dumps([m.latencies_ns for m in masters]), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "gateway":
        serve_gateway(int(sys.argv[2]), sys.argv[3], sys.argv[4], *sys.argv[5:6])
    elif sys.argv[1] == "masters":
        import uvloop

        url, ids, n, r, ask = sys.argv[2], sys.argv[3].split(","), *sys.argv[4:7]
        uvloop.run(run_masters(url, ids, int(n), int(r), ask == "1"))
