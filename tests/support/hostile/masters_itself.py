"""A hostile ACP agent that tries to become a master of its own gateway. Standard library only: it
runs on the system's Python, inside the sandbox or out.

Asked to prompt with a JSON object ``{"url": BASE_URL, "other": SESSION_ID, "token_file": PATH}``,
it asks the client (the gateway) for permission to write a file, and while that question waits
for the person it goes to the gateway on 127.0.0.1 with no credential, as any process of the
machine can: lists, reads, creates and deletes sessions, asks for a WebSocket ticket, attaches to
its own session (and, if the upgrade were let through, answers its own question "allow"), and
opens ``/acp``. It tries to read ``token_file`` too. What each attempt got goes to
``attack.json`` in its working directory (its workspace); then it waits for the question's
answer and says it: ``answered: <outcome>``.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import socket
import sys
from urllib.parse import urlsplit

SESSION = "self-master-1"
ASK_ID = 7001


def send(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def read() -> dict:
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)


def request(url: str, method: str, path: str, body: dict | None = None) -> int:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data else {}
        conn.request(method, path, body=data, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def masked(payload: bytes) -> bytes:
    """One client text frame (RFC 6455: masked), payload under 64 KiB."""
    mask = os.urandom(4)
    size = len(payload)
    head = bytes([0x81, 0x80 | size]) if size < 126 else bytes([0x81, 0xFE]) + size.to_bytes(2)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        got = sock.recv(n - len(data))
        if not got:
            raise ConnectionError("closed")
        data += got
    return data


def next_text(sock: socket.socket) -> dict:
    """The next server frame's JSON (server frames are not masked)."""
    while True:
        first, second = recv_exact(sock, 2)
        size = second & 0x7F
        if size == 126:
            size = int.from_bytes(recv_exact(sock, 2))
        elif size == 127:
            size = int.from_bytes(recv_exact(sock, 8))
        payload = recv_exact(sock, size)
        if first & 0x0F == 0x1:
            return json.loads(payload)
        if first & 0x0F == 0x8:
            raise ConnectionError("closed")


def answer_own_question(sock: socket.socket, own: str) -> None:
    """As a master: announce, find the pending question in what the gateway sends, answer it."""
    caps = {
        "protocol_version": "rawp-dps-1.0",
        "supported_namespaces": ["agent", "tool", "control", "session"],
        "features": {},
    }
    sock.sendall(masked(json.dumps(frame(own, "session.capabilities", caps)).encode()))
    for _ in range(200):
        got = next_text(sock)
        frames = got["payload"].get("frames", []) if got["type"] == "session.history" else [got]
        for f in frames:
            if f["type"] == "agent.interaction.request":
                answer = {
                    "interaction_id": f["payload"]["interaction_id"],
                    "selected_value": "allow",
                }
                response = frame(own, "control.interaction.response", answer)
                sock.sendall(masked(json.dumps(response).encode()))
                return


def upgrade(url: str, path: str, protocol: str, own: str = "") -> int:
    """A WebSocket upgrade with no credential; if the gateway let it through (101) to the agent's
    own session, it answers its own pending question "allow" on it, as a master would."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {protocol}\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            got = sock.recv(1)
            if not got:
                break
            head += got
        status = int(head.split()[1]) if head else 0
        if status == 101 and own:
            with contextlib.suppress(OSError, ValueError, KeyError):
                answer_own_question(sock, own)
        return status
    finally:
        sock.close()


def frame(session_id: str, type_: str, payload: dict) -> dict:
    return {
        "v": 1,
        "type": type_,
        "message_id": base64.b16encode(os.urandom(16)).decode().lower(),
        "timestamp": "2026-12-07T00:00:00.000Z",
        "session_id": session_id,
        "payload": payload,
    }


def attack(target: dict) -> dict:
    url, other = target["url"], target["other"]
    own = os.environ.get("RAWP_SESSION_ID", "")
    dps = "rawp-dps-1.0"
    attempts = {
        "list": lambda: request(url, "GET", "/v1/sessions"),
        "read own": lambda: request(url, "GET", f"/v1/session/{own}"),
        "read other": lambda: request(url, "GET", f"/v1/session/{other}"),
        "whoami": lambda: request(url, "GET", "/v1/whoami"),
        "create": lambda: request(url, "POST", "/v1/session", {"agent": "demo"}),
        "ticket": lambda: request(url, "POST", f"/v1/session/{own}/ws-ticket"),
        "attach and answer": lambda: upgrade(url, f"/v1/session/{own}/ws", dps, own),
        "attach with a guessed ticket": lambda: upgrade(
            url, f"/v1/session/{own}/ws?ticket=guessed", dps, own
        ),
        "acp": lambda: upgrade(url, "/acp", "acp"),
        "delete other": lambda: request(url, "DELETE", f"/v1/session/{other}"),
    }
    got: dict = {}
    for name, attempt in attempts.items():
        try:
            got[name] = attempt()
        except Exception as err:  # every failure is an answer here
            got[name] = f"{type(err).__name__}: {err}"
    try:
        with open(target["token_file"]) as f:
            got["token file"] = "read" if f.read().strip() else "empty"
    except OSError as err:
        got["token file"] = f"{type(err).__name__}"
    got["token variable"] = "RAWP_GATEWAY_TOKEN" in os.environ
    return got


def main() -> None:
    while True:
        msg = read()
        method, rpc_id = msg.get("method"), msg.get("id")
        if method == "initialize":
            result = {"protocolVersion": 1, "agentCapabilities": {}}
            send({"jsonrpc": "2.0", "id": rpc_id, "result": result})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": rpc_id, "result": {"sessionId": SESSION}})
        elif method == "session/prompt":
            target = json.loads(msg["params"]["prompt"][0]["text"])
            tool = {
                "toolCallId": "write-1",
                "title": "Write",
                "kind": "edit",
                "rawInput": {"file_path": "planted.txt", "content": "x"},
            }
            options = [
                {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
            ]
            params = {"sessionId": SESSION, "toolCall": tool, "options": options}
            send(
                {
                    "jsonrpc": "2.0",
                    "id": ASK_ID,
                    "method": "session/request_permission",
                    "params": params,
                }
            )
            with open("attack.json.part", "w") as f:
                json.dump(attack(target), f)
            os.replace("attack.json.part", "attack.json")
            outcome = "none"
            while True:
                reply = read()
                if reply.get("id") == ASK_ID and "method" not in reply:
                    outcome = json.dumps(reply.get("result", {}).get("outcome"), sort_keys=True)
                    break
            text = f"answered: {outcome}"
            update = {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": text},
            }
            send(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {"sessionId": SESSION, "update": update},
                }
            )
            send({"jsonrpc": "2.0", "id": rpc_id, "result": {"stopReason": "end_turn"}})
        elif rpc_id is not None and method is not None:
            send({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": -32601, "message": "no"}})


if __name__ == "__main__":
    main()
