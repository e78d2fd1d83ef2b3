"""A hostile agent that ignores every way a cancel asks it to stop but the last: a minimal Claude
Code stream-json agent (prompts on stdin) that answers a prompt with the start of an answer and
then nothing. It goes on reading stdin, takes no notice of an interrupt request, ignores SIGINT,
and exits on SIGTERM.

What reaches it is appended to ``cancel.log`` in the working directory, one line each: ``stdin
<type> <subtype>`` for every stdin line, ``SIGINT``, ``SIGTERM``; so a test sees each step of the
escalation and its order.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def note(what: str) -> None:
    with open("cancel.log", "a") as f:
        f.write(what + "\n")


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def on_sigterm(signum: int, frame: object) -> None:
    note("SIGTERM")
    os._exit(143)


def main() -> None:
    signal.signal(signal.SIGINT, lambda signum, frame: note("SIGINT"))
    signal.signal(signal.SIGTERM, on_sigterm)
    emit({"type": "system", "subtype": "init", "session_id": "stubborn-1", "tools": []})
    for n, raw in enumerate(sys.stdin):
        msg = json.loads(raw)
        request = msg.get("request") or {}
        note(f"stdin {msg.get('type')} {request.get('subtype', '')}".rstrip())
        if msg.get("type") == "user":
            message = {
                "id": f"msg_{n}",
                "type": "message",
                "role": "assistant",
                "content": [{"type": "text", "text": "Once upon a time"}],
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }
            emit({"type": "assistant", "message": message, "session_id": "stubborn-1"})


if __name__ == "__main__":
    main()
