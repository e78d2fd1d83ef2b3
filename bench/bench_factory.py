"""Frames per second for "decode an agent line, build a frame, encode it", with the gateway's
FrameFactory against a naive envelope (``str(uuid.uuid4())``, ``datetime.isoformat()``), both measured
in the same run so the ratio holds on a noisy machine.

    .venv/bin/python bench/bench_factory.py [--seconds 2]
"""

from __future__ import annotations

import argparse
import datetime
import time
import uuid

import msgspec

from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.factory import FrameFactory

SESSION = "0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a"
LINE = (
    b'{"type":"stream_event","event":{"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"Hello, world"}},"session_id":"s","uuid":"u"}'
)


class _Delta(msgspec.Struct):
    text: str


class _Event(msgspec.Struct):
    index: int
    delta: _Delta


class _Line(msgspec.Struct):
    event: _Event


decode_line = msgspec.json.Decoder(_Line).decode


def naive_frame(payload: F.Payload) -> F.Frame:
    return F.frame_class(payload)(
        v=1,
        message_id=str(uuid.uuid4()),
        timestamp=datetime.datetime.now(datetime.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z"),
        session_id=SESSION,
        turn_id="t",
        payload=payload,
    )


def run(make, seconds: float) -> float:
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            line = decode_line(LINE)
            codec.encode(
                make(F.TextDelta(content_index=line.event.index, text=line.event.delta.text))
            )
        n += 1000
    return n / seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    factory = FrameFactory(SESSION)

    def ours(payload):
        return factory.frame(payload, turn_id="t")

    # Interleave the two so drift in machine load hits both alike.
    base, fast = [], []
    for _ in range(3):
        base.append(run(naive_frame, args.seconds / 3))
        fast.append(run(ours, args.seconds / 3))
    b, f = max(base), max(fast)
    print(f"naive uuid4()/isoformat(): {b:12,.0f} frames/s")
    print(f"FrameFactory:              {f:12,.0f} frames/s")
    print(f"ratio: {f / b:.2f}x")


if __name__ == "__main__":
    main()
