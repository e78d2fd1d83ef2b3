"""Benchmark: stdout line reading of `gateway.agent.process.AgentProcess` against asyncio.StreamReader.

Not a test. Run: `.venv/bin/python bench/bench_process_lines.py [--lines N] [--size BYTES]`.

A child Python process writes N lines of SIZE bytes as fast as a pipe takes them (one prebuilt
blob written in 1 MiB chunks, so the child is not the bottleneck), and each reader consumes them
line by line in the same run, on the stdlib loop and on uvloop:

* baseline: `asyncio.create_subprocess_exec` + `StreamReader.readline()` with the default 64 KiB
  limit (what most code does; it raises on a longer line);
* bigbuf:   the same with `limit=2**31` (survives long lines, but then only pauses the pipe at
  2 * limit, i.e. never);
* gateway:  `AgentProcess.readline()`;
* gw-batch: `AgentProcess.readlines()` (every queued line per await).

It prints lines/s, MB/s and the ratio to the baseline, both over wall time (includes the child's
start-up, and whatever else the machine is doing) and over the reader's own CPU time (what the
gateway pays per line; steadier on a shared machine); then one 32 MiB line (the longest the gateway keeps whole) through bigbuf and
gateway (the baseline cannot read it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from gateway.agent.process import AgentProcess
from gateway.agent.stdout import DEFAULT_MAX_LINE_BYTES

WRITER = """
import sys
n, size = int(sys.argv[1]), int(sys.argv[2])
line = (b'{"type":"stream_event","event":{"delta":{"text":"' + b"x" * size)[: size - 4] + b'"}}\\n'
blob = line * n
out = sys.stdout.buffer
for i in range(0, len(blob), 1 << 20):
    out.write(blob[i : i + (1 << 20)])
out.flush()
"""

BIG_WRITER = """
import sys
size = int(sys.argv[2])  # argv[1] is the line count, always 1 here
sys.stdout.buffer.write(b"x" * (size - 1) + b"\\n")
"""


async def read_streamreader(n: int, size: int, limit: int, script: str) -> tuple[int, int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, str(n), str(size),
        stdout=asyncio.subprocess.PIPE, limit=limit,
    )  # fmt: skip
    assert proc.stdout is not None
    count = nbytes = 0
    while line := await proc.stdout.readline():
        count += 1
        nbytes += len(line)
    await proc.wait()
    return count, nbytes


async def read_gateway(n: int, size: int, script: str) -> tuple[int, int]:
    proc = await AgentProcess.start(
        [sys.executable, "-c", script, str(n), str(size)],
        env=None, session_id="bench", workspace=".",
    )  # fmt: skip
    count = nbytes = 0
    while (item := await proc.readline()) is not None:
        count += 1
        nbytes += len(item.line) + 1
    await proc.wait()
    return count, nbytes


async def read_gateway_batch(n: int, size: int, script: str) -> tuple[int, int]:
    proc = await AgentProcess.start(
        [sys.executable, "-c", script, str(n), str(size)],
        env=None, session_id="bench", workspace=".",
    )  # fmt: skip
    count = nbytes = 0
    while batch := await proc.readlines():
        count += len(batch)
        nbytes += sum(len(item.line) + 1 for item in batch)
    await proc.wait()
    return count, nbytes


async def timed(fn: Callable[[], Awaitable[tuple[int, int]]]) -> tuple[float, float, int, int]:
    """Wall seconds and this process's CPU seconds (the reader's cost; the writer is a child)."""
    w0, c0 = time.perf_counter(), time.process_time()
    count, nbytes = await fn()
    return time.perf_counter() - w0, time.process_time() - c0, count, nbytes


async def run_small(n: int, size: int, repeat: int) -> dict[str, tuple[float, float]]:
    readers: dict[str, Callable[[], Awaitable[tuple[int, int]]]] = {
        "baseline": lambda: read_streamreader(n, size, 2**16, WRITER),
        "bigbuf": lambda: read_streamreader(n, size, 2**31, WRITER),
        "gateway": lambda: read_gateway(n, size, WRITER),
        "gw-batch": lambda: read_gateway_batch(n, size, WRITER),
    }
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    # Interleave the readers so that machine noise hits them alike; keep the best of `repeat`.
    for _ in range(repeat):
        for name, fn in readers.items():
            w, c, count, nbytes = await timed(fn)
            assert (count, nbytes) == (n, n * size), (name, count, nbytes)
            wall[name] = min(wall.get(name, float("inf")), w)
            cpu[name] = min(cpu.get(name, float("inf")), c)
    return {name: (wall[name], cpu[name]) for name in readers}


async def run_big(size: int) -> dict[str, float]:
    out: dict[str, float] = {}
    secs, _, count, nbytes = await timed(lambda: read_streamreader(1, size, 2**31, BIG_WRITER))
    assert (count, nbytes) == (1, size)
    out["bigbuf"] = secs
    secs, _, count, nbytes = await timed(lambda: read_gateway(1, size, BIG_WRITER))
    assert (count, nbytes) == (1, size)
    out["gateway"] = secs
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=300_000)
    ap.add_argument("--size", type=int, default=200, help="bytes per line, newline included")
    ap.add_argument("--repeat", type=int, default=3)
    # The longest line the gateway keeps whole (a longer one is cut as it streams, so it is no
    # measure of reading it)
    ap.add_argument("--big", type=int, default=DEFAULT_MAX_LINE_BYTES)
    args = ap.parse_args()

    mb = args.lines * args.size / 1e6
    print(f"{args.lines} lines x {args.size} B = {mb:.0f} MB per run, best of {args.repeat}")
    for loop_name, factory in (
        ("asyncio", asyncio.new_event_loop),
        ("uvloop", uvloop.new_event_loop),
    ):
        with asyncio.Runner(loop_factory=factory) as runner:
            best = runner.run(run_small(args.lines, args.size, args.repeat))
            big = runner.run(run_big(args.big))
        base_wall, base_cpu = best["baseline"]
        for name, (wall, cpu) in best.items():
            print(
                f"{loop_name:8} {name:9} {args.lines / wall:>10,.0f} lines/s {mb / wall:>7.1f} MB/s"
                f" x{base_wall / wall:.2f} | reader CPU {args.lines / cpu:>10,.0f} lines/s"
                f" {mb / cpu:>7.1f} MB/s x{base_cpu / cpu:.2f} vs baseline"
            )
        for name, secs in big.items():
            print(f"{loop_name:8} {name:9} one {args.big >> 20} MiB line in {secs * 1000:.0f} ms")


if __name__ == "__main__":
    main()
