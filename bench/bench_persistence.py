"""What a state directory (sessions that survive a restart) costs on the gateway's real per-line path.

Theory of operation
-------------------
The same path as ``bench_session_path.py`` (each line of a long Claude Code transcript through the
parser, the session machine and fan-out in ``LiveSession.take_lines``: encode once, history, fan-out to
``--fanout`` discarding connections, ``--per-iteration`` lines per event-loop iteration: 1 is an
agent printing slowly, more is the batch a busy agent's stdout gives), once with an in-memory
session and once with ``SavedSession`` in a temporary state directory (every broadcast frame
appended to ``frames.log``, written once per loop iteration, the record rewritten at turn edges,
the log fsynced at turn ends). Rounds alternate; the best round of each, in CPU time of the whole
process (user and system, the fsync thread included), is compared.

    .venv/bin/python bench/bench_persistence.py [--lines 20000] [--rounds 7] [--fanout 1]
        [--per-iteration 1]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_claude_parser import transcript  # noqa: E402
from bench_session_path import feed_lines, start_session  # noqa: E402

from gateway.config import Config, ServerSettings, builtin_profiles  # noqa: E402
from gateway.metrics import GatewayMetrics  # noqa: E402
from gateway.session import LiveSession  # noqa: E402
from gateway.storage.state_dir import StateDir  # noqa: E402

SESSION_ID = "0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a"


async def one_pass(
    lines: list[bytes], fanout: int, root: Path, state: Path | None, per_iteration: int
) -> float:
    saved = None
    if state is not None:
        shutil.rmtree(state, ignore_errors=True)
        saved = StateDir(state).create(SESSION_ID)
    session = LiveSession(
        SESSION_ID, builtin_profiles()["demo"], root,
        config=Config(server=ServerSettings(workspace_root=root)), metrics=GatewayMetrics(), saved=saved,
    )  # fmt: skip
    start_session(session, fanout)
    start = time.process_time()
    await feed_lines(session, lines, per_iteration)  # each loop turn: one write to the log
    if saved is not None:
        saved.sync()
    elapsed = time.process_time() - start
    for conn in list(session.connections.values()):
        await conn.aclose()
    if saved is not None:
        saved.remove()
    return elapsed


async def main_async(args: argparse.Namespace) -> None:
    lines = transcript(args.fixture, args.lines)
    root = Path(tempfile.mkdtemp(prefix="bench-persistence-"))
    memory, disk = [], []
    for i in range(args.rounds):
        order = [(memory, None), (disk, root / "state")]
        for bucket, state in order if i % 2 == 0 else order[::-1]:
            bucket.append(await one_pass(lines, args.fanout, root, state, args.per_iteration))
    shutil.rmtree(root, ignore_errors=True)
    best_memory, best_disk = min(memory), min(disk)
    n = len(lines)
    print(
        f"{n} lines, fan-out {args.fanout}, {args.per_iteration} per loop iteration, "
        f"best of {args.rounds} rounds (CPU time)"
    )
    print(f"in memory:     {n / best_memory:12,.0f} lines/s")
    print(f"with state_dir:{n / best_disk:12,.0f} lines/s")
    print(f"persistence costs {100 * (best_disk / best_memory - 1):+.1f}% of the hot path")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--fanout", type=int, default=1)
    parser.add_argument("--per-iteration", type=int, default=1)
    parser.add_argument("--fixture", default="thinking--partial")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
