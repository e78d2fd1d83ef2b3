"""What metrics cost on the gateway's real per-line path, measured in the same run.

Theory of operation
-------------------
The path is the shell's own code, not a model of it: for each line of a long
``--include-partial-messages`` Claude Code transcript (built by ``bench_claude_parser.transcript``),
``LiveSession.take_lines``, the method ``_pump`` hands each batch of stdout lines to (parse, session
machine, per-line metrics, then each frame encoded and framed once, history, per-frame metrics and a
``send`` to each of ``--fanout`` connections whose transport discards the bytes). It runs once with the real
``GatewayMetrics`` and once with ``NullMetrics`` (same methods, doing nothing), interleaved over
rounds and timed in CPU time; the best round of each is compared. The difference is what
instrumentation costs the hot path.

    .venv/bin/python bench/bench_session_path.py [--lines 20000] [--rounds 7] [--fanout 1]

``--pause-us N`` waits N µs (asleep, as the event loop waits for the next line) before each line:
the same path as it runs at an agent's real pace, where a line seldom follows another at once. The
CPU of the pauses alone is measured too and taken off.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_claude_parser import transcript  # noqa: E402

from gateway.agent.stdout import StdoutLine  # noqa: E402
from gateway.config import Config, ServerSettings, builtin_profiles  # noqa: E402
from gateway.metrics import GatewayMetrics  # noqa: E402
from gateway.session import LiveSession  # noqa: E402
from parsers import events as ev  # noqa: E402


class NullMetrics:
    """GatewayMetrics' interface, doing nothing."""

    class _Lines:
        def line(self, kind, ns):
            pass

        def parse_error(self):
            pass

        def unknown_kind(self):
            pass

    def __init__(self) -> None:
        self._lines = self._Lines()

    def agent_lines(self, agent):
        return self._lines

    # the hot path: plain methods, as cheap to call as a Python call can be
    def frame_out(self, type_, nbytes):
        pass

    def frame_in(self, type_, nbytes):
        pass

    def observe_latency_ns(self, ns):
        pass

    def history_appended(self, nbytes):
        pass

    def history_evicted(self, nframes, nbytes):
        pass

    # the cold path
    def __getattr__(self, name):
        return _nothing

    @staticmethod
    def clock_ns() -> int:
        return 0


def _nothing(*args, **kwargs) -> None:
    return None


class _DiscardingTransport:
    """A WebSocket connection's transport that takes every write and keeps nothing."""

    def write(self, data):
        pass

    def writelines(self, data):
        pass

    def is_closing(self):
        return False

    def get_write_buffer_size(self):
        return 0

    def get_write_buffer_limits(self):
        return (16384, 65536)


async def _no_drain() -> None:
    pass


def start_session(session: LiveSession, fanout: int) -> None:
    """``fanout`` masters whose transports discard the bytes, and the agent's session started."""
    for i in range(fanout):
        session.attach(
            f"c{i}", None, role="master", last_message_id=None,
            transport=_DiscardingTransport(), drain=_no_drain,
        )  # fmt: skip
    session.machine.agent_events([ev.SessionStarted()])


async def feed_lines(
    session: LiveSession, lines: list[bytes], per_iteration: int = 1, pause_sec: float = 0.0
) -> None:
    """``LiveSession.take_lines`` (what ``_pump`` does with each batch the reader hands out) with
    batches of ``per_iteration`` lines; the event loop turns between batches, letting the
    connections' writers drain as they would. ``pause_sec``: asleep that long before each batch."""
    clock = time.perf_counter_ns
    for i in range(0, len(lines), per_iteration):
        if pause_sec:
            time.sleep(pause_sec)
        now = clock()
        session.take_lines([StdoutLine(line, now) for line in lines[i : i + per_iteration]])
        await asyncio.sleep(0)


async def one_pass(
    lines: list[bytes], metrics, fanout: int, root: Path, pause_sec: float = 0.0
) -> float:
    config = Config(server=ServerSettings(workspace_root=root))
    session = LiveSession(
        "0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a", builtin_profiles()["demo"], root,
        config=config, metrics=metrics,
    )  # fmt: skip
    start_session(session, fanout)
    start = time.process_time()
    await feed_lines(session, lines, pause_sec=pause_sec)
    elapsed = time.process_time() - start
    for conn in list(session.connections.values()):
        await conn.aclose()
    return elapsed


async def main_async(args: argparse.Namespace) -> None:
    lines = transcript(args.fixture, args.lines)
    root = Path(tempfile.mkdtemp(prefix="bench-session-"))
    plain, instrumented = [], []
    for i in range(args.rounds):
        order = [(plain, NullMetrics), (instrumented, GatewayMetrics)]
        for bucket, make in order if i % 2 == 0 else order[::-1]:
            bucket.append(await one_pass(lines, make(), args.fanout, root, args.pause_us / 1e6))
    best_plain, best_instr = min(plain), min(instrumented)
    n = len(lines)
    pause = f", {args.pause_us} µs asleep before each" if args.pause_us else ""
    print(f"{n} lines{pause}, fan-out {args.fanout}, best of {args.rounds} rounds (CPU time)")
    print(f"without metrics: {n / best_plain:12,.0f} lines/s")
    print(
        f"with metrics:    {n / best_instr:12,.0f} lines/s ({1e6 * best_instr / n:.1f} µs a line)"
    )
    print(f"instrumentation costs {100 * (best_instr / best_plain - 1):+.1f}% of the hot path")
    if args.pause_us:
        asleep = min(sleeping_cpu(n, args.pause_us / 1e6) for _ in range(args.rounds))
        print(
            f"the pauses alone (the system calls of sleeping): {1e6 * asleep / n:.1f} µs of CPU "
            f"each; the path after a pause: {1e6 * (best_instr - asleep) / n:.1f} µs a line"
        )


def sleeping_cpu(n: int, pause_sec: float) -> float:
    """CPU time of ``n`` pauses with nothing between them: what the pauses add to a pass."""
    start = time.process_time()
    for _ in range(n):
        time.sleep(pause_sec)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--fanout", type=int, default=1)
    parser.add_argument("--fixture", default="thinking--partial")
    parser.add_argument("--pause-us", type=int, default=0, help="asleep before each line (µs)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
