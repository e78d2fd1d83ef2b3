"""A hostile ACP agent: it speaks the Agent Client Protocol (JSON-RPC over stdio) well enough to
start a session, and misbehaves in the way a prompt's text names:

* ``stray``: answers a request id the client never sent, then ends the turn;
* ``unknown``: asks the client ``x/unknown`` and ``fs/read_text_file``, and says what came back;
* ``flood``: 20,000 message chunks as fast as it can, then ends the turn;
* ``garbage``: lines that are not JSON, then ends the turn;
* ``huge``: one 5 MiB message chunk, then ends the turn;
* ``hang``: never answers the prompt (nor a cancel).

Anything else gets "ok: <prompt>". It declares ``loadSession`` and answers ``session/load``, so a
restart resumes the same session. Each start appends ``start`` to ``acp-starts.log`` in its cwd,
and each session it opens ``new`` or ``load <id>``.
"""

from __future__ import annotations

import json
import sys
import time

SESSION = "hostile-1"


def send(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def chunk(text: str) -> None:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    send(
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": SESSION, "update": update},
        }
    )


def read() -> dict:
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)


def note(what: str) -> None:
    with open("acp-starts.log", "a") as f:
        f.write(what + "\n")


def main() -> None:
    note("start")
    asked = 1000
    while True:
        msg = read()
        method, rpc_id = msg.get("method"), msg.get("id")
        if method == "initialize":
            caps = {"loadSession": True}
            send(
                {
                    "jsonrpc": "2.0",
                    "id": rpc_id,
                    "result": {"protocolVersion": 1, "agentCapabilities": caps},
                }
            )
        elif method == "session/new":
            note("new")
            send({"jsonrpc": "2.0", "id": rpc_id, "result": {"sessionId": SESSION}})
        elif method == "session/load":
            note(f"load {msg['params']['sessionId']}")
            update = {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "replayed"},
            }
            send(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {"sessionId": SESSION, "update": update},
                }
            )
            send({"jsonrpc": "2.0", "id": rpc_id, "result": None})
        elif method == "session/prompt":
            text = msg["params"]["prompt"][0]["text"]
            if "hang" in text:
                chunk("thinking about it")
                while True:
                    time.sleep(60)
            if "stray" in text:
                send({"jsonrpc": "2.0", "id": 987654, "result": {"stopReason": "end_turn"}})
            elif "unknown" in text:
                answers = []
                for asked_method in ("x/unknown", "fs/read_text_file"):
                    asked += 1
                    params = {"sessionId": SESSION, "path": "/etc/passwd"}
                    send({"jsonrpc": "2.0", "id": asked, "method": asked_method, "params": params})
                    answers.append(read().get("error", {}).get("code"))
                chunk(f"answers: {answers}")
            elif "flood" in text:
                for _ in range(20000):
                    chunk("x")
            elif "garbage" in text:
                sys.stdout.write("this is not JSON\n\x00\x01 binary junk\n[1, 2\n")
                sys.stdout.flush()
            elif "huge" in text:
                chunk("y" * (5 << 20))
            else:
                chunk(f"ok: {text}")
            send({"jsonrpc": "2.0", "id": rpc_id, "result": {"stopReason": "end_turn"}})
        elif rpc_id is not None and method is not None:
            send({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": -32601, "message": "no"}})


if __name__ == "__main__":
    main()
