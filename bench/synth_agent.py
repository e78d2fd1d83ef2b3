"""A synthetic Claude Code for the benches: prints stream-json lines at full speed or at a fixed rate.

Theory of operation
-------------------
It reads its stdin line by line. Each line that contains ``BURST <lines> <rate>`` (a stream-json
prompt from the gateway, or a bare WebSocket message relayed by websocketd) starts one burst of
``<lines>`` lines shaped like Claude Code 2.1's ``--include-partial-messages`` output: API messages
of text deltas, a Read tool call and its result (about 30 lines a message, nine in ten of them
text deltas, as in a real streamed answer), then an ``END-OF-BURST`` text delta and a ``result``.

``<rate>`` 0 writes the whole burst at once (built first, written in 1 MiB blocks, so the agent is
never what limits the relay). Any other rate writes each line with a write(2) of its own when it is
due (as Claude Code's Node.js stdout does), each text delta
stamped ``@T<CLOCK_MONOTONIC ns>;`` at the moment it is written, so that a master can measure the
latency from the agent's write to its own receive (the clock is shared by all processes of the
machine).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid

SESSION = "5b1f6a2e-0c1d-4e8f-9a7b-3c2d1e0f9a8b"
DELTAS_PER_MESSAGE = 26
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "while",
    "the",
    "gateway",
    "relays",
    "every",
    "line",
]


def _line(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _event(event: dict, msg: str) -> dict:
    return {
        "type": "stream_event",
        "event": event,
        "session_id": SESSION,
        "parent_tool_use_id": None,
        "uuid": str(uuid.uuid4()),
        "api_message_id": msg,
    }


def message(n: int) -> list[bytes | str]:
    """One API message: text deltas (str templates with a ``{ts}`` slot), then a Read call and its
    result (bytes)."""
    msg, call = f"msg_bench_{n}", f"toolu_bench_{n}"
    out: list[bytes | str] = [
        _line(
            _event(
                {
                    "type": "message_start",
                    "message": {
                        "id": msg,
                        "type": "message",
                        "role": "assistant",
                        "model": "claude-opus-5-5",
                        "content": [],
                        "usage": {"input_tokens": 100, "output_tokens": 1},
                    },
                },
                msg,
            )
        ),
        _line(
            _event(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
                msg,
            )
        ),
    ]
    words = []
    for i in range(DELTAS_PER_MESSAGE):
        text = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(3)) + " "
        words.append(text)
        template = _line(_event({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "@@TS@@" + text}}, msg)).decode()  # fmt: skip
        out.append(template.replace("{", "{{").replace("}", "}}").replace("@@TS@@", "{ts}"))
    out.append(_line(_event({"type": "content_block_stop", "index": 0}, msg)))
    path = "/workspace/notes.txt"
    content = "".join(f"line {k} of the file that the agent read\n" for k in range(20))
    out += [
        _line(
            _event(
                {
                    "type": "content_block_start",
                    "index": 1,
                    "content_block": {"type": "tool_use", "id": call, "name": "Read", "input": {}},
                },
                msg,
            )
        ),
        _line(
            {
                "type": "assistant",
                "message": {
                    "id": msg,
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-opus-5-5",
                    "content": [
                        {"type": "text", "text": "".join(words)},
                        {
                            "type": "tool_use",
                            "id": call,
                            "name": "Read",
                            "input": {"file_path": path},
                        },
                    ],
                    "stop_reason": None,
                    "usage": {"input_tokens": 100, "output_tokens": 1},
                },
                "parent_tool_use_id": None,
                "session_id": SESSION,
                "uuid": str(uuid.uuid4()),
            }
        ),
        _line(_event({"type": "content_block_stop", "index": 1}, msg)),
        _line(
            _event(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "tool_use"},
                    "usage": {"output_tokens": 20},
                },
                msg,
            )
        ),
        _line(_event({"type": "message_stop"}, msg)),
        _line(
            {
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [{"tool_use_id": call, "type": "tool_result", "content": content}],
                },
                "parent_tool_use_id": None,
                "session_id": SESSION,
                "uuid": str(uuid.uuid4()),
                "tool_use_result": {
                    "type": "text",
                    "file": {
                        "filePath": path,
                        "content": content,
                        "numLines": 20,
                        "startLine": 1,
                        "totalLines": 20,
                    },
                },
            }
        ),
    ]
    return out


def burst(n_lines: int) -> list[bytes | str]:
    out: list[bytes | str] = []
    k = 0
    while len(out) < n_lines:
        out += message(k)
        k += 1
    del out[n_lines:]
    msg = "msg_bench_end"
    out.append(_line(_event({"type": "content_block_start", "index": 0,
        "content_block": {"type": "text", "text": ""}}, msg)))  # fmt: skip
    end = _line(_event({"type": "content_block_delta", "index": 0,
        "delta": {"type": "text_delta", "text": "@@TS@@END-OF-BURST"}}, msg)).decode()  # fmt: skip
    out.append(end.replace("{", "{{").replace("}", "}}").replace("@@TS@@", "{ts}"))
    out.append(_line(_event({"type": "content_block_stop", "index": 0}, msg)))
    out.append(_line({"type": "result", "subtype": "success", "is_error": False,
        "stop_reason": "end_turn", "session_id": SESSION, "result": "done", "num_turns": 1,
        "usage": {"input_tokens": 100, "output_tokens": 20}}))  # fmt: skip
    return out


def run(n_lines: int, rate: float) -> None:
    out = sys.stdout.buffer
    lines = burst(n_lines)
    if rate <= 0:
        blob = b"".join((ln if isinstance(ln, bytes) else ln.format(ts="").encode()) + b"\n"
                        for ln in lines)  # fmt: skip
        for i in range(0, len(blob), 1 << 20):
            out.write(blob[i : i + (1 << 20)])
        out.flush()
        return
    clock = time.monotonic_ns
    start = clock()
    step = 1e9 / rate
    fd = out.fileno()  # one write(2) per line, as Node's stdout does for Claude Code
    for i, ln in enumerate(lines):
        wait = (start + i * step - clock()) / 1e9
        if wait > 0:
            time.sleep(wait)  # late lines (a sleep overshoots) go out at once, one write each
        os.write(
            fd, (ln if isinstance(ln, bytes) else ln.format(ts=f"@T{clock()};").encode()) + b"\n"
        )


def main() -> None:
    print(_line({"type": "system", "subtype": "init", "session_id": SESSION, "tools": ["Read"],
        "model": "claude-opus-5-5", "cwd": "/workspace"}).decode(), flush=True)  # fmt: skip
    for raw in sys.stdin:
        m = re.search(r"BURST (\d+) (\d+)", raw)
        if m:
            run(int(m.group(1)), float(m.group(2)))


if __name__ == "__main__":
    main()
