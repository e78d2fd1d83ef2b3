"""Fan-out: one agent to 1 and to 16 masters at 10,000 lines/s, and 100 sessions at 100 lines/s.

Theory of operation
-------------------
One gateway process (``relay_rig.Gateway``: the real server on uvloop, the synthetic Claude Code of
``synth_agent.py`` as its agent). The masters run in ``--client-procs`` processes of their own, so
that reading 16 x 10,000 frames/s is not done by the process that measures. They are
``relay_rig.LeanMaster`` (``--masters lean``, the default: its own frame parsing, about 1.3 µs a
message) or aiohttp WebSocket clients (``--masters aiohttp``, 25 to 30% more CPU in all). Each
scenario: the masters attach, the agent is asked for ``rate x seconds`` lines at a fixed rate, every
master reads to the end marker. Printed per scenario:

* the gateway's own CPU time over the burst per agent line;
* the p50 and p99 of the latency from the agent's write to each master's receive (all masters
  pooled), counting the lines written ``--settle`` seconds or more after every session streams (a
  hundred prompts at once are not the steady state), and the p99 of every line beside them;
* the CPU the gateway, the masters' processes and the agents (the gateway's children) used over the
  burst, in cores, so that a run where the machine was the limit shows as one, and the masters' CPU
  per message;
* the gateway's garbage collections of 1 ms or more during the burst (``relay_rig`` logs them).

Every master of a session must have read the same number of stamped messages, or the run stops.

1. one session, 1 master, ``--rate`` lines/s (the baseline of this run);
2. one session, ``--fanout`` (16) masters, ``--rate`` lines/s: CPU per line as a ratio to (1);
3. ``--sessions`` sessions at ``--session-rate`` lines/s each, one master each: p99.

It also prints the gateway's resident memory per idle session (agent started, nobody attached)
and per attached master, from the process's RSS before and after creating the sessions of (3) and
attaching their masters.

    .venv/bin/python bench/bench_fanout.py [--rate 10000] [--seconds 3] [--sessions 100]
        [--masters lean|aiohttp] [--settle 0.5]
        [--baseline ../other-checkout]   # also that checkout's gateway, each scenario back to back
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

from relay_rig import Gateway, children_pids, cpu_seconds_of, quantile

RIG = str(Path(__file__).resolve().parent / "relay_rig.py")


async def burst(
    gw: Gateway,
    session_ids: list[str],
    lines: int,
    rate: int,
    client_procs: int,
    kind: str,
    settle: float = 0.0,
) -> dict[str, float]:
    """Masters on ``session_ids`` (one per entry) read one burst of ``lines`` lines per session.

    p50 and p99 count the lines written ``settle`` seconds or more after the last session's first
    line (when every session streams); ``p99_all_ms`` counts every line."""
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
                kind,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                limit=1 << 28,
            )
        )
    for proc in procs:
        assert (await proc.stdout.readline()).strip() == b"ready"
    await asyncio.sleep(0.5)
    rss_attached = gw.rss()
    agents = children_pids(gw.proc.pid)
    agents_cpu0 = cpu_seconds_of(agents)
    cpu0 = gw.cpu()
    t0 = time.monotonic()
    t0_ns = time.monotonic_ns()
    for proc in procs:
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
    results = [json.loads(await proc.stdout.readline()) for proc in procs]
    cpu = gw.cpu() - cpu0
    wall = time.monotonic() - t0
    pauses = [ns for _, ns, _, _ in gw.gc_pauses(t0_ns, time.monotonic_ns())]
    agents_cpu = cpu_seconds_of(agents)
    for proc in procs:
        await proc.wait()
    masters = [m for r in results for m in r["masters"]]
    # Every master of a session must have read every stamped line: a master that lost or misread
    # messages would make its latencies meaningless.
    by_session: dict[str, set[int]] = {}
    for sid, m in zip((s for g in groups for s in g), masters, strict=True):
        by_session.setdefault(sid, set()).add(m["stamped"])
    for sid, counts in by_session.items():
        if len(counts) != 1 or 0 in counts:
            raise RuntimeError(f"masters of {sid} read different stamped messages: {counts}")
    latencies = [ns for m in masters for ns in m["latencies_ns"]]
    steady_from = max(m["stamps_ns"][0] for m in masters) + int(settle * 1e9)
    steady = [
        ns
        for m in masters
        for ns, stamp in zip(m["latencies_ns"], m["stamps_ns"], strict=True)
        if stamp >= steady_from
    ]
    n_lines = lines * len(by_session)
    return {
        "cpu_us": 1e6 * cpu / n_lines,
        "p50_ms": quantile(steady, 0.5) / 1e6,
        "p99_ms": quantile(steady, 0.99) / 1e6,
        "p99_all_ms": quantile(latencies, 0.99) / 1e6,
        "steady_share": len(steady) / len(latencies),
        "rss_attached": rss_attached,
        "gateway_load": cpu / wall,
        "masters_load": sum(r["cpu_s"] for r in results) / wall,
        "master_us": 1e6 * sum(r["cpu_s"] for r in results) / sum(m["messages"] for m in masters),
        "agents_load": sum(agents_cpu[p] - agents_cpu0[p] for p in agents_cpu if p in agents_cpu0)
        / wall,
        "stamped": sum(m["stamped"] for m in masters),
        "gc_pauses": len(pauses),
        "gc_max_ms": max(pauses, default=0) / 1e6,
    }


async def new_sessions(gw: Gateway, http: aiohttp.ClientSession, n: int) -> list[str]:
    return [await gw.new_session(http) for _ in range(n)]


async def main_async(args: argparse.Namespace) -> None:
    if args.seconds <= args.settle:
        raise SystemExit("--seconds must be longer than --settle")
    load_before = os.getloadavg()[0]
    gateways = [Gateway()]
    if args.baseline:
        gateways.append(Gateway(Path(args.baseline).resolve(), name="baseline"))
    lines = args.rate * args.seconds
    results: dict[str, dict[str, dict[str, float]]] = {gw.name: {} for gw in gateways}
    memory: dict[str, tuple[float, float]] = {}
    try:
        async with aiohttp.ClientSession() as http:
            one_sid = {}
            for gw in gateways:
                await gw.ready()
                [one_sid[gw.name]] = await new_sessions(gw, http, 1)
                await burst(
                    gw, [one_sid[gw.name]], lines // 4, args.rate, 1, args.masters
                )  # warm-up
            # Each scenario on every gateway back to back, so that they share the machine's mood.
            scenarios = [("one", 1), ("many", args.fanout)]
            for i, (key, n) in enumerate(scenarios):
                for gw in gateways if i % 2 == 0 else gateways[::-1]:
                    sid = one_sid[gw.name]
                    procs = 1 if n == 1 else args.client_procs
                    results[gw.name][key] = await burst(
                        gw, [sid] * n, lines, args.rate, procs, args.masters, args.settle
                    )
            sids = {}
            for gw in gateways:
                await asyncio.sleep(1)
                rss0 = gw.rss()
                sids[gw.name] = await new_sessions(gw, http, args.sessions)
                await asyncio.sleep(2)
                memory[gw.name] = (rss0, gw.rss())
            for gw in gateways[::-1]:
                results[gw.name]["spread"] = await burst(
                    gw,
                    sids[gw.name],
                    args.session_rate * args.seconds,
                    args.session_rate,
                    args.client_procs,
                    args.masters,
                    args.settle,
                )
    finally:
        for gw in gateways:
            gw.stop()
    print(
        f"one agent at {args.rate} lines/s for {args.seconds} s; {args.sessions} sessions at "
        f"{args.session_rate} lines/s; {args.masters} masters in {args.client_procs} processes"
    )
    print(
        f"p50/p99: lines written from {args.settle} s after every session streams; p99 all: every "
        "line; cores: CPU time over the burst's wall time; master µs/msg: the masters' processes' "
        "CPU per message read; GC: the gateway's garbage collections of 1 ms or more in the burst"
    )
    labels = {
        "one": "1 master",
        "many": f"{args.fanout} masters",
        "spread": f"{args.sessions} sessions x 1 master",
    }
    for gw in gateways:
        r = results[gw.name]
        print(f"{gw.name}:")
        print(
            f"  {'scenario':26} {'CPU/line µs':>11} {'vs 1 master':>11} {'p50 ms':>7} "
            f"{'p99 ms':>7} {'p99 all':>7} {'cores: gateway':>14} {'masters':>7} {'agents':>6} "
            f"{'master µs/msg':>13} {'GC ≥1ms: n':>10} {'max ms':>6}"
        )
        for key, label in labels.items():
            x = r[key]
            print(
                f"  {label:26} {x['cpu_us']:11.1f} {x['cpu_us'] / r['one']['cpu_us']:10.2f}x "
                f"{x['p50_ms']:7.2f} {x['p99_ms']:7.2f} {x['p99_all_ms']:7.2f} "
                f"{x['gateway_load']:14.2f} {x['masters_load']:7.2f} {x['agents_load']:6.2f} "
                f"{x['master_us']:13.1f} {x['gc_pauses']:10d} {x['gc_max_ms']:6.1f}"
            )
        rss0, rss_idle = memory[gw.name]
        per_session = (rss_idle - rss0) / args.sessions
        per_master = (r["spread"]["rss_attached"] - rss_idle) / args.sessions
        print(
            f"  memory per idle session: {per_session / 1024:.0f} KiB; per attached master: "
            f"{per_master / 1024:.0f} KiB (the gateway's RSS, {args.sessions} of each)"
        )
    if args.baseline:
        print("rawp-gateway / baseline, CPU per line:")
        for key, label in labels.items():
            ratio = results["rawp-gateway"][key]["cpu_us"] / results["baseline"][key]["cpu_us"]
            print(f"  {label:32} {ratio:12.2f}x")
        print(f"baseline: the gateway of {args.baseline}")
    print(
        f"load average: {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, "
        f"on {os.cpu_count()} cores"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=10000)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--fanout", type=int, default=16, help="masters on one session")
    parser.add_argument(
        "--masters",
        choices=("lean", "aiohttp"),
        default="lean",
        help="the masters' WebSocket client: relay_rig.LeanMaster or aiohttp's",
    )
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--session-rate", type=int, default=100)
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument(
        "--settle",
        type=float,
        default=0.5,
        help="seconds after every session streams before lines count for p50/p99",
    )
    parser.add_argument("--baseline", help="another checkout of rawp-gateway, run side by side")
    uvloop.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
