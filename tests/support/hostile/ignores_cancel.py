"""A hostile agent that ignores every way a cancel asks it to stop but the last: a minimal Claude
Code stream-json agent (prompts on stdin) that answers a prompt containing "long" with the start of
an answer and then nothing. It goes on reading stdin, takes no notice of an interrupt request,
ignores SIGINT, and exits on SIGTERM. Other prompts get an answer and a result. ``--resume ID``
keeps the session id; else it is "stubborn-1".

What reaches it is appended to ``cancel.log`` in the working directory, one line each: ``start
<argv as JSON>`` when it starts, ``stdin <type> <subtype>`` for every stdin line, ``SIGINT``,
``SIGTERM``; so a test sees each step of the escalation, its order, and how it was started again.
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
    args = sys.argv[1:]
    note(f"start {json.dumps(args)}")
    session_id = args[args.index("--resume") + 1] if "--resume" in args else "stubborn-1"
    emit({"type": "system", "subtype": "init", "session_id": session_id, "tools": []})
    for n, raw in enumerate(sys.stdin):
        msg = json.loads(raw)
        request = msg.get("request") or {}
        note(f"stdin {msg.get('type')} {request.get('subtype', '')}".rstrip())
        if msg.get("type") != "user":
            continue
        content = msg["message"]["content"]
        text = content if isinstance(content, str) else content[0].get("text", "")
        answer = "Once upon a time" if "long" in text else "Done."
        message = {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": answer}],
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
        emit({"type": "assistant", "message": message, "session_id": session_id})
        if "long" not in text:
            result = {"type": "result", "subtype": "success", "is_error": False, "result": "Done."}
            emit({**result, "stop_reason": "end_turn", "session_id": session_id})


if __name__ == "__main__":
    main()
