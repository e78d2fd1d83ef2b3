"""A hostile ACP agent: it speaks the Agent Client Protocol (JSON-RPC over stdio) well enough to
start a session, and misbehaves in the way a prompt's text names:

* ``stray``: answers a request id the client never sent, then ends the turn;
* ``unknown``: asks the client ``x/unknown`` and ``fs/read_text_file``, and says what came back;
* ``flood``: 20,000 message chunks as fast as it can, then ends the turn;
* ``garbage``: lines that are not JSON, then ends the turn;
* ``huge``: one 5 MiB message chunk, then ends the turn;
* ``hang``: never answers the prompt (nor a cancel).

Anything else gets "ok: <prompt>". It declares ``loadSession`` and answers ``session/load`` (after
replaying a user message "before" and an agent message "replayed"), so a restart resumes the same
session (``session/load`` of ``unknown`` is ACP's -32002 "Resource not found", as the real agents
answer an id they do not know; of ``hang``, never answered). Each start appends ``start`` to
``acp-starts.log`` in its cwd, and each session it opens ``new`` or ``load <id>``.

With ``HOSTILE_ACP_LIST`` set it declares ``sessionCapabilities.list`` and answers ``session/list``
so: ``ok`` (two sessions of its cwd, one of elsewhere, over two pages), ``hang`` (never),
``garbage`` (lines that are not JSON, then an answer of the wrong shape), ``huge`` (an answer of
9 MiB), ``endless`` (always one more page), ``exit`` (it ends without an answer).
"""

from __future__ import annotations

import json
import os
import sys
import time

SESSION = "hostile-1"
LISTS = os.environ.get("HOSTILE_ACP_LIST", "")


def send(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def chunk(text: str, kind: str = "agent_message_chunk") -> None:
    """A ``session/update`` of text: the agent's (or with ``kind`` the user's) message chunk."""
    update = {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
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
            caps: dict = {"loadSession": True}
            if LISTS:
                caps["sessionCapabilities"] = {"list": {}}
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
        elif method == "session/list":
            session_list(rpc_id, msg["params"])
        elif method == "session/load" and msg["params"]["sessionId"] == "hang":
            while True:
                time.sleep(60)
        elif method == "session/load" and msg["params"]["sessionId"] == "unknown":
            error = {"code": -32002, "message": "Resource not found: unknown"}
            send({"jsonrpc": "2.0", "id": rpc_id, "error": error})
        elif method == "session/load":
            note(f"load {msg['params']['sessionId']}")
            chunk("before", "user_message_chunk")
            chunk("replayed")
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


def session_list(rpc_id: int, params: dict) -> None:
    cwd = params.get("cwd") or os.getcwd()
    if LISTS == "hang":
        while True:
            time.sleep(60)
    if LISTS == "exit":
        sys.exit(3)
    if LISTS == "garbage":
        sys.stdout.write('not JSON at all\n{"jsonrpc": "2.0", "id": \n')
        send({"jsonrpc": "2.0", "id": rpc_id, "result": {"sessions": "none"}})
        return
    if LISTS == "huge":
        info = {"sessionId": "x" * 1000, "cwd": cwd, "title": "t" * 8000}
        send({"jsonrpc": "2.0", "id": rpc_id, "result": {"sessions": [info] * 1000}})
        return
    if LISTS == "endless":
        page = {"sessions": [], "nextCursor": "more"}
        send({"jsonrpc": "2.0", "id": rpc_id, "result": page})
        return
    if params.get("cursor") != "page-2":
        older = {
            "sessionId": "older",
            "cwd": cwd,
            "title": "Older",
            "updatedAt": "2026-01-02T03:04:05Z",
        }
        elsewhere = {"sessionId": "elsewhere", "cwd": "/elsewhere", "title": "Not here"}
        page = {"sessions": [older, elsewhere], "nextCursor": "page-2"}
    else:
        newer = {
            "sessionId": SESSION,
            "cwd": cwd,
            "title": "Newer\nsecond line",
            "updatedAt": "2026-02-03T04:05:06.789+00:00",
        }
        page = {"sessions": [newer]}
    send({"jsonrpc": "2.0", "id": rpc_id, "result": page})


if __name__ == "__main__":
    main()
