"""A tiny stdio MCP server with one tool, ``echo``, for the real-agent rig.

Theory of operation: the agent CLI under test starts this script as an MCP server (stdio
transport: one JSON-RPC 2.0 message per line on stdin/stdout). It answers ``initialize``,
``tools/list`` and ``tools/call``; the one tool, ``echo``, returns its ``text`` argument
prefixed with ``echo: ``, so a fixture shows both the arguments the model chose and the
result the agent got back; with ``fail = true`` it reports a tool error (``isError``) instead. It uses only the standard library, so any Python the rig runs
with can start it, and it never writes anything but protocol messages to stdout.
"""

from __future__ import annotations

import json
import sys

# The protocol versions this server can speak; it answers with the client's own version
# when it knows it (the CLIs under test each pin a different one), else the newest.
KNOWN_VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")

ECHO_TOOL = {
    "name": "echo",
    "description": "Echoes the given text back, prefixed with 'echo: '.",
    "inputSchema": {
        "type": "object",
        "properties": {
            "text": {"type": "string", "description": "The text to echo."},
            "fail": {"type": "boolean", "description": "Report an error instead (for tests)."},
        },
        "required": ["text"],
    },
    # Read-only and closed-world: Codex runs such MCP tools without asking for approval
    # (exec has no one to ask), which is what a plain tool-call scenario needs.
    "annotations": {"readOnlyHint": True, "destructiveHint": False, "openWorldHint": False},
}


def handle(msg: dict) -> dict | None:
    """Returns the response to one JSON-RPC message, or None for a notification."""
    method = msg.get("method")
    if "id" not in msg:
        return None  # notifications (initialized, cancelled) need no answer
    if method == "initialize":
        asked = (msg.get("params") or {}).get("protocolVersion")
        result: dict = {
            "protocolVersion": asked if asked in KNOWN_VERSIONS else KNOWN_VERSIONS[0],
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "rig-echo", "version": "1.0.0"},
        }
    elif method == "tools/list":
        result = {"tools": [ECHO_TOOL]}
    elif method == "tools/call":
        params = msg.get("params") or {}
        if params.get("name") != "echo":
            return {
                "jsonrpc": "2.0",
                "id": msg["id"],
                "error": {"code": -32602, "message": f"unknown tool {params.get('name')!r}"},
            }
        args = params.get("arguments") or {}
        text = str(args.get("text", ""))
        if args.get("fail"):
            # A tool-level failure (isError), which MCP distinguishes from a protocol error.
            result = {
                "content": [{"type": "text", "text": f"echo failed: {text}"}],
                "isError": True,
            }
        else:
            result = {"content": [{"type": "text", "text": f"echo: {text}"}], "isError": False}
    elif method == "ping":
        result = {}
    elif method in ("resources/list", "prompts/list"):
        # Some clients ask although the capabilities do not offer them; an empty list is
        # quieter in their logs than an error.
        result = {"resources": []} if method == "resources/list" else {"prompts": []}
    elif method == "resources/templates/list":
        result = {"resourceTemplates": []}
    else:
        return {
            "jsonrpc": "2.0",
            "id": msg["id"],
            "error": {"code": -32601, "message": f"method not found: {method}"},
        }
    return {"jsonrpc": "2.0", "id": msg["id"], "result": result}


def main() -> None:
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        reply = handle(msg) if isinstance(msg, dict) else None
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
