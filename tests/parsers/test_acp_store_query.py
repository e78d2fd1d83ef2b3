"""``parsers.acp.StoreQuery`` on its own (sans-IO): the lines the real agents write when they are
asked ``session/list`` and ``session/load`` (claude-agent-acp 0.23.1, codex-acp 0.16.0, Gemini CLI
0.61.0, as observed against the rig), and what each becomes."""

from __future__ import annotations

import json
from typing import Any

from parsers import events as ev
from parsers.acp import StoreQuery
from parsers.acp.store_query import REPLAY_BYTES

WORKSPACE = "/tmp/rig/workspace"


def line(message: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **message}).encode()


def update(kind: str, text: str) -> bytes:
    body = {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
    return line({"method": "session/update", "params": {"sessionId": "s", "update": body}})


def sent(data: bytes) -> dict[str, Any]:
    return json.loads(data)


def initialized(query: StoreQuery, caps: dict[str, Any]) -> dict[str, Any]:
    assert sent(query.opening())["method"] == "initialize"
    out = query.feed(line({"id": 0, "result": {"protocolVersion": 1, "agentCapabilities": caps}}))
    return sent(out) if out else {}


def test_claude_replay_is_one_turn_without_its_local_command_records() -> None:
    query = StoreQuery(WORKSPACE, load="s")
    load = initialized(query, {"loadSession": True})
    assert load["method"] == "session/load"
    assert load["params"] == {"sessionId": "s", "cwd": WORKSPACE, "mcpServers": []}
    for data in (
        update("user_message_chunk", "<command-name>/model</command-name>"),
        update("user_message_chunk", "<local-command-stdout>Set model</local-command-stdout>"),
        update("user_message_chunk", "Remember the number 42."),
        update("agent_message_chunk", "I will remember 42."),
        update("user_message_chunk", "And 7."),
        update("agent_message_chunk", "Noted."),
    ):
        assert query.feed(data) == b""
    query.feed(line({"id": 1, "result": {"modes": None}}))
    assert query.settling and not query.done
    query.finish()
    assert query.done and query.failure is None and query.transcript is not None
    turns = query.transcript.turns
    assert [t.prompt for t in turns] == ["Remember the number 42.", "And 7."]
    texts = ["".join(e.text for e in t.events if isinstance(e, ev.TextDelta)) for t in turns]
    assert texts == ["I will remember 42.", "Noted."]
    assert all(isinstance(t.events[-1], ev.TurnEnded) for t in turns)
    assert not query.transcript.partial


def test_gemini_replays_after_its_answer_and_its_context_is_no_prompt() -> None:
    query = StoreQuery(WORKSPACE, load="g")
    initialized(query, {"loadSession": True})
    query.feed(update("user_message_chunk", "<session_context>\nThis is the Gemini CLI."))
    query.feed(line({"id": 1, "result": {"modes": None}}))
    query.feed(update("user_message_chunk", "Remember the number 42."))
    query.feed(update("agent_message_chunk", "I will remember 42."))
    query.finish()
    assert query.transcript is not None
    (turn,) = query.transcript.turns
    assert turn.prompt == "Remember the number 42."


def test_unknown_sessions_as_each_agent_says_it() -> None:
    claude = {"code": -32002, "message": "Resource not found: x", "data": {"uri": "x"}}
    gemini = {
        "code": -32603,
        "message": "Internal error",
        "data": {"details": 'Invalid session identifier "x".\n  Searched for sessions in ...'},
    }
    for error in (claude, {"code": -32002, "message": "Resource not found"}, gemini):
        query = StoreQuery(WORKSPACE, load="x")
        initialized(query, {"loadSession": True})
        query.feed(line({"id": 1, "error": error}))
        assert query.done and query.failure is not None
        assert query.failure[0] == "not_found", error
    assert "Invalid session identifier" in query.failure[1]  # Gemini's details are said
    query = StoreQuery(WORKSPACE, load="x")
    initialized(query, {"loadSession": True})
    query.feed(line({"id": 1, "error": {"code": -32603, "message": "Query closed"}}))
    assert query.failure == ("agent", "the agent refused session/load: Query closed")


def test_without_the_capability_nothing_is_asked() -> None:
    query = StoreQuery(WORKSPACE)
    assert initialized(query, {"loadSession": True}) == {}  # Gemini: no sessionCapabilities
    assert query.failure is not None and query.failure[0] == "unsupported"
    query = StoreQuery(WORKSPACE, load="x")
    assert initialized(query, {"sessionCapabilities": {"list": {}}}) == {}
    assert query.failure is not None and query.failure[0] == "unsupported"


def test_list_pages_sorted_newest_first_and_bounded() -> None:
    query = StoreQuery(WORKSPACE, limit=2)
    asked = initialized(query, {"sessionCapabilities": {"list": {}}})
    assert asked["params"] == {"cwd": WORKSPACE}
    page = {
        "sessions": [
            {"sessionId": "a", "cwd": WORKSPACE, "updatedAt": "2026-12-01T21:53:35.770+00:00"},
            {"sessionId": "b", "cwd": WORKSPACE + "/", "title": "B", "updatedAt": "bad"},
        ],
        "nextCursor": "c1",
    }
    asked = sent(query.feed(line({"id": asked["id"], "result": page})))
    assert asked["params"] == {"cwd": WORKSPACE, "cursor": "c1"}
    page = {
        "sessions": [
            {"sessionId": "c", "cwd": WORKSPACE, "updatedAt": "2026-12-01T21:53:00.143Z"},
            {"sessionId": "d", "cwd": "/elsewhere", "updatedAt": "2027-01-01T00:00:00Z"},
        ]
    }
    assert query.feed(line({"id": asked["id"], "result": page})) == b""
    assert query.done
    assert [(s.id, s.updated_at) for s in query.listed] == [
        ("a", "2026-12-01T21:53:35Z"),
        ("c", "2026-12-01T21:53:00Z"),
    ]
    assert query.complete is False  # "b" was cut by the limit


def test_a_replay_past_its_bound_is_partial() -> None:
    query = StoreQuery(WORKSPACE, load="s")
    initialized(query, {"loadSession": True})
    query.feed(update("user_message_chunk", "Big."))
    query.feed(update("agent_message_chunk", "x" * (REPLAY_BYTES // 2)))
    query.feed(update("agent_message_chunk", "y" * (REPLAY_BYTES // 2)))
    query.feed(update("agent_message_chunk", "z"))
    query.feed(line({"id": 1, "result": None}))
    query.finish()
    assert query.transcript is not None and query.transcript.partial
    assert "could not be shown" in (query.transcript.problem or "")


def test_requests_of_the_agent_are_answered_and_garbage_ends_it() -> None:
    query = StoreQuery(WORKSPACE, load="s")
    initialized(query, {"loadSession": True})
    ask = line({"id": 9, "method": "session/request_permission", "params": {"sessionId": "s"}})
    assert sent(query.feed(ask))["result"] == {"outcome": {"outcome": "cancelled"}}
    ask = line({"id": 10, "method": "fs/read_text_file", "params": {"path": "/etc/passwd"}})
    assert sent(query.feed(ask))["error"]["code"] == -32601
    for _ in range(11):
        query.feed(b"not json")
    assert query.failure == ("agent", "the agent writes lines that are not JSON-RPC")
