"""Capacity of one gateway of a fleet, and what the router adds: N sessions of a recorded working
session at its recorded pace, half of their masters through the fleet's nginx router, half straight
to the gateway, in the same run.

Theory of operation
-------------------
One gateway process (``relay_rig.Gateway``: the real server on uvloop, ``synth_agent.py`` as its
agent) and the fleet's router: Debian's nginx running ``deploy/k8s/router/default.conf.template``
(rendered by ``tests/support/fleet_rig.py`` as the tests do, its DNS answering the gateway's address).
``--sessions`` sessions are created through the router (``POST /v1/session``); each gets one master
(``relay_rig.LeanMaster``), the even ones connected to the router, the odd ones to the gateway.

The agent replays ``--transcript``, by default ``tests/fixtures/claude-code/working-session.jsonl``:
the real Claude Code 2.1 with the gateway's flags, recorded by the rig with its timing (three
prompts, a person's 30 s and 25 s between them; a model paced like a real one, about 25 text deltas
a second after a second or so to the first token; real tools). Each master sends the recording's
prompts at the times they were written in it, and the agent answers each with the recorded turn at
its recorded pace (``synth_agent.py``), each text delta stamped with the time it was written; after
the last turn a session waits the recording's mean think time and starts again. The sessions start
at random times over the first cycle (the warm-up), so from then on they are spread evenly over it:
what one gateway sees from that many people working at once. Measured over ``--seconds`` after
the warm-up:

* the gateway's CPU, in cores, and per session; sessions per core at this pace;
* the gateway's resident memory per session (RSS after creating the sessions and attaching their
  masters, then after the run, less RSS before; the agents are processes of their own);
* latency from the agent's write to the master's receive, p50 and p99, straight and through the
  router, and the difference: what the router adds;
* the router's (nginx) and the agents' CPU, in cores.

``--rate N`` replays the recording's messages in a loop at N lines/s a session instead, all sessions
at once (a stress: at the recorded pace a session streams only while its model answers).

``--profile PATH`` samples the gateway with py-spy (``pip install py-spy``; sampling another
process needs root or ptrace rights) over the measured window and writes the samples to PATH:
speedscope JSON, or py-spy's raw collapsed stacks when PATH ends in ``.txt``. py-spy samples 100
times a second with ``--nonblocking`` (the gateway is not paused to be read), but its own CPU is
taken from the same two cores: a profiled run's latencies are not the figures to quote. Time spent
in uvloop's C code and in the kernel (pipe reads, epoll) has no Python frame of its own and shows
as ``Runner.run`` itself; ``perf record -g -p <pid>`` sees into it.

``--compiled [DIR]`` runs the gateway of a copy of this checkout whose per-line modules are compiled
with mypyc (``bench_compiled.build``, in DIR, reused while current, or in a temporary directory)
instead of this checkout's: what compiling would take off the gateway's CPU at this pace. Compare
with a run without it; two gateways in one run would share the cores.

    .venv/bin/python bench/bench_fleet.py [--sessions 500] [--seconds 60] [--rate N] [--compiled [DIR]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import uvloop

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_compiled import build, runs_compiled  # noqa: E402
from relay_rig import (  # noqa: E402
    Gateway,
    LeanMaster,
    children_pids,
    cpu_seconds_of,
    cpu_split,
    quantile,
    rss_bytes,
)

from tests.support.fleet_rig import READY, Dns, Router, nginx_path  # noqa: E402

RECORDING = HERE.parent / "tests/fixtures/claude-code/working-session.jsonl"


@dataclass
class Pace:
    """A timed recording's schedule: when each prompt is written in one cycle, and its length."""

    prompts: list[tuple[float, str]]  # (seconds into the cycle, the prompt's text)
    cycle: float
    lines: int  # agent lines in one cycle

    @classmethod
    def of(cls, recording: Path) -> Pace:
        meta = json.loads(recording.with_name(recording.stem + ".meta.json").read_text())
        times, written = meta.get("stdout_times"), meta.get("stdin_times")
        if not times or not written:
            raise SystemExit(f"{recording.name} has no timing: record a timed scenario, or --rate")
        texts = [json.loads(line)["message"]["content"] for line in meta["stdin"]]
        # A person's think time: from the last line before a prompt to the prompt.
        thinks = [t - max(x for x in times if x < t) for t in written[1:]]
        cycle = times[-1] + sum(thinks) / len(thinks)
        return cls(list(zip(written, texts, strict=True)), cycle, len(times))


async def create(http: aiohttp.ClientSession, url: str, n: int) -> list[str]:
    ids: list[str] = []
    sem = asyncio.Semaphore(8)  # each session starts an agent process: not all at once

    async def one() -> None:
        async with sem, http.post(f"{url}/v1/session", json={"agent": "synth"}) as resp:
            body = await resp.json()
            if resp.status != 201:
                raise RuntimeError(f"session not created: {body}")
            ids.append(body["session_id"])

    await asyncio.gather(*(one() for _ in range(n)))
    return ids


async def paced(master: LeanMaster, pace: Pace, start: float, stop: float) -> None:
    """Send the recording's prompts at their times, cycle after cycle from ``start``, until
    ``stop`` (loop-clock times)."""
    loop = asyncio.get_running_loop()
    cycle = 0
    while True:
        for at, text in pace.prompts:
            due = start + cycle * pace.cycle + at
            if due >= stop:
                return
            await asyncio.sleep(due - loop.time())
            master.prompt(text)
        cycle += 1


def profile(path: str, pid: int, seconds: float) -> subprocess.Popen:
    """py-spy sampling ``pid`` for ``seconds`` (see ``--profile``)."""
    exe = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if exe is None:
        raise SystemExit("--profile needs py-spy: pip install py-spy")
    fmt = "raw" if path.endswith(".txt") else "speedscope"
    argv = [exe, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds)))]
    argv += ["--rate", "100", "--nonblocking", "--format", fmt, "--output", path]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL)


def summary(latencies_ns: list[int]) -> tuple[float, float]:
    return quantile(latencies_ns, 0.5) / 1e6, quantile(latencies_ns, 0.99) / 1e6


async def main(args: argparse.Namespace) -> None:
    if nginx_path() is None:
        raise SystemExit("nginx is not installed (scripts/install-nginx.sh)")
    recording = Path(args.transcript).resolve() if args.transcript else None
    pace = None if args.rate or recording is None else Pace.of(recording)
    if recording:  # synth_agent.py replays it (inherited through the gateway's environment)
        os.environ["RAWP_SYNTH_TRANSCRIPT"] = str(recording)
    compiled = None
    if args.compiled is not None:  # built before the gateway starts: the build takes the cores
        compiled = Path(args.compiled or tempfile.mkdtemp(prefix="rawp-compiled-")).resolve()
        compiled.mkdir(parents=True, exist_ok=True)
        build(compiled)
    gw = Gateway(compiled, name="compiled") if compiled else Gateway()
    home = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    dns = Dns({READY: ["127.0.0.1"]})  # no route prefix: every path goes to "any ready gateway"
    router = Router(home, dns, gw.port)
    loop = asyncio.get_running_loop()
    try:
        await gw.ready()
        await router.start()
        nginx_pids = [router.proc.pid, *children_pids(router.proc.pid)]
        async with aiohttp.ClientSession() as http:
            rss0 = rss_bytes(gw.proc.pid)
            t0 = time.monotonic()
            ids = await create(http, router.url, args.sessions)
            print(
                f"{len(ids)} sessions created through the router in {time.monotonic() - t0:.1f} s"
            )
            router_port = int(router.url.rsplit(":", 1)[1])
            masters = []
            for i, sid in enumerate(ids):
                port = router_port if i % 2 == 0 else gw.port
                masters.append(await LeanMaster.attach(port, sid))
            await asyncio.sleep(1.0)  # the capabilities answered, the agents idle
            rss1 = rss_bytes(gw.proc.pid)
            agents = children_pids(gw.proc.pid)
            if pace:
                warmup = pace.cycle
                print(
                    f"replaying {recording.name}: {pace.lines} lines a {pace.cycle:.1f} s cycle "
                    f"({pace.lines / pace.cycle:.2f} lines/s a session on average); warm-up "
                    f"{warmup:.0f} s, then {args.seconds:g} s measured"
                )
                begin = loop.time()
                window = (begin + warmup, begin + warmup + args.seconds)
                rng = random.Random(1)
                senders = [
                    asyncio.create_task(
                        paced(m, pace, begin + rng.random() * pace.cycle, window[1])
                    )
                    for m in masters
                ]
            else:
                warmup = args.settle
                lines = int(args.rate * (args.seconds + warmup))
                begin = loop.time()
                for i, m in enumerate(masters):
                    m.request_burst(lines, args.rate)
                    if i % 50 == 49:
                        await asyncio.sleep(1.0 / max(1, len(masters) // 50))
                window = (loop.time() + warmup, loop.time() + warmup + args.seconds)
                senders = []
            if compiled is not None and not runs_compiled(gw.proc.pid, compiled):
                raise SystemExit("the compiled copy's gateway did not load its compiled modules")
            await asyncio.sleep(window[0] - loop.time())
            cpu0 = cpu_seconds_of([gw.proc.pid, *nginx_pids, *agents])
            kernel0 = cpu_split(gw.proc.pid)[1]
            window_ns = (time.monotonic_ns(), 0)
            spy = profile(args.profile, gw.proc.pid, args.seconds) if args.profile else None
            await asyncio.sleep(window[1] - loop.time())
            cpu1 = cpu_seconds_of([gw.proc.pid, *nginx_pids, *agents])
            kernel = cpu_split(gw.proc.pid)[1] - kernel0
            window_ns = (window_ns[0], time.monotonic_ns())
            wall = (window_ns[1] - window_ns[0]) / 1e9
            rss2 = rss_bytes(gw.proc.pid)
            pauses = gw.gc_pauses(*window_ns)
            await asyncio.gather(*senders)
            if spy is not None:
                spy.wait()
            for m in masters:
                m.ended.cancel()  # no burst to end at the recorded pace: nobody waits for one
                m.close()
    finally:
        router.stop()
        dns.close()
        gw.stop()
        if compiled is not None and not args.compiled:
            shutil.rmtree(compiled, ignore_errors=True)

    def cores(pids: list[int]) -> float:
        return sum(cpu1.get(p, 0) - cpu0.get(p, 0) for p in pids) / wall

    via: dict[str, list[int]] = {"router": [], "direct": []}
    for i, m in enumerate(masters):
        key = "router" if i % 2 == 0 else "direct"
        via[key] += [
            lat
            for lat, s in zip(m.latencies_ns, m.stamps_ns, strict=True)
            if window_ns[0] <= s < window_ns[1]
        ]
    gw_cores = cores([gw.proc.pid])
    n = len(ids)
    if pace:
        what = f"{recording.name} at its recorded pace"
        rate = n * pace.lines / pace.cycle
    else:
        what = f"{recording.name if recording else 'synth_agent.py lines'} at {args.rate} lines/s"
        rate = n * args.rate
    print(
        f"\n{what}: {n} sessions, about {rate:,.0f} agent lines/s in all, "
        f"measured over {wall:.1f} s after {warmup:.0f} s of warm-up"
    )
    print(
        f"gateway{' (compiled with mypyc)' if compiled else ''} CPU: {gw_cores:.3f} cores, "
        f"{gw_cores / n * 1000:.2f} millicores a session; "
        f"{n / gw_cores if gw_cores else float('inf'):,.0f} sessions per core at this pace; "
        f"{gw_cores / rate * 1e6:.0f} µs a line, {kernel / wall / gw_cores:.0%} of it in the kernel"
    )
    print(
        f"gateway RSS: {rss0 / 2**20:.0f} MiB idle, {rss1 / 2**20:.0f} MiB with the sessions "
        f"attached, {rss2 / 2**20:.0f} MiB after the run: "
        f"{(rss1 - rss0) / n / 1024:.0f} KiB a session ({(rss2 - rss0) / n / 1024:.0f} KiB "
        "after the run, history buffers filled)"
    )
    print(f"router (nginx) CPU: {cores(nginx_pids):.3f} cores; agents: {cores(agents):.2f} cores")
    longest = max(pauses, key=lambda p: p[1], default=None)
    print(
        f"gateway garbage collections of 1 ms or more: {len(pauses)}"
        + (
            f", the longest {longest[1] / 1e6:.1f} ms (generation {longest[3]}, "
            f"{longest[2] / 1e6:.1f} ms of it on the CPU)"
            if longest
            else ""
        )
    )
    (d50, d99), (r50, r99) = summary(via["direct"]), summary(via["router"])
    print(
        f"latency agent write → master receive ({len(via['direct']):,} and "
        f"{len(via['router']):,} stamped lines in the measured window):\n"
        f"  direct  p50 {d50:.2f} ms  p99 {d99:.2f} ms\n"
        f"  router  p50 {r50:.2f} ms  p99 {r99:.2f} ms\n"
        f"  router adds p50 {r50 - d50:+.2f} ms  p99 {r99 - d99:+.2f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    parser.add_argument(
        "--rate", type=int, default=0, help="lines/s a session instead of the recorded pace"
    )
    parser.add_argument("--settle", type=float, default=2.0, help="warm-up with --rate (seconds)")
    parser.add_argument(
        "--transcript",
        default=str(RECORDING),
        help="a recording of Claude Code (with --rate, '' for synth_agent's own lines)",
    )
    parser.add_argument(
        "--profile", metavar="PATH", help="py-spy samples of the gateway over the measured window"
    )
    parser.add_argument(
        "--compiled",
        nargs="?",
        const="",
        metavar="DIR",
        help="the gateway of a copy with its per-line modules compiled by mypyc (kept in DIR)",
    )
    uvloop.run(main(parser.parse_args()))
