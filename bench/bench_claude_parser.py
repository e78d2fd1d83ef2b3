"""Lines per second through the Claude Code parser, the mapper and the encoder, on a long
``--include-partial-messages`` transcript, against plain ``json.loads`` of the same lines.

Theory of operation
-------------------
The transcript is built from a recorded fixture (``tests/fixtures/claude-code/``, default
``thinking--partial``): its first line (``system/init``), then its streamed turn repeated with
fresh message ids (the ``stream_event`` and ``assistant`` lines of each API message) until there
are ``--lines`` lines, then its ``result``. That is what a long streamed answer looks like: almost
all ``text_delta``/``thinking_delta`` lines, the parser's hot path.

Per round, one full pass of the pipeline (a fresh ``ClaudeCodeParser`` and ``Mapper``, every line
fed, every frame encoded once as the shell does) and one pass of ``json.loads`` over the same lines
(the least any Python consumer of this output does) are timed with ``time.process_time`` (CPU time:
being descheduled on a shared machine does not count). Rounds interleave the two so drifting load
hits both alike; the best round of each is reported, with the ratio.

    .venv/bin/python bench/bench_claude_parser.py [--lines 50000] [--rounds 7] [--fixture NAME]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.protocol.codec import encode
from gateway.protocol.factory import FrameFactory
from gateway.protocol.mapper import Mapper
from parsers import events as ev
from parsers.claude_code import ClaudeCodeParser

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "claude-code"
SESSION = "0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a"
TURN = "5d2c1b0a-9e8f-4d7c-8b6a-5f4e3d2c1b0a"


def transcript(fixture: str, n_lines: int) -> list[bytes]:
    """The fixture's init, its streamed message lines repeated to ``n_lines`` (message and tool call
    ids renumbered per copy), its result."""
    lines = (FIXTURES / f"{fixture}.jsonl").read_bytes().splitlines()
    kinds = [json.loads(line).get("type") for line in lines]
    body = [
        line
        for line, kind in zip(lines, kinds, strict=True)
        if kind in ("stream_event", "assistant")
    ]
    if not body:
        raise SystemExit(f"{fixture} has no streamed lines; pick a --partial fixture")
    ids = sorted(
        {
            json.loads(line)["message"]["id"]
            for line, k in zip(lines, kinds, strict=True)
            if k == "assistant"
        }
    )
    # Tool call ids too: each copy's calls are new calls.
    ids += sorted({m.decode() for line in body for m in re.findall(rb"toolu_\w+", line)})
    out = [lines[0]]
    copy = 0
    while len(out) < n_lines:
        copy += 1
        for line in body:
            for old in ids:
                line = line.replace(old.encode(), f"{old}_{copy}".encode())
            out.append(line)
    out += [line for line, kind in zip(lines, kinds, strict=True) if kind == "result"]
    return out


def pipeline(lines: list[bytes]) -> int:
    """Parser → mapper → encode, as the session machine and shell do; returns frames made."""
    parser = ClaudeCodeParser()
    mapper = Mapper(FrameFactory(SESSION))
    mapper.begin_turn(TURN)
    feed, map_event, frames = parser.feed, mapper.map, 0
    for line in lines:
        for event in feed(line):
            if type(event) is ev.TurnEnded:
                out = mapper.end_turn(event.stop_reason, event)
            else:
                out = map_event(event)
            for frame in out:
                encode(frame)
            frames += len(out)
    return frames


def json_loads(lines: list[bytes]) -> int:
    loads = json.loads
    for line in lines:
        loads(line)
    return 0


def timed(fn, lines: list[bytes]) -> tuple[float, int]:
    t0 = time.process_time()
    result = fn(lines)
    return time.process_time() - t0, result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--fixture", default="thinking--partial")
    args = ap.parse_args()
    lines = transcript(args.fixture, args.lines)
    deltas = sum(b'_delta"' in line for line in lines)
    best_pipe = best_json = float("inf")
    frames = 0
    for _ in range(args.rounds):
        t, frames = timed(pipeline, lines)
        best_pipe = min(best_pipe, t)
        t, _ = timed(json_loads, lines)
        best_json = min(best_json, t)
    n = len(lines)
    print(
        f"transcript: {n:,} lines from {args.fixture} ({deltas:,} stream deltas), {frames:,} frames"
    )
    print(f"json.loads only:                  {n / best_json:12,.0f} lines/s")
    print(f"parser + mapper + encode:         {n / best_pipe:12,.0f} lines/s")
    print(f"ratio (pipeline / json.loads):    {best_json / best_pipe:.2f}x")


if __name__ == "__main__":
    main()
