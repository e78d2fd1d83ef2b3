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

A master asks for a burst (``BURST <lines> <rate>``: a DPS ``control.prompt.request`` to the
gateway, a bare text message to websocketd), then reads until the ``END-OF-BURST`` marker, noting
for every message that carries one the latency from the agent's ``@T<ns>;`` stamp (CLOCK_MONOTONIC,
shared by every process) to its own receive. Two kinds:

* ``Master``: an aiohttp WebSocket client (``bench_vs_websocketd.py``; ``bench_fanout.py
  --masters aiohttp``).
* ``LeanMaster``: a WebSocket client on a bare ``asyncio.Protocol``, the fan-out bench's default, so
  that 16 masters at 10,000 messages/s measure the gateway rather than their own cost. It does the
  RFC 6455 handshake itself and, per read, walks the frame headers in the bytes received (checking
  that each is an unmasked, final frame) and looks for the stamp and the end marker only inside
  text frames' payloads; a frame split across reads is carried over to the next one. Parsing costs
  it about 1.3 µs a message; the rest of what a master costs is its wake-up and read(2), 25 to 30%
  less in all than aiohttp's client (bench/README.md). Receive time is the time ``data_received``
  is called.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import signal
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
GC_LOG = ".gc-pauses"  # in the gateway's workspace root, beside the sessions' directories


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system (kernel) CPU time of one process (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (not its children)."""
    return sum(cpu_split(pid))


def cpu_seconds_reaped(pid: int) -> float:
    """User + system CPU time of one process and of its children that have ended and been waited
    for: an agent's with its tools' (a Bash command's shell and what it ran)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / TICK


def children_pids(pid: int) -> list[int]:
    """The direct children of a process (every thread's: any of them may have forked)."""
    pids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            pids += [int(c) for c in (task / "children").read_text().split()]
    return pids


def cpu_seconds_of(pids: list[int], of=cpu_seconds) -> dict[int, float]:
    """User + system CPU time of each process still alive (``of``: ``cpu_seconds_reaped`` to
    count the children it has waited for too)."""
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            out[pid] = of(pid)
    return out


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def gateway_headers(port: int) -> dict[str, str]:
    """The ``Authorization`` a client on this machine sends to the gateway on ``port``: the token it
    made for itself, found as ``chat`` finds it (gateway/local_token.py). None for websocketd, or
    for a gateway from before there always was a credential."""
    try:
        from gateway.local_token import local_token
    except ImportError:
        return {}
    token = local_token(f"http://127.0.0.1:{port}")
    return {"Authorization": f"Bearer {token}"} if token else {}


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
        self,
        tree: Path = ROOT,
        name: str = "rawp-gateway",
        *,
        state_dir: bool = False,
        workspace: str | None = None,
        profiles: dict[str, dict] | None = None,
    ) -> None:
        """``state_dir``: the gateway keeps its sessions on disk (a temporary state directory).
        ``workspace``: its workspace root (a temporary directory by default, removed at stop).
        ``profiles``: more agent profiles, by name: ``{"base": a built-in profile, "command":
        [...], "env": {...}}`` (bench_fleet.py's real Claude Code, one profile a session)."""
        self.name = name
        self.port = free_port()
        self.workspace = workspace or tempfile.mkdtemp(prefix="bench-gw-")
        argv = [sys.executable, __file__, "gateway", str(self.port), self.workspace, str(tree)]
        argv.append(str(Path(self.workspace) / ".rawp-state") if state_dir else "")
        if profiles:
            path = Path(self.workspace) / ".bench-profiles.json"
            path.write_text(json.dumps(profiles))
            argv.append(str(path))
        self.proc = subprocess.Popen(argv, cwd=tree)

    async def ready(self) -> None:
        await wait_port(self.port)

    def gc_pauses(self, since_ns: int, until_ns: int) -> list[tuple[int, int, int, int]]:
        """The gateway's garbage collections of 1 ms or more that began in the window: (start,
        ns, CPU ns, generation)."""
        path = Path(self.workspace) / GC_LOG
        rows = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
        return [tuple(map(int, r)) for r in rows if since_ns <= int(r[0]) < until_ns]  # type: ignore[misc]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def new_session(self, http: aiohttp.ClientSession) -> str:
        async with http.post(
            f"{self.url}/v1/session", json={"agent": "synth"}, headers=gateway_headers(self.port)
        ) as resp:
            body = await resp.json()
            if resp.status != 201:
                raise RuntimeError(f"session not created: {body}")
            return body["session_id"]

    async def attach(self, http: aiohttp.ClientSession, session_id: str) -> Master:
        ws = await http.ws_connect(
            f"{self.url}/v1/session/{session_id}/ws",
            protocols=(SUBPROTOCOL,),
            max_msg_size=0,
            headers=gateway_headers(self.port),
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
        # websocketd clears its programs' environment but for the variables named here: the
        # synthetic agent's recording (bench_fleet.py) is passed as the gateway passes it.
        passenv = "PATH,LANG,HOME,RAWP_SYNTH_TRANSCRIPT"
        argv = [exe, "--address=127.0.0.1", f"--port={self.port}", "--loglevel=error"]
        self.proc = subprocess.Popen(
            [*argv, f"--passenv={passenv}", *AGENT],
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
        subprocess.run(["bash", str(INSTALL_WEBSOCKETD)], check=True)
        exe = shutil.which("websocketd")
        if exe is None:
            raise SystemExit("websocketd could not be installed (Debian's package websocketd)")
    return exe


def dps_frame(type_: str, session_id: str | None, payload: dict) -> str:
    """A frame from a master, as JSON."""
    frame = {
        "v": 1,
        "type": type_,
        "message_id": str(uuid.uuid4()),
        "timestamp": "2026-11-30T00:00:00.000Z",
        "session_id": session_id,
        "payload": payload,
    }
    return json.dumps(frame)


@dataclass
class Master:
    ws: aiohttp.ClientWebSocketResponse
    session_id: str | None
    latencies_ns: list[int] = field(default_factory=list)
    stamps_ns: list[int] = field(default_factory=list)  # each latency's stamp: when it was written
    messages: int = 0
    first_ns: int = 0
    end_ns: int = 0

    async def send_frame(self, type_: str, payload: dict) -> None:
        await self.ws.send_str(dps_frame(type_, self.session_id, payload))

    async def request_burst(self, lines: int, rate: int) -> None:
        text = f"BURST {lines} {rate}"
        if self.session_id is None:
            await self.ws.send_str(text)
        else:
            await self.send_frame("control.prompt.request", {"prompt_text": text})

    async def read_burst(self, timeout: float = 120.0) -> None:
        """Read until the end marker; latencies of the stamped messages."""
        self.latencies_ns, self.stamps_ns, self.messages, self.first_ns = [], [], 0, 0
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
                    stamp = int(data[i + 2 : data.index(";", i)])
                    self.stamps_ns.append(stamp)
                    lat.append(now - stamp)
                if "END-OF-BURST" in data:
                    self.end_ns = now
                    return


WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455, 1.3
MAX_HANDSHAKE = 16 * 1024  # the 101 response's header; a gateway that sends more is broken


def client_frame(opcode: int, payload: bytes) -> bytes:
    """One final client frame, masked as RFC 6455 requires of a client."""
    n = len(payload)
    if n < 126:
        head = bytes((0x80 | opcode, 0x80 | n))
    elif n < 1 << 16:
        head = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
    key = os.urandom(4)
    mask = (key * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(mask, "big")).to_bytes(n, "big")
    return head + key + masked


class LeanMaster(asyncio.Protocol):
    """A gateway master on a bare ``asyncio.Protocol``: the upgrade by hand, then per read a walk
    over the frame headers; only text frames' payloads are searched for a stamp and the end marker.

    ``messages`` counts text frames, ``stamped`` those that carried exactly one stamp (a text delta;
    ``agent.text.done`` repeats every stamp of its block). Anything but an unmasked final text frame,
    a ping (answered) or a pong ends the master with an error: it cannot read garbage as messages.
    It reads one burst and counts from its attach: the masters of another process may ask for the
    burst before this one's process has seen "go".

    Without a session id it is the master of a bare relay (websocketd, bench_fleet.py): it
    connects to ``/`` with no subprotocol, sends no capabilities, and a prompt is the stream-json
    line the gateway would write to the agent's stdin, sent as a text message of its own.
    """

    def __init__(self, port: int, session_id: str | None, token_port: int | None = None) -> None:
        self.session_id = session_id
        self.key = base64.b64encode(os.urandom(16))
        path, protocol = "/", ""
        if session_id is not None:
            path = f"/v1/session/{session_id}/ws"
            protocol = f"Sec-WebSocket-Protocol: {SUBPROTOCOL}\r\n"
            # The gateway's own token (``token_port``: the gateway's port, when ``port`` is a
            # router's in front of it).
            for name, value in gateway_headers(token_port or port).items():
                protocol += f"{name}: {value}\r\n"
        self.request = (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Key: {self.key.decode()}\r\n{protocol}\r\n"
        ).encode()
        loop = asyncio.get_running_loop()
        self.upgraded: asyncio.Future[None] = loop.create_future()
        self.ended: asyncio.Future[None] = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self.head = b""  # the 101 response until its blank line
        self.carry = b""  # the start of a frame not yet whole
        self.latencies_ns: list[int] = []
        self.stamps_ns: list[int] = []  # each latency's stamp: when the agent wrote the line
        self.messages = 0
        self.stamped = 0

    @classmethod
    async def attach(
        cls, port: int, session_id: str | None, token_port: int | None = None
    ) -> LeanMaster:
        loop = asyncio.get_running_loop()
        _, master = await loop.create_connection(
            lambda: cls(port, session_id, token_port), "127.0.0.1", port
        )
        await master.upgraded
        if session_id is None:
            return master
        caps = {
            "protocol_version": SUBPROTOCOL,
            "supported_namespaces": ["agent", "tool", "control", "session"],
            "features": {},
        }
        master.send_frame("session.capabilities", caps)
        return master

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(ConnectionError(f"connection lost: {exc!r}"))

    def fail(self, why: str) -> None:
        self._end(ConnectionError(why))
        self.transport.abort()

    def _end(self, error: ConnectionError) -> None:
        if not self.upgraded.done():
            self.upgraded.set_exception(error)
            self.ended.cancel()  # nobody waits for a burst on a connection that never opened
        elif not self.ended.done():
            self.ended.set_exception(error)

    def send_frame(self, type_: str, payload: dict) -> None:
        frame = dps_frame(type_, self.session_id, payload).encode()
        self.transport.write(client_frame(0x1, frame))

    def prompt(self, text: str) -> None:
        if self.session_id is None:
            line = {"type": "user", "message": {"role": "user", "content": text}}
            self.transport.write(client_frame(0x1, json.dumps(line).encode()))
        else:
            self.send_frame("control.prompt.request", {"prompt_text": text})

    def request_burst(self, lines: int, rate: int) -> None:
        self.prompt(f"BURST {lines} {rate}")

    def close(self) -> None:
        if not self.transport.is_closing():
            self.transport.write(client_frame(0x8, (1000).to_bytes(2, "big")))
            self.transport.close()

    def _upgrade(self, data: bytes) -> bytes:
        """Takes the 101 response; returns the bytes after it (frames already sent)."""
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > MAX_HANDSHAKE:
                self.fail("the upgrade response has no end")
            return b""
        lines = self.head[:end].decode("latin-1").split("\r\n")
        rest, self.head = self.head[end + 4 :], b""
        headers = dict(
            (k.strip().lower(), v.strip()) for k, _, v in (ln.partition(":") for ln in lines[1:])
        )
        accept = base64.b64encode(hashlib.sha1(self.key + WS_GUID).digest()).decode()
        if lines[0].split(" ", 2)[1:2] != ["101"]:
            self.fail(f"upgrade refused: {lines[0]}")
        elif headers.get("sec-websocket-accept") != accept:
            self.fail("wrong Sec-WebSocket-Accept")
        elif headers.get("sec-websocket-protocol") != (self.session_id and SUBPROTOCOL):
            # a bare relay (no session) agrees none, as none was asked
            self.fail(f"subprotocol not agreed: {headers.get('sec-websocket-protocol')!r}")
        else:
            self.upgraded.set_result(None)
            return rest
        return b""

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        if not self.upgraded.done():
            data = self._upgrade(data)
        if self.carry:
            data = self.carry + data
        n = len(data)
        pos = 0
        find = data.find
        lat, stamps = self.latencies_ns, self.stamps_ns
        ended = self.ended.done()  # what follows the end marker is another message's business
        while n - pos >= 2:
            b0 = data[pos]
            size = data[pos + 1]
            if size & 0x80:
                return self.fail("a masked frame from the server")
            start = pos + 2
            if size == 126:
                start = pos + 4
                size = int.from_bytes(data[pos + 2 : start], "big")
            elif size == 127:
                start = pos + 10
                size = int.from_bytes(data[pos + 2 : start], "big")
            end = start + size
            if end > n:
                break
            pos = end
            if b0 != 0x81:  # FIN + text
                if not self._control(b0, data[start:end]):
                    return
                continue
            if ended:
                continue
            self.messages += 1
            i = find(b"@T", start, end)
            if i < 0:
                continue
            if find(b"@T", i + 2, end) < 0:
                self.stamped += 1
                stamp = int(data[i + 2 : find(b";", i, end)])
                stamps.append(stamp)
                lat.append(now - stamp)
            if find(b"END-OF-BURST", i, end) >= 0:
                self.ended.set_result(None)
                ended = True
        self.carry = data[pos:] if pos < n else b""

    def _control(self, b0: int, payload: bytes) -> bool:
        """A frame other than a text message: False when it ends the master."""
        if b0 == 0x89:  # ping (the gateway's heartbeat)
            self.transport.write(client_frame(0xA, payload))
        elif b0 != 0x8A:  # a pong is nothing; a close, a binary or a fragment is not expected
            self.fail(f"unexpected frame: first byte {b0:#04x}, {payload[:80]!r}")
            return False
        return True


def quantile(values: list[int], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def log_gc_pauses(path: Path) -> None:
    """Appends each garbage collection of this process that takes 1 ms or more to ``path`` (start
    in CLOCK_MONOTONIC ns, duration in ns, the process's CPU time in it in ns, generation): the
    event loop stands still meanwhile, and a p99 may be these pauses rather than the machine. A
    duration far over its CPU time is a collection the machine took the core from."""
    import gc

    out = path.open("a", buffering=1)
    started = cpu = 0

    def note(phase: str, info: dict) -> None:
        nonlocal started, cpu
        now = time.monotonic_ns()
        if phase == "start":
            started, cpu = now, time.thread_time_ns()
        elif now - started >= 1_000_000:
            used = time.thread_time_ns() - cpu
            out.write(f"{started} {now - started} {used} {info['generation']}\n")

    gc.callbacks.append(note)


def serve_gateway(port: int, workspace: str, tree: str, state_dir: str, profiles: str) -> None:
    # A bench that dies (an exception, Ctrl-C) must not leave its gateways serving: SIGTERM when
    # the parent goes (PR_SET_PDEATHSIG), which the gateway answers by stopping its agents.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    log_gc_pauses(Path(workspace) / GC_LOG)
    sys.path.insert(0, tree)
    from dataclasses import replace

    from gateway import server
    from gateway.config import Config, builtin_profiles

    agents = dict(builtin_profiles())
    agents["synth"] = replace(
        agents["demo"], name="synth", command=tuple(AGENT), env={}, description="bench agent"
    )
    for name, p in (json.loads(Path(profiles).read_text()) if profiles else {}).items():
        agents[name] = replace(
            agents[p["base"]], name=name, command=tuple(p["command"]), env=p["env"]
        )
    extra: dict = {"port": port, "workspace_root": Path(workspace), "reattach_window_sec": 600.0}
    if "max_sessions" in Config.__dataclass_fields__:  # bench_fanout runs 100 sessions and more
        extra["max_sessions"] = 1000
    if state_dir:
        extra["state_dir"] = Path(state_dir)
    if "server" in Config.__dataclass_fields__:  # the [server] keys in a section of their own
        from gateway.config import ServerSettings

        extra["max_sessions"] = 1000
        config = Config(server=ServerSettings(**extra), agents=agents)
    else:  # a tree from before they were (a bench run at an older commit)
        config = Config(agents=agents, **extra)
    import logging

    logging.basicConfig(level=logging.WARNING)
    server.serve(config)


async def run_masters(
    url: str, session_ids: list[str], lines: int, rate: int, ask: bool, kind: str
) -> None:
    """One master per session id (``kind``: ``aiohttp`` or ``lean``); after "go" on stdin, the
    first asks for the burst when ``ask`` (every master when there are many sessions), all read it.
    Prints per master its latencies (ns), messages and stamped messages, and this process's CPU
    seconds over the burst, as JSON."""
    port = int(url.rsplit(":", 1)[1])
    askers = slice(None) if len(set(session_ids)) > 1 else slice(1)
    async with aiohttp.ClientSession() as http:
        if kind == "lean":
            masters = [await LeanMaster.attach(port, sid) for sid in session_ids]
        else:
            gateway = Gateway.__new__(Gateway)
            gateway.port = port
            masters = [await gateway.attach(http, sid) for sid in session_ids]
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        cpu0 = time.process_time()
        if kind == "lean":
            for m in masters[askers] if ask else ():
                m.request_burst(lines, rate)
            async with asyncio.timeout(120):
                await asyncio.gather(*(m.ended for m in masters))
            cpu = time.process_time() - cpu0
            for m in masters:
                m.close()
            stamped = [m.stamped for m in masters]
        else:
            if ask:
                await asyncio.gather(*(m.request_burst(lines, rate) for m in masters[askers]))
            await asyncio.gather(*(m.read_burst() for m in masters))
            cpu = time.process_time() - cpu0
            for m in masters:
                await m.ws.close()
            stamped = [len(m.latencies_ns) for m in masters]
    per_master = [
        {
            "latencies_ns": m.latencies_ns,
            "stamps_ns": m.stamps_ns,
            "messages": m.messages,
            "stamped": k,
        }
        for m, k in zip(masters, stamped, strict=True)
    ]
    print(json.dumps({"masters": per_master, "cpu_s": cpu}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "gateway":
        profiles = sys.argv[6] if len(sys.argv) > 6 else ""
        serve_gateway(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], profiles)
    elif sys.argv[1] == "masters":
        import uvloop

        url, ids, n, r, ask, kind = sys.argv[2], sys.argv[3].split(","), *sys.argv[4:8]
        uvloop.run(run_masters(url, ids, int(n), int(r), ask == "1", kind))
