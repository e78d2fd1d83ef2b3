"""A hostile agent that stops talking mid-turn: a minimal Claude Code stream-json agent (prompts on
stdin) that answers a prompt containing "hang" with the start of an answer and then nothing, ever
(it keeps running and ignores interrupts). Other prompts get a text answer and a result.

Each start appends its argv (JSON) to ``starts.jsonl`` in the working directory, so a test can see
how it was restarted. ``--resume ID`` keeps the session id; else it is "silent-1".
"""

from __future__ import annotations

import json
import sys
import time


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    with open("starts.jsonl", "a") as f:
        f.write(json.dumps(sys.argv[1:]) + "\n")
    args = sys.argv[1:]
    session_id = args[args.index("--resume") + 1] if "--resume" in args else "silent-1"
    emit({"type": "system", "subtype": "init", "session_id": session_id, "tools": []})
    for n, raw in enumerate(sys.stdin):
        msg = json.loads(raw)
        if msg.get("type") != "user":
            continue
        content = msg["message"]["content"]
        text = content if isinstance(content, str) else content[0].get("text", "")
        message = {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": f"About {text}"}],
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
        emit({"type": "assistant", "message": message, "session_id": session_id})
        if "hang" in text:
            while True:  # silent for good; stdin (interrupts included) is never read again
                time.sleep(60)
        emit(
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "stop_reason": "end_turn",
                "result": f"About {text}",
                "session_id": session_id,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }
        )


if __name__ == "__main__":
    main()
