"""rawp-gateway against websocketd, side by side in one run: one agent, one master.

Theory of operation
-------------------
websocketd (Debian's package, installed by ``scripts/install-websocketd.sh`` when missing) is the
anchor: a relay in Go that moves each stdout line to a WebSocket message without parsing it. Both
relays run the same synthetic agent (``bench/synth_agent.py``: Claude Code stream-json lines, text
deltas, tool calls, results) and are read by the same aiohttp master (``bench/relay_rig.py``). The
gateway does its whole job on each line (parse, session machine, map, encode, history, fan-out);
websocketd does none of it, which is what makes it the floor.

For each relay, rounds interleaved, the best round kept:

* full speed: the agent writes ``--lines`` lines at once; lines/s from the master's first message
  to the end marker, and the relay's own CPU time (``/proc``) per agent line;
* fixed rate: ``--rate`` lines/s for ``--seconds``; p50 and p99 of the latency from the agent's
  write to the master's receive;
* high rate: ``--high-rate`` lines/s for ``--seconds``, each line its own write(2) as Claude Code's
  are: the relay's CPU time per line (each line may be a wake-up of its own) and p50/p99.

Printed as ratios to websocketd (the absolute numbers are shown too, but they depend on the
machine and on whatever else it runs).

    .venv/bin/python bench/bench_vs_websocketd.py [--lines 60000] [--rate 1000]
        [--high-rate 10000] [--seconds 3] [--state-dir] [--baseline CHECKOUT] [--compiled [DIR]]

``--state-dir`` adds the same gateway with ``[server] state_dir`` set (every frame also written to
the session's log on disk): what persistence costs on the hot path, in the same run.

``--compiled`` adds the gateway of a copy of this checkout whose per-line modules are compiled with
mypyc (``bench_compiled.build``: in DIR, reused while current, or in a temporary directory): what
compiling would gain end to end. The run stops if that gateway's process has not loaded the
compiled library (``/proc/<pid>/maps``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_compiled import COMPILED, build, runs_compiled
from relay_rig import Gateway, Websocketd, quantile


async def one_round(relay, lines: int, rate: int) -> dict[str, float]:
    async with aiohttp.ClientSession() as http:
        if isinstance(relay, Gateway):
            master = await relay.attach(http, await relay.new_session(http))
        else:
            master = await relay.attach(http)
        await asyncio.sleep(0.3)  # the agent has started and printed its init line
        cpu0 = relay.cpu()
        await master.request_burst(lines, rate)
        await master.read_burst()
        cpu = relay.cpu() - cpu0
        await master.ws.close()
    wall = (master.end_ns - master.first_ns) / 1e9
    return {
        "lines_s": lines / wall if wall > 0 else float("nan"),
        "cpu_us": 1e6 * cpu / lines,
        "p50_ms": quantile(master.latencies_ns, 0.5) / 1e6,
        "p99_ms": quantile(master.latencies_ns, 0.99) / 1e6,
    }


async def main_async(args: argparse.Namespace) -> None:
    compiled = None
    if args.compiled is not None:  # built before any relay starts
        compiled = Path(args.compiled or tempfile.mkdtemp(prefix="rawp-compiled-")).resolve()
        compiled.mkdir(parents=True, exist_ok=True)
        build(compiled)
    relays = [Websocketd(), Gateway()]
    if args.state_dir:
        relays.append(Gateway(name="+state_dir", state_dir=True))
    if args.baseline:
        relays.append(Gateway(Path(args.baseline).resolve(), name="baseline"))
    if compiled is not None:
        relays.append(Gateway(compiled, name="compiled"))
    try:
        for relay in relays:
            await relay.ready()
        full: dict[str, list[dict]] = {r.name: [] for r in relays}
        fixed: dict[str, list[dict]] = {r.name: [] for r in relays}
        high: dict[str, list[dict]] = {r.name: [] for r in relays}
        for i in range(args.rounds):
            order = relays if i % 2 == 0 else relays[::-1]
            for relay in order:
                full[relay.name].append(await one_round(relay, args.lines, 0))
                fixed[relay.name].append(
                    await one_round(relay, args.rate * args.seconds, args.rate)
                )
                high[relay.name].append(
                    await one_round(relay, args.high_rate * args.seconds, args.high_rate)
                )
        if compiled is not None and not runs_compiled(relays[-1].proc.pid, compiled):
            raise SystemExit("the compiled copy's gateway did not load its compiled modules")
    finally:
        for relay in relays:
            relay.stop()
        if compiled is not None and not args.compiled:
            shutil.rmtree(compiled, ignore_errors=True)
    best = {
        name: {
            "lines_s": max(r["lines_s"] for r in full[name]),
            "cpu_us": min(r["cpu_us"] for r in full[name]),
            "p50_ms": min(r["p50_ms"] for r in fixed[name]),
            "p99_ms": min(r["p99_ms"] for r in fixed[name]),
            "high_cpu_us": min(r["cpu_us"] for r in high[name]),
            "high_p50_ms": min(r["p50_ms"] for r in high[name]),
            "high_p99_ms": min(r["p99_ms"] for r in high[name]),
        }
        for name in full
    }
    print(f"{args.lines} lines at full speed, {args.rate} and {args.high_rate} lines/s for "
          f"{args.seconds} s; best of {args.rounds} interleaved rounds; one master")  # fmt: skip
    others = [r.name for r in relays[1:]]
    print(
        f"{'measure':44} {'websocketd':>12}"
        + "".join(f" {n:>13} {'/websocketd':>11}" for n in others)
    )
    rows = [
        ("lines/s, full speed (higher is better)", "lines_s", "{:12,.0f}"),
        ("CPU per agent line, full speed (µs)", "cpu_us", "{:12.2f}"),
        (f"p50 at {args.rate} lines/s (ms)", "p50_ms", "{:12.2f}"),
        (f"p99 at {args.rate} lines/s (ms)", "p99_ms", "{:12.2f}"),
        (f"CPU per agent line at {args.high_rate} lines/s (µs)", "high_cpu_us", "{:12.2f}"),
        (f"p50 at {args.high_rate} lines/s (ms)", "high_p50_ms", "{:12.2f}"),
        (f"p99 at {args.high_rate} lines/s (ms)", "high_p99_ms", "{:12.2f}"),
    ]
    for label, key, fmt in rows:
        a = best["websocketd"][key]
        # A short run can read no CPU tick of websocketd's (the clock counts 10 ms steps).
        cells = "".join(
            f" {fmt.format(best[n][key]):>13} "
            + (f"{best[n][key] / a:10.2f}x" if a else f"{'n/a':>11}")
            for n in others
        )
        print(f"{label:44} {fmt.format(a)}{cells}")
    if args.baseline:
        print(f"baseline: the gateway of {args.baseline}")
    if compiled is not None:
        print(f"compiled: this checkout with {len(COMPILED)} modules compiled with mypyc "
              "(bench_compiled.py)")  # fmt: skip
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=60000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--high-rate", type=int, default=10000)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", help="another checkout of rawp-gateway, run side by side")
    parser.add_argument(
        "--state-dir",
        action="store_true",
        help="also run the gateway with a state directory (sessions on disk), side by side",
    )
    parser.add_argument(
        "--compiled",
        nargs="?",
        const="",
        metavar="DIR",
        help="also run a copy of the gateway compiled with mypyc (kept in DIR), side by side",
    )
    uvloop.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
