"""A synthetic Claude Code for the benches: prints stream-json lines at full speed, at a fixed rate,
or at the pace of a timed recording.

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

With ``RAWP_SYNTH_TRANSCRIPT`` naming a recording of the real CLI (a ``tests/fixtures/claude-code``
``*--partial.jsonl``), the lines of a burst are that recording's instead, replayed in a loop (its
``system`` and ``result`` lines left out, its message and tool ids made distinct per copy, its text
deltas stamped), so that the gateway parses what Claude Code really prints: long ``assistant`` and
``user`` lines, tool input streamed as JSON deltas, parallel calls.

A *timed* recording (``tests/fixtures/claude-code/working-session.jsonl``: its meta has when each
line came, ``stdout_times``, and when each prompt was written, ``stdin_times``) is replayed at its
recorded pace instead: each user message on stdin that is not a burst replays the recording's next
turn (the lines between one prompt and the next, ``system`` and ``result`` lines included), each
line written as long after the prompt's arrival as it came after the prompt in the recording, text
and thinking deltas stamped; after the last turn it starts again at the first, with ids of its own.

The agent must cost little next to the relay it drives (a hundred of them run beside the gateway in
``bench_fanout.py``): one API message is serialised once, at start, with slots for its number, each
line's uuid and the stamp; a burst fills the slots by bytes replacement (about 1 µs a line, where
``json.dumps`` per line took ten), and a stamped line is its two halves around the stamp. At a fixed
rate what remains is one sleep and one write(2) per line.
"""

from __future__ import annotations

import bisect
import json
import os
import random
import re
import sys
import time

SESSION = "5b1f6a2e-0c1d-4e8f-9a7b-3c2d1e0f9a8b"
# Slots in the serialised template, filled per burst: they cannot occur in anything else it holds.
N_SLOT, UUID_SLOT, TS_SLOT = "@@N@@", "@@UUID@@", "@@TS@@"
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
        "uuid": UUID_SLOT,
        "api_message_id": msg,
    }


def message_template() -> list[bytes]:
    """One API message, serialised with its slots: text deltas, then a Read call and its result."""
    msg, call = f"msg_bench_{N_SLOT}", f"toolu_bench_{N_SLOT}"
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
        out.append(_line(_event({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": TS_SLOT + text}}, msg)))  # fmt: skip
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
                "uuid": UUID_SLOT,
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
                "uuid": UUID_SLOT,
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


def _end_lines() -> list[bytes]:
    msg = "msg_bench_end"
    return [
        _line(_event({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}, msg)),
        _line(_event({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": TS_SLOT + "END-OF-BURST"}}, msg)),
        _line(_event({"type": "content_block_stop", "index": 0}, msg)),
        _line({"type": "result", "subtype": "success", "is_error": False,
            "stop_reason": "end_turn", "session_id": SESSION, "result": "done", "num_turns": 1,
            "usage": {"input_tokens": 100, "output_tokens": 20}}),
    ]  # fmt: skip


def _templated(recorded: list[bytes], keep: tuple[str, ...] | None = None) -> list[bytes]:
    """Recorded lines (those whose type is in ``keep``; all when None) as a template: every id of a
    message or a tool call gets the copy's number, every line a uuid slot, every text or thinking
    delta a stamp slot."""
    lines = []
    for raw in recorded:
        obj = json.loads(raw)
        if keep is not None and obj.get("type") not in keep:
            continue
        if "uuid" in obj:
            obj["uuid"] = UUID_SLOT
        obj["session_id"] = SESSION
        delta = obj.get("event", {}).get("delta", {})
        if delta.get("type") == "text_delta":
            delta["text"] = TS_SLOT + delta["text"]
        elif delta.get("type") == "thinking_delta":
            delta["thinking"] = TS_SLOT + delta["thinking"]
        lines.append(_line(obj))
    ids = set(re.findall(rb'"((?:msg|toolu|req)_[A-Za-z0-9_]+)"', b"\n".join(lines)))
    out = []
    for line in lines:
        for old in ids:
            line = line.replace(b'"%s"' % old, b'"%s_%s"' % (old, N_SLOT.encode()))
        out.append(line)
    return out


def transcript_template(path: str) -> list[bytes]:
    """A recording's API messages and tool results (its ``system`` and ``result`` lines left out)
    as a template for bursts."""
    with open(path, "rb") as f:
        return _templated(f.read().splitlines(), ("stream_event", "assistant", "user"))


def recorded_turns(path: str) -> list[list[tuple[int, bytes]]] | None:
    """A timed recording (its meta has ``stdout_times`` and ``stdin_times``, see
    ``tests/support/rig/record.py``) as turns: each prompt's lines, every line of it as a template with the
    nanoseconds it came after the prompt was written. None when the recording has no timing."""
    meta_path = path.removesuffix(".jsonl") + ".meta.json"
    try:
        with open(meta_path, "rb") as f:
            meta = json.load(f)
    except FileNotFoundError:
        return None
    times, prompts = meta.get("stdout_times"), meta.get("stdin_times")
    if not times or not prompts:
        return None
    with open(path, "rb") as f:
        lines = _templated(f.read().splitlines())
    turns: list[list[tuple[int, bytes]]] = [[] for _ in prompts]
    for t, line in zip(times, lines, strict=True):
        k = max(0, bisect.bisect_right(prompts, t) - 1)
        turns[k].append((int((t - prompts[k]) * 1e9), line))
    return turns


def burst(n_lines: int) -> list[bytes | tuple[bytes, bytes]]:
    """``n_lines`` lines of API messages, then the end marker and a ``result``; each line ends with
    its newline, a stamped one is the bytes before and after its stamp."""
    recording = os.environ.get("RAWP_SYNTH_TRANSCRIPT")
    template = transcript_template(recording) if recording else message_template()
    n_slot = N_SLOT.encode()
    lines: list[bytes] = []
    k = 0
    while len(lines) < n_lines:
        number = str(k).encode()
        lines += [line.replace(n_slot, number) for line in template]
        k += 1
    del lines[n_lines:]
    lines += _end_lines()
    out: list[bytes | tuple[bytes, bytes]] = []
    for serial, line in enumerate(lines):
        out.append(_filled(line, serial))
    return out


def _filled(line: bytes, serial: int) -> bytes | tuple[bytes, bytes]:
    """A template line with its uuid slot filled and its newline: a stamped one is the bytes
    before and after its stamp."""
    # A distinct uuid per line, shaped as a version 4 one (Claude Code's are random).
    line = line.replace(UUID_SLOT.encode(), b"00000000-0000-4000-8000-%012x" % serial) + b"\n"
    before, stamp, after = line.partition(TS_SLOT.encode())
    return (before, after) if stamp else line


def _write(fd: int, line: bytes | tuple[bytes, bytes]) -> None:
    """One write(2) per line, as Node's stdout does for Claude Code; a stamped line gets the time
    of this write."""
    if line.__class__ is bytes:
        os.write(fd, line)  # type: ignore[arg-type]
    else:
        os.write(fd, b"%s@T%d;%s" % (line[0], time.monotonic_ns(), line[1]))


def replay_turn(turn: list[tuple[int, bytes]], number: int) -> None:
    """One recorded turn, each line when it came after its prompt in the recording; ``number``
    (this replay's count) makes its ids and uuids its own."""
    start = time.monotonic_ns()
    n = str(number).encode()
    lines = [
        (offset, _filled(line.replace(N_SLOT.encode(), n), number << 16 | serial))
        for serial, (offset, line) in enumerate(turn)
    ]
    fd = sys.stdout.fileno()
    for offset, line in lines:
        wait = start + offset - time.monotonic_ns()
        if wait > 0:
            time.sleep(wait / 1e9)
        _write(fd, line)


def run(n_lines: int, rate: float) -> None:
    lines = burst(n_lines)
    fd = sys.stdout.fileno()
    if rate <= 0:
        out = sys.stdout.buffer
        blob = b"".join(ln if isinstance(ln, bytes) else ln[0] + ln[1] for ln in lines)
        for i in range(0, len(blob), 1 << 20):
            out.write(blob[i : i + (1 << 20)])
        out.flush()
        return
    clock, sleep = time.monotonic_ns, time.sleep
    step = 1e9 / rate
    # Agents asked at the same moment (bench_fanout's sessions) would otherwise write in lockstep,
    # every line of every session at once; independent sessions have independent phases.
    start = clock() + random.random() * step
    for i, ln in enumerate(lines):
        wait = start + i * step - clock()
        if wait > 0:
            sleep(wait / 1e9)  # late lines (a sleep overshoots) go out at once, one write each
        _write(fd, ln)


def main() -> None:
    recording = os.environ.get("RAWP_SYNTH_TRANSCRIPT")
    turns = recorded_turns(recording) if recording else None
    if not turns:  # a timed recording has its own init lines, in its turns
        print(_line({"type": "system", "subtype": "init", "session_id": SESSION, "tools": ["Read"],
            "model": "claude-opus-5-5", "cwd": "/workspace"}).decode(), flush=True)  # fmt: skip
    replayed = 0
    for raw in sys.stdin:
        m = re.search(r"BURST (\d+) (\d+)", raw)
        if m:
            run(int(m.group(1)), float(m.group(2)))
        elif turns and '"type":"user"' in raw.replace(" ", ""):
            replay_turn(turns[replayed % len(turns)], replayed)
            replayed += 1


if __name__ == "__main__":
    main()
