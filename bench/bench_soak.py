"""Soak: does the gateway's memory stay flat over a long session, many sessions and a reattach storm?

Theory of operation
-------------------
A real ``rawp-gateway serve`` runs as a child process; this script is its masters (aiohttp
WebSockets) and samples the server's resident memory (``/proc/PID/status`` ``VmRSS``) every 20 ms.
Three phases, each timed and bounded:

1. **long session**: a plain agent (``soak_lines``, below) prints ``--lines`` short lines in one
   turn, one ``agent.text.delta`` each, to one attached master reading at full speed (a master
   closed for falling behind reattaches with its ``last_message_id``, and is counted);
2. **cycles**: ``--cycles`` times, two sessions side by side: create, attach, run a turn to its
   ``session.usage``, DELETE; one with the demo agent (Claude Code's stream-json), one with the
   plain agent printing ``--cycle-lines`` lines (a busy session: a full history, many ids);
3. **reattach storm**: ``--storm`` masters attach to one busy session with an old
   ``last_message_id`` (a full history replay each), 20 at a time, and leave.

The baseline is the RSS right after the first cycle (a gateway that has served one whole session).
Each phase prints its peak and end RSS and their ratio to that baseline; flat means the end ratio of
the cycles and of the storm stays near 1.0 however many there were. RSS after the long session
includes the allocator's high-water mark (Python rarely returns freed arenas), so its peak is the
figure to read there.

    .venv/bin/python bench/bench_soak.py            # 1M lines, 50 cycles, 200 reattaches
    .venv/bin/python bench/bench_soak.py --quick    # 100k lines, 2x10 cycles, 50 reattaches (~30-45 s)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from relay_rig import ROOT, SUBPROTOCOL, dps_frame, rss_bytes

# A plain agent printing the number of lines its prompt asks for, as fast as the pipe takes them.
LINES_AGENT = (
    "import sys\n"
    "n = int(sys.argv[1])\n"
    "w = sys.stdout.write\n"
    "for i in range(n):\n"
    "    w(f'soak line {i}\\n')\n"
)


def config_text(workspace: Path, token_file: Path) -> str:
    lines_cmd = json.dumps([sys.executable, "-c", LINES_AGENT, "{prompt}"])
    demo_cmd = json.dumps([sys.executable, "-m", "gateway.demo_agent"])
    return f"""
[server]
workspace_root = {json.dumps(str(workspace))}
token_file = {json.dumps(str(token_file))}

[agents.soak_lines]
parser = "plain"
command = {lines_cmd}
single_turn_process = true

[agents.demo]
command = {demo_cmd}
env = {{ RAWP_DEMO_DELAY_MS = "0" }}
"""


class RssSampler:
    """The server's VmRSS every 20 ms, in a thread (the event loop may be busy)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, self.rss())
            except OSError:
                return

    def start(self) -> None:
        self._thread.start()

    def reset_peak(self) -> None:
        self.peak = self.rss()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def start_server(config: Path, workspace: Path) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0"],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "RAWP_GATEWAY_LOG_FORMAT": "json"},
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("msg") == "listening":
            # Keep draining the log so the server never blocks on a full stderr pipe.
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(record["port"])
    proc.kill()
    raise SystemExit("the gateway did not start")


CAPS = {
    "protocol_version": "rawp-dps-1.0",
    "supported_namespaces": ["agent", "tool", "control", "session"],
    "features": {},
}


class Soak:
    def __init__(self, http: aiohttp.ClientSession, base: str, sampler: RssSampler) -> None:
        self.http = http
        self.base = base
        self.sampler = sampler
        self.baseline = 0
        self.cycle_lines = 0

    async def create(self, agent: str) -> str:
        async with self.http.post(f"{self.base}/v1/session", json={"agent": agent}) as resp:
            assert resp.status == 201, await resp.text()
            return (await resp.json())["session_id"]

    async def delete(self, sid: str) -> None:
        async with self.http.delete(f"{self.base}/v1/session/{sid}") as resp:
            assert resp.status == 200, await resp.text()

    async def attach(self, sid: str, last: str | None = None) -> aiohttp.ClientWebSocketResponse:
        params = {"last_message_id": last} if last else {}
        ws = await self.http.ws_connect(
            f"{self.base}/v1/session/{sid}/ws",
            protocols=(SUBPROTOCOL,),
            params=params,
            max_msg_size=0,
        )
        await ws.send_str(dps_frame("session.capabilities", sid, CAPS))
        return ws

    async def turn(self, ws: aiohttp.ClientWebSocketResponse, sid: str, prompt: str) -> dict:
        """Send a prompt, read to its session.usage; frames counted, last id kept."""
        await ws.send_str(dps_frame("control.prompt.request", sid, {"prompt_text": prompt}))
        seen = {"frames": 0, "last": None, "closed": 0}
        while True:
            msg = await ws.receive(timeout=120)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise ConnectionError(f"closed: {ws.close_code} {msg.extra}")
            seen["frames"] += 1
            data = msg.data
            if '"session.usage"' in data[:80] or '"type":"session.usage"' in data:
                seen["last"] = json.loads(data)["message_id"]
                return seen

    def report(self, name: str, seconds: float, extra: str = "") -> None:
        end = self.sampler.rss()
        peak = max(self.sampler.peak, end)
        base = self.baseline or end
        print(
            f"{name:<16} {seconds:7.1f} s   peak {peak / 2**20:7.1f} MiB ({peak / base:4.2f}x)"
            f"   end {end / 2**20:7.1f} MiB ({end / base:4.2f}x)   {extra}",
            flush=True,
        )

    async def long_session(self, lines: int) -> None:
        self.sampler.reset_peak()
        t0 = time.monotonic()
        sid = await self.create("soak_lines")
        ws = await self.attach(sid)
        await ws.send_str(dps_frame("control.prompt.request", sid, {"prompt_text": str(lines)}))
        deltas = reattached = 0
        last: str | None = None
        while True:
            msg = await ws.receive(timeout=120)
            if msg.type != aiohttp.WSMsgType.TEXT:
                if ws.close_code == 1013:  # fell behind: reattach the way a master does
                    reattached += 1
                    ws = await self.attach(sid, last)
                    continue
                raise ConnectionError(f"closed: {ws.close_code}")
            data = msg.data
            if '"agent.text.delta"' in data:
                deltas += 1
                continue
            if '"session.history"' in data:
                deltas += json.loads(data)["payload"]["frames"].__len__()
            parsed = json.loads(data)
            last = parsed["message_id"]
            if parsed["type"] == "session.usage":
                break
        await ws.close()
        await self.delete(sid)
        self.report(
            "long session", time.monotonic() - t0, f"{lines} lines, reattached {reattached}x"
        )

    async def cycles(self, count: int) -> None:
        self.sampler.reset_peak()
        t0 = time.monotonic()

        async def one(agent: str, prompt: str) -> None:
            sid = await self.create(agent)
            ws = await self.attach(sid)
            await self.turn(ws, sid, prompt)
            await self.delete(sid)
            await ws.close()

        for i in range(count):
            await asyncio.gather(
                one("demo", "a long answer " * 20), one("soak_lines", str(self.cycle_lines))
            )
            if i == 0 and not self.baseline:
                await asyncio.sleep(0.2)
                self.baseline = self.sampler.rss()
                self.sampler.reset_peak()
                self.report("first cycle", time.monotonic() - t0, "(the baseline)")
        self.report("cycles", time.monotonic() - t0, f"{count} create/run/DELETE")

    async def storm(self, count: int) -> None:
        self.sampler.reset_peak()
        t0 = time.monotonic()
        sid = await self.create("demo")
        ws = await self.attach(sid)
        first = (await self.turn(ws, sid, "hello"))["last"]
        for _ in range(5):
            await self.turn(ws, sid, "a long answer " * 40)

        async def one() -> None:
            back = await self.attach(sid, first)
            while True:  # capabilities, then the history replay
                msg = await back.receive(timeout=30)
                if msg.type != aiohttp.WSMsgType.TEXT or '"session.history"' in msg.data:
                    break
            await back.close()

        for start in range(0, count, 20):
            await asyncio.gather(*(one() for _ in range(min(20, count - start))))
        await ws.close()
        await self.delete(sid)
        self.report("reattach storm", time.monotonic() - t0, f"{count} reattaches")


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp) / "ws"
        workspace.mkdir()
        # There is always a credential: the bench chooses the token (as for a fleet) rather
        # than look for the one serve would make, whose file is named by a port it picks.
        token = secrets.token_urlsafe(32)
        token_file = Path(tmp) / "token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        config = Path(tmp) / "soak.toml"
        config.write_text(config_text(workspace, token_file))
        server, port = start_server(config, workspace)
        sampler = RssSampler(server.pid)
        sampler.start()
        try:
            auth = {"Authorization": f"Bearer {token}"}
            async with aiohttp.ClientSession(headers=auth) as http:
                soak = Soak(http, f"http://127.0.0.1:{port}", sampler)
                soak.cycle_lines = args.cycle_lines
                print(f"started          RSS {sampler.rss() / 2**20:7.1f} MiB", flush=True)
                await soak.cycles(args.cycles)
                await soak.long_session(args.lines)
                await soak.cycles(args.cycles)
                await soak.storm(args.storm)
                async with http.get(f"{soak.base}/v1/sessions") as resp:
                    listed = len((await resp.json())["sessions"])
                await asyncio.sleep(0.5)
                end = sampler.rss()
                print(
                    f"final            RSS {end / 2**20:7.1f} MiB ({end / soak.baseline:4.2f}x the "
                    f"first cycle), peak {sampler.peak / 2**20:.1f} MiB since the last phase "
                    f"began; {listed} sessions listed (summaries)"
                )
        finally:
            sampler.stop()
            server.terminate()
            server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--cycles", type=int, default=50, help="per cycles phase (run twice)")
    parser.add_argument("--cycle-lines", type=int, default=20_000, help="per busy cycle")
    parser.add_argument("--storm", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="a short run (~30-45 s)")
    args = parser.parse_args()
    if args.quick:
        args.lines, args.cycles, args.cycle_lines, args.storm = 100_000, 10, 20_000, 50
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
