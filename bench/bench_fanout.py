"""Fan-out: one agent to 1 and to 16 masters at 10,000 lines/s, and 100 sessions at 100 lines/s.

Theory of operation
-------------------
One gateway process (``relay_rig.Gateway``: the real server on uvloop, the synthetic Claude Code of
``synth_agent.py`` as its agent). The masters are aiohttp WebSocket clients in ``--client-procs``
processes of their own, so that reading 16 x 10,000 frames/s is not done by the process that
measures. Each scenario: the masters attach, the agent is asked for ``rate x seconds`` lines at a
fixed rate, every master reads to the end marker; the gateway's own CPU time over the burst per
agent line, and the p50 and p99 of the latency from the agent's write to each master's receive
(all masters pooled).

1. one session, 1 master, ``--rate`` lines/s (the baseline of this run);
2. one session, 16 masters, ``--rate`` lines/s: CPU per line as a ratio to (1);
3. ``--sessions`` sessions at ``--session-rate`` lines/s each, one master each: p99.

It also prints the gateway's resident memory per idle session (agent started, nobody attached)
and per attached master, from the process's RSS before and after creating the sessions of (3) and
attaching their masters.

    .venv/bin/python bench/bench_fanout.py [--rate 10000] [--seconds 3] [--sessions 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

from relay_rig import Gateway, quantile

RIG = str(Path(__file__).resolve().parent / "relay_rig.py")


async def burst(
    gw: Gateway, session_ids: list[str], lines: int, rate: int, client_procs: int
) -> dict[str, float]:
    """Masters on ``session_ids`` (one per entry) read one burst of ``lines`` lines per session."""
    single = len(set(session_ids)) == 1
    groups = [session_ids[i::client_procs] for i in range(client_procs)]
    groups = [g for g in groups if g]
    procs = []
    for i, group in enumerate(groups):
        ask = "1" if (not single or i == 0) else "0"
        procs.append(
            await asyncio.create_subprocess_exec(
                sys.executable,
                RIG,
                "masters",
                gw.url,
                ",".join(group),
                str(lines),
                str(rate),
                ask,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                limit=1 << 28,
            )
        )
    for proc in procs:
        assert (await proc.stdout.readline()).strip() == b"ready"
    await asyncio.sleep(0.5)
    rss_attached = gw.rss()
    cpu0 = gw.cpu()
    for proc in procs:
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
    results = [json.loads(await proc.stdout.readline()) for proc in procs]
    cpu = gw.cpu() - cpu0
    for proc in procs:
        await proc.wait()
    latencies = [ns for per_proc in results for per_master in per_proc for ns in per_master]
    n_lines = lines * len(set(session_ids))
    return {
        "cpu_us": 1e6 * cpu / n_lines,
        "p50_ms": quantile(latencies, 0.5) / 1e6,
        "p99_ms": quantile(latencies, 0.99) / 1e6,
        "rss_attached": rss_attached,
    }


async def new_sessions(gw: Gateway, http: aiohttp.ClientSession, n: int) -> list[str]:
    return [await gw.new_session(http) for _ in range(n)]


async def main_async(args: argparse.Namespace) -> None:
    gw = Gateway(Path(args.tree).resolve()) if args.tree else Gateway()
    try:
        await gw.ready()
        async with aiohttp.ClientSession() as http:
            lines = args.rate * args.seconds
            [sid] = await new_sessions(gw, http, 1)
            await burst(gw, [sid], lines // 4, args.rate, 1)  # warm-up
            one = await burst(gw, [sid], lines, args.rate, 1)
            many = await burst(gw, [sid] * args.masters, lines, args.rate, args.client_procs)
            await asyncio.sleep(1)
            rss0 = gw.rss()
            sids = await new_sessions(gw, http, args.sessions)
            await asyncio.sleep(2)
            rss_idle = gw.rss()
            spread = await burst(
                gw, sids, args.session_rate * args.seconds, args.session_rate, args.client_procs
            )
    finally:
        gw.stop()
    print(
        f"one agent at {args.rate} lines/s for {args.seconds} s; {args.sessions} sessions at "
        f"{args.session_rate} lines/s; masters in {args.client_procs} processes"
    )
    print(
        f"{'scenario':34} {'CPU/line µs':>12} {'p50 ms':>8} {'p99 ms':>8} {'CPU vs 1 master':>16}"
    )
    rows = [
        ("1 master", one),
        (f"{args.masters} masters", many),
        (f"{args.sessions} sessions x 1 master", spread),
    ]
    for label, r in rows:
        print(
            f"{label:34} {r['cpu_us']:12.1f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
            f"{r['cpu_us'] / one['cpu_us']:15.2f}x"
        )
    per_session = (rss_idle - rss0) / args.sessions
    per_master = (spread["rss_attached"] - rss_idle) / args.sessions
    print(f"memory per idle session: {per_session / 1024:.0f} KiB; per attached master: "
          f"{per_master / 1024:.0f} KiB (gateway RSS, {args.sessions} of each)")  # fmt: skip
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=10000)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--masters", type=int, default=16)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--session-rate", type=int, default=100)
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--tree", help="run the gateway of another checkout (a baseline)")
    uvloop.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
