"""The saved-conversation readers on their own (``parsers/*/saved.py``, sans-IO: bytes in, a
summary or events out), for the rules their docstrings state. The shapes themselves come from the
real CLIs: ``test_conversations_realcli.py``."""

from __future__ import annotations

import hashlib
import json

from parsers import events as ev
from parsers.base import get
from parsers.claude_code.saved import slug
from parsers.gemini.saved import project_slug
from parsers.saved import MAX_TITLE_CHARS, SavedFile, head_lines, lines_of, title_of


def jsonl(*records: dict) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_claude_code_slug_is_the_one_the_cli_wrote() -> None:
    # Observed with 2.1.328: claude -p run in "/tmp/conv/slug/a.b_c d-é~x".
    assert slug("/tmp/conv/slug/a.b_c d-é~x") == "-tmp-conv-slug-a-b-c-d---x"
    assert slug("/srv/work") == "-srv-work"
    assert slug("/a/😀") == "-a---"  # two UTF-16 units, two dashes, as JavaScript counts


def test_gemini_project_slug() -> None:
    assert project_slug("/tmp/conv/gemini/workspace") == "workspace"  # observed with 0.61.0
    assert project_slug("/srv/My Project.v2/") == "my-project-v2"
    assert project_slug("/srv/---") == "project"


def test_lines_of_a_cut_file_drop_the_pieces_they_were_cut_through() -> None:
    whole = SavedFile("f", b'{"a":1}\n{"b":2}')
    assert list(lines_of(whole)) == [b'{"a":1}', b'{"b":2}']
    cut = SavedFile("f", b'{"a":1}\n{"b"', b'":2}\n{"c":3}\n', whole=False)
    assert list(lines_of(cut)) == [b'{"a":1}', b'{"c":3}']
    assert list(head_lines(b'{"a":1}\n{"b"')) == [b'{"a":1}']


def test_titles_are_one_bounded_line() -> None:
    assert title_of("  two\n lines ") == "two lines"
    long = title_of("x" * 1000)
    assert len(long) == MAX_TITLE_CHARS and long.endswith("…")


def test_claude_code_turns_end_where_the_next_prompt_starts_with_their_usage_once() -> None:
    fmt = get("claude-code").saved()
    cwd = "/w"
    usage = {"input_tokens": 7, "output_tokens": 2}

    def block(n: int, text: str) -> dict:
        return {
            "type": "assistant",
            "cwd": cwd,
            "message": {"id": "m1", "content": [{"type": "text", "text": text}], "usage": usage},
        }

    data = jsonl(
        {"type": "user", "cwd": cwd, "message": {"content": "one"}},
        block(0, "a"),
        block(1, "b"),  # the same API message: its usage is counted once
        {"type": "cost-state", "totalCostUSD": 0.5},
        {"type": "user", "cwd": cwd, "isMeta": True, "message": {"content": "not a prompt"}},
        {"type": "user", "cwd": cwd, "message": {"content": [{"type": "text", "text": "two"}]}},
    )
    transcript = fmt.transcript(SavedFile("x.jsonl", data), cwd, "x")
    assert [t.prompt for t in transcript.turns] == ["one", "two"]
    ended = transcript.turns[0].events[-1]
    assert isinstance(ended, ev.TurnEnded)
    assert (ended.usage.input_tokens, ended.usage.output_tokens, ended.cost_usd) == (7, 2, 0.5)
    texts = [e.text for e in transcript.turns[0].events if isinstance(e, ev.TextDelta)]
    assert texts == ["a", "b"]
    assert not transcript.partial
    assert fmt.transcript(SavedFile("x.jsonl", data), "/elsewhere", "x") is None
    assert fmt.belongs(data, cwd) and not fmt.belongs(data, "/elsewhere")


def test_codex_items_are_written_as_exec_json_prints_them() -> None:
    fmt = get("codex").saved()
    command = {
        "type": "CommandExecution",
        "id": "c1",
        "command": ["/bin/bash", "-lc", "echo hi"],
        "aggregated_output": "hi\n",
        "exit_code": 0,
        "status": "completed",
    }
    unknown = {"type": "SomethingNew", "id": "s1"}
    data = jsonl(
        {"type": "session_meta", "payload": {"id": "t", "cwd": "/w"}},
        {"type": "event_msg", "payload": {"type": "task_started"}},
        {"type": "event_msg", "payload": {"type": "item_completed", "item": command}},
        {"type": "event_msg", "payload": {"type": "item_completed", "item": unknown}},
        {
            "type": "token_usage_record",
            "payload": {"turn_token_usage": {"input_tokens": 9, "output_tokens": 1}},
        },
        {"type": "event_msg", "payload": {"type": "turn_aborted"}},
    )
    (turn,) = fmt.transcript(SavedFile("r.jsonl", data), "/w", "t").turns
    call = next(e for e in turn.events if isinstance(e, ev.ToolCall))
    assert call.input["command"] == "/bin/bash -lc 'echo hi'"
    result = next(e for e in turn.events if isinstance(e, ev.ToolResult))
    assert (result.output, result.is_error) == ("hi\n", False)
    ended = turn.events[-1]
    assert (ended.stop_reason, ended.usage.input_tokens) == ("cancelled", 9)
    transcript = fmt.transcript(SavedFile("r.jsonl", data), "/w", "t")
    assert transcript.partial and "1 item(s)" in transcript.problem


def test_gemini_set_of_messages_keeps_their_richer_records() -> None:
    fmt = get("gemini").saved()
    project = hashlib.sha256(b"/w").hexdigest()
    model = {
        "id": "g1",
        "type": "gemini",
        "content": "42.",
        "thoughts": [{"subject": "Sum", "description": "six times seven"}],
        "tokens": {"input": 10, "cached": 4, "output": 2, "thoughts": 3},
    }
    data = jsonl(
        {"sessionId": "s-1", "projectHash": project},
        {"id": "u1", "type": "user", "content": [{"text": "6*7?"}]},
        model,
        # A resumed session: its header, its context alone, then the whole list, thinner.
        {"sessionId": "s-1", "projectHash": project},
        {
            "$set": {
                "messages": [
                    {"id": "c", "type": "user", "content": [{"text": "<session_context>"}]}
                ]
            }
        },
        {
            "$set": {
                "messages": [
                    {"id": "u1", "type": "user", "content": [{"text": "6*7?"}]},
                    {"id": "g1", "type": "gemini", "content": [{"text": "42."}]},
                ]
            }
        },
    )
    transcript = fmt.transcript(SavedFile("session-2026-12-01T10-00-s-1.jsonl", data), "/w", "s-1")
    (turn,) = transcript.turns
    assert turn.prompt == "6*7?"
    thinking = [e.text for e in turn.events if isinstance(e, ev.ThinkingDelta)]
    assert thinking == ["Sum\nsix times seven"]
    usage = turn.events[-1].usage
    assert (usage.input_tokens, usage.cache_read_tokens, usage.thinking_tokens) == (6, 4, 3)
    assert fmt.transcript(SavedFile("n", data), "/w", "s-2") is None  # another id
    assert fmt.transcript(SavedFile("n", data), "/v", "s-1") is None  # another project
