"""A hostile agent for the tests: speaks Claude Code's stream-json, and answers a prompt that says
``long line <MB>`` with a Read call whose result line is <MB> megabytes long, written 1 MiB at a time
(so this process never holds it), then a short text answer and a ``result``. Any other prompt gets
the short answer only; control requests get no answer."""

import json
import re
import sys

SESSION = "7d3c1f0e-2b4a-4c6d-8e9f-0a1b2c3d4e5f"
out = sys.stdout.buffer


def emit(obj: dict) -> None:
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()


def answer(text: str) -> None:
    emit({"type": "assistant", "session_id": SESSION, "parent_tool_use_id": None,
          "message": {"id": "msg_2", "role": "assistant", "content": [{"type": "text", "text": text}]}})  # fmt: skip
    emit({"type": "result", "subtype": "success", "is_error": False, "stop_reason": "end_turn",
          "session_id": SESSION, "result": text, "usage": {"input_tokens": 1, "output_tokens": 1}})  # fmt: skip


emit({"type": "system", "subtype": "init", "session_id": SESSION, "tools": ["Read"]})
for raw in sys.stdin:
    if json.loads(raw).get("type") != "user":
        continue  # control requests (the gateway's initialize) get no answer: this agent has none
    wanted = re.search(r"long line (\d+)", raw)
    if wanted:
        emit({"type": "assistant", "session_id": SESSION, "parent_tool_use_id": None,
              "message": {"id": "msg_1", "role": "assistant", "content": [{"type": "tool_use",
              "id": "toolu_1", "name": "Read", "input": {"file_path": "big.txt"}}]}})  # fmt: skip
        head = json.dumps({"type": "user", "session_id": SESSION, "message": {"role": "user",
            "content": [{"tool_use_id": "toolu_1", "type": "tool_result", "content": "@"}]}})  # fmt: skip
        before, after = head.encode().split(b"@")
        out.write(before)
        chunk = b"x" * (1 << 20)
        for _ in range(int(wanted.group(1))):
            out.write(chunk)
        out.write(after + b"\n")
        out.flush()
    answer("done")
