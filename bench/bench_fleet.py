"""Capacity of one gateway of a fleet, and what the router adds: N sessions at a paced rate, half of
their masters through the fleet's nginx router, half straight to the gateway, in the same run.

Theory of operation
-------------------
One gateway process (``relay_rig.Gateway``: the real server on uvloop, ``synth_agent.py`` as its
agent, replaying a recording of Claude Code 2.1's ``--include-partial-messages`` stream-json in a
loop, ``--transcript``: by default one turn with three parallel tool calls) and the
fleet's router: Debian's nginx running ``deploy/k8s/router/default.conf.template`` (rendered by
``tests/fleet_rig.py`` as the tests do, its DNS answering the gateway's address). ``--sessions``
sessions are created through the router (``POST /v1/session``); each gets one master
(``relay_rig.LeanMaster``), the even ones connected to the router, the odd ones to the gateway.
Every session then streams ``--rate`` lines/s for ``--seconds`` seconds, the sessions' starts spread
over one second, each text delta stamped with the time the agent wrote it.

Printed:

* the gateway's CPU over the streaming, in cores, and per session; sessions per core at this rate;
* the gateway's resident memory per session (RSS after creating the sessions and attaching their
  masters, less RSS before; the agents are processes of their own and not counted);
* latency from the agent's write to the master's receive, p50 and p99, straight and through the
  router, and the difference: what the router adds (lines written ``--settle`` seconds or more
  after the last session started);
* the router's (nginx) and the agents' CPU, in cores.

The recordings carry no timing (their model was the rig's scripted server), so the pace is set:
the default rate, 2 lines/s a session, is an agent's average over a working session: a streamed
answer comes at 20 to 60 lines/s (text deltas), but for seconds at a time, between the tools it runs
and the minutes a person takes to read and answer. ``--rate 40`` is every session streaming at once.

    .venv/bin/python bench/bench_fleet.py [--sessions 500] [--rate 2] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import uvloop

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from relay_rig import Gateway, LeanMaster, children_pids, cpu_seconds_of, quantile  # noqa: E402

from tests.fleet_rig import READY, Dns, Router, nginx_path  # noqa: E402


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


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


def summary(latencies_ns: list[int]) -> tuple[float, float]:
    return quantile(latencies_ns, 0.5) / 1e6, quantile(latencies_ns, 0.99) / 1e6


async def main(args: argparse.Namespace) -> None:
    if nginx_path() is None:
        raise SystemExit("nginx is not installed (scripts/install-nginx.sh)")
    if args.transcript:  # synth_agent.py replays it (inherited through the gateway's environment)
        os.environ["RAWP_SYNTH_TRANSCRIPT"] = str(Path(args.transcript).resolve())
    gw = Gateway()
    home = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    dns = Dns({READY: ["127.0.0.1"]})  # no route prefix: every path goes to "any ready gateway"
    router = Router(home, dns, gw.port)
    try:
        await gw.ready()
        await router.start()
        nginx_pids = [router.proc.pid, *children_pids(router.proc.pid)]
        async with aiohttp.ClientSession() as http:
            rss0 = rss(gw.proc.pid)
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
            rss1 = rss(gw.proc.pid)
            lines = int(args.rate * args.seconds)
            agents = children_pids(gw.proc.pid)
            cpu0 = cpu_seconds_of([gw.proc.pid, *nginx_pids, *agents])
            wall0 = time.monotonic()
            start_ns = time.monotonic_ns()
            for i, m in enumerate(masters):
                m.request_burst(lines, args.rate)
                if i % 50 == 49:
                    await asyncio.sleep(1.0 / max(1, len(masters) // 50))
            last_start_ns = time.monotonic_ns()
            async with asyncio.timeout(args.seconds * 4 + 120):
                await asyncio.gather(*(m.ended for m in masters))
            wall = time.monotonic() - wall0
            cpu1 = cpu_seconds_of([gw.proc.pid, *nginx_pids, *agents])
            rss2 = rss(gw.proc.pid)
            for m in masters:
                m.close()
    finally:
        router.stop()
        dns.close()
        gw.stop()

    def cores(pids: list[int]) -> float:
        return sum(cpu1.get(p, 0) - cpu0.get(p, 0) for p in pids) / wall

    settle_ns = last_start_ns + int(args.settle * 1e9)
    via: dict[str, list[int]] = {"router": [], "direct": []}
    for i, m in enumerate(masters):
        key = "router" if i % 2 == 0 else "direct"
        via[key] += [
            lat for lat, s in zip(m.latencies_ns, m.stamps_ns, strict=True) if s >= settle_ns
        ]
    gw_cores = cores([gw.proc.pid])
    n = len(ids)
    what = Path(args.transcript).name if args.transcript else "synth_agent.py's own lines"
    print(
        f"\n{what}: {n} sessions, {args.rate:g} lines/s each for {args.seconds:g} s "
        f"({n * args.rate:,.0f} lines/s in all); streaming took {wall:.1f} s "
        f"(started over {(last_start_ns - start_ns) / 1e9:.1f} s)"
    )
    print(
        f"gateway CPU: {gw_cores:.3f} cores, {gw_cores / n * 1000:.2f} millicores a session; "
        f"{n / gw_cores if gw_cores else float('inf'):,.0f} sessions per core at this rate"
    )
    print(
        f"gateway RSS: {rss0 / 2**20:.0f} MiB idle, {rss1 / 2**20:.0f} MiB with the sessions "
        f"attached, {rss2 / 2**20:.0f} MiB after streaming: "
        f"{(rss1 - rss0) / n / 1024:.0f} KiB a session ({(rss2 - rss0) / n / 1024:.0f} KiB "
        "after streaming, history buffers filled)"
    )
    print(f"router (nginx) CPU: {cores(nginx_pids):.3f} cores; agents: {cores(agents):.2f} cores")
    (d50, d99), (r50, r99) = summary(via["direct"]), summary(via["router"])
    print(
        f"latency agent write → master receive ({len(via['direct']):,} and "
        f"{len(via['router']):,} stamped lines after {args.settle:g} s of settling):\n"
        f"  direct  p50 {d50:.2f} ms  p99 {d99:.2f} ms\n"
        f"  router  p50 {r50:.2f} ms  p99 {r99:.2f} ms\n"
        f"  router adds p50 {r50 - d50:+.2f} ms  p99 {r99 - d99:+.2f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--rate", type=int, default=2, help="lines/s a session")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument(
        "--transcript",
        default=str(HERE.parent / "tests/fixtures/claude-code/parallel--partial.jsonl"),
        help="a recording of Claude Code replayed in a loop ('' for synth_agent's own lines)",
    )
    uvloop.run(main(parser.parse_args()))
