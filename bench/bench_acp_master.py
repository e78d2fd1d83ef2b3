"""What a turn costs the gateway when an ACP client watches it through ``/acp``, against the same
turn watched by one DPS master, measured in the same run (target: at most 1.5x).

Theory of operation
-------------------
The path is the shell's own code (as ``bench_session_path.py``'s): for each line of a long
``--include-partial-messages`` Claude Code transcript, ``LiveSession.take_lines`` (parse, session
machine, metrics, each frame encoded and framed once, history, a ``send`` to each connection). In
one pass the session's one connection is a DPS master's whose transport discards the bytes; in the
other it is an ACP client's view (``gateway/session/acp_client.py``): the same framed bytes go to
its ``AcpView``, which decodes each frame and encodes the ACP message it becomes, written to a
transport that discards them. Passes alternate over rounds, timed in CPU time; the best of each is
compared. The difference is what ``/acp`` adds to a turn, all of it per frame.

    .venv/bin/python bench/bench_acp_master.py [--lines 20000] [--rounds 7]
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
from bench_session_path import _DiscardingTransport, _no_drain, feed_lines  # noqa: E402

from gateway.config import Config, ServerSettings, builtin_profiles  # noqa: E402
from gateway.metrics import GatewayMetrics  # noqa: E402
from gateway.session import LiveSession  # noqa: E402
from gateway.session.acp_client import AcpClient  # noqa: E402
from gateway.session.fanout import WebSocketConnection  # noqa: E402
from gateway.team import roles  # noqa: E402
from parsers import events as ev  # noqa: E402

SESSION_ID = "0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a"


class _CountingTransport(_DiscardingTransport):
    """Discards what is written, counting the bytes (what each kind of master was sent)."""

    def __init__(self) -> None:
        self.bytes = 0

    def write(self, data):
        self.bytes += len(data)


async def one_pass(lines: list[bytes], root: Path, acp: bool) -> tuple[float, int]:
    config = Config(server=ServerSettings(workspace_root=root))
    session = LiveSession(
        SESSION_ID, builtin_profiles()["demo"], root, config=config, metrics=GatewayMetrics()
    )
    transport = _CountingTransport()
    client = None
    if acp:
        out = WebSocketConnection("acp", None, transport=transport, drain=_no_drain, role="acp")
        client = AcpClient("acp", out, roles.Sender(roles.LOCAL, None))
        client.attach(session)
    else:
        session.attach(
            "dps", None, role="master", last_message_id=None, transport=transport, drain=_no_drain
        )
    session.machine.agent_events([ev.SessionStarted()])
    start = time.process_time()
    await feed_lines(session, lines)
    elapsed = time.process_time() - start
    if client is not None:
        client.close()
    for conn in list(session.connections.values()):
        await conn.aclose()
    return elapsed, transport.bytes


async def main_async(args: argparse.Namespace) -> None:
    lines = transcript(args.fixture, args.lines)
    root = Path(tempfile.mkdtemp(prefix="bench-acp-"))
    dps: list[float] = []
    acp: list[float] = []
    sent = {}
    for i in range(args.rounds):
        order = [(dps, False), (acp, True)]
        for bucket, is_acp in order if i % 2 == 0 else order[::-1]:
            elapsed, nbytes = await one_pass(lines, root, is_acp)
            bucket.append(elapsed)
            sent[is_acp] = nbytes
    best_dps, best_acp = min(dps), min(acp)
    n = len(lines)
    print(f"{n} agent lines of one turn ({args.fixture}), best of {args.rounds} rounds (CPU time)")
    print(f"one DPS master: {1e6 * best_dps / n:6.1f} µs a line, {sent[False]:>11,} bytes sent")
    print(f"one ACP client: {1e6 * best_acp / n:6.1f} µs a line, {sent[True]:>11,} bytes sent")
    print(f"/acp costs {best_acp / best_dps:.2f}x the gateway CPU of the DPS master (target 1.5x)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--fixture", default="thinking--partial")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
