"""ClaudeCodeParser and ClaudeCodeInput on hand-made lines (the recorded fixtures are in
``test_claude_code_fixtures.py``): tolerance, block keys, the shapes of tool outputs, compaction,
stop reasons and the exact stdin lines."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from parsers import base
from parsers import events as ev
from parsers.base import MAX_KIND_CHARS
from parsers.claude_code import (
    MAX_OPEN_BLOCKS,
    MAX_STREAMED_MESSAGES,
    SPEC,
    ClaudeCodeInput,
    ClaudeCodeParser,
    preserved_elements,
)
from parsers.file_changes import new_file_diff, unified_diff
from tests.support.parsing import tokens
from tests.support.paths import FIXTURES

CLAUDE_CODE = FIXTURES / "claude-code"


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


def feed(parser: ClaudeCodeParser, *objs: dict[str, Any]) -> list[ev.AgentEvent]:
    out: list[ev.AgentEvent] = []
    for obj in objs:
        out += parser.feed(line(obj))
    return out


def stream(message_id: str, event: dict[str, Any], parent: str | None = None) -> dict[str, Any]:
    return {
        "type": "stream_event",
        "event": event,
        "parent_tool_use_id": parent,
        "api_message_id": message_id,
    }


def start(message_id: str, index: int, kind: str = "text") -> dict[str, Any]:
    return stream(
        message_id,
        {"type": "content_block_start", "index": index, "content_block": {"type": kind}},
    )


def delta(message_id: str, index: int, text: str, kind: str = "text_delta") -> dict[str, Any]:
    key = "text" if kind == "text_delta" else "thinking"
    return stream(
        message_id,
        {"type": "content_block_delta", "index": index, "delta": {"type": kind, key: text}},
    )


def stop(message_id: str, index: int) -> dict[str, Any]:
    return stream(message_id, {"type": "content_block_stop", "index": index})


def assistant(message_id: str, *blocks: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "type": "assistant",
        "message": {"id": message_id, "role": "assistant", "content": list(blocks)},
        "parent_tool_use_id": None,
        **extra,
    }


def system(subtype: str, **fields: Any) -> dict[str, Any]:
    """A ``system`` line of the CLI (init, api_retry, permission_denied...)."""
    return {"type": "system", "subtype": subtype, **fields}


def tool_use(call_id: str, name: str, **tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": tool_input}


def result_line(call_id: str, content: Any, rich: Any = None, **extra: Any) -> dict[str, Any]:
    block = {"type": "tool_result", "tool_use_id": call_id, "content": content, **extra}
    obj: dict[str, Any] = {
        "type": "user",
        "message": {"role": "user", "content": [block]},
        "parent_tool_use_id": None,
    }
    if rich is not None:
        obj["tool_use_result"] = rich
    return obj


def only(events: list[ev.AgentEvent], cls: type) -> Any:
    (found,) = [e for e in events if isinstance(e, cls)]
    return found


# --- tolerance --------------------------------------------------------------------------------


def test_a_line_that_is_not_json_is_a_parse_error_and_counted():
    parser = ClaudeCodeParser()
    (err,) = parser.feed(b"not json {")
    assert isinstance(err, ev.ParseError)
    assert err.line == b"not json {"
    assert parser.parse_errors == 1
    (err,) = parser.feed(b"[1, 2]")
    assert isinstance(err, ev.ParseError)


def test_a_known_kind_of_the_wrong_shape_is_a_parse_error():
    parser = ClaudeCodeParser()
    (err,) = parser.feed(b'{"type": "assistant", "message": 5}')
    assert isinstance(err, ev.ParseError)
    assert "assistant" in err.message


def test_a_parse_error_keeps_at_most_1_kib_of_the_line():
    (err,) = ClaudeCodeParser().feed(b"x" * 5000)
    assert isinstance(err, ev.ParseError) and len(err.line) == 1024


def test_unknown_kinds_are_unknown_with_the_whole_line():
    parser = ClaudeCodeParser()
    raw = b'{"type": "brand_new", "x": 1}'
    (unknown,) = parser.feed(raw)
    assert isinstance(unknown, ev.Unknown)
    assert unknown.kind == "brand_new" and unknown.line == raw
    (unknown,) = feed(parser, {"type": "system", "subtype": "shiny"})
    assert isinstance(unknown, ev.Unknown) and unknown.kind == "system/shiny"
    (unknown,) = feed(
        parser, {"type": "control_request", "request_id": "1", "request": {"subtype": "x"}}
    )
    assert unknown.kind == "control_request/x"
    assert parser.unknown_lines == 3


def test_the_kind_an_unknown_line_is_named_by_is_cut_to_max_kind_chars():
    """Logged and forwarded beside the whole line: a type of a megabyte must not double it."""
    parser = ClaudeCodeParser()
    huge = "k" * 1_000_000
    (top,) = feed(parser, {"type": huge})
    (system,) = feed(parser, {"type": "system", "subtype": huge})
    assert isinstance(top, ev.Unknown) and top.kind == huge[:MAX_KIND_CHARS]
    assert isinstance(system, ev.Unknown) and system.kind == ("system/" + huge)[:MAX_KIND_CHARS]


def test_known_quiet_kinds_give_nothing():
    parser = ClaudeCodeParser()
    for sub in ("task_updated", "background_tasks_changed", "thinking_tokens", "status"):
        assert feed(parser, {"type": "system", "subtype": sub}) == []
    assert parser.unknown_lines == 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_feed_never_raises_on_bytes(data: bytes):
    ClaudeCodeParser().feed(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["stream_event", "assistant", "user", "system", "result", "control_request"]),
    st.dictionaries(
        st.sampled_from(["event", "message", "subtype", "tool_use_result", "request", "usage"]),
        json_values,
    ),
)
def test_feed_never_raises_on_odd_shapes_of_known_kinds(kind: str, fields: dict[str, Any]):
    parser = ClaudeCodeParser()
    parser.feed(line({"type": kind, **fields}))
    parser.end()


def test_free_form_parts_of_the_wrong_type_are_passed_over_not_raised():
    """A subagent's usage that is not numbers, MultiEdit ``edits`` that are not a list: the
    parser still answers (feed never raises, or the session would stop reading the agent)."""
    parser = ClaudeCodeParser()
    feed(parser, assistant("m1", tool_use("t1", "Agent", prompt="x")))
    rich = {"status": "completed", "usage": {"input_tokens": "many"}}
    ended, result = feed(parser, result_line("t1", "done", rich))
    assert isinstance(ended, ev.SubagentEnded) and ended.usage is None
    assert isinstance(result, ev.ToolResult) and result.output["text"] == "done"
    request = {"subtype": "can_use_tool", "tool_name": "MultiEdit", "input": {"edits": 5}}
    (asked,) = feed(parser, {"type": "control_request", "request_id": "r1", "request": request})
    assert isinstance(asked, ev.PermissionRequest) and asked.affected_paths == []


# --- text and thinking ----------------------------------------------------------------------------


def test_streamed_text_is_not_repeated_by_the_assistant_line():
    parser = ClaudeCodeParser()
    events = feed(
        parser,
        stream("m1", {"type": "message_start", "message": {"id": "m1"}}),
        start("m1", 0),
        delta("m1", 0, "Hel"),
        delta("m1", 0, "lo"),
        assistant("m1", {"type": "text", "text": "Hello"}),
        stop("m1", 0),
    )
    assert [type(e) for e in events] == [ev.TextDelta, ev.TextDelta, ev.TextEnd]
    assert {e.block for e in events} == {"m1:0"}  # type: ignore[attr-defined]


def test_block_keys_differ_across_api_messages_although_the_cli_restarts_index():
    parser = ClaudeCodeParser()
    a = feed(parser, start("m1", 0), delta("m1", 0, "a"), stop("m1", 0))
    b = feed(parser, start("m2", 0), delta("m2", 0, "b"), stop("m2", 0))
    assert a[0].block != b[0].block  # type: ignore[attr-defined]


def test_whole_blocks_become_a_delta_and_an_end():
    parser = ClaudeCodeParser()
    events = feed(
        parser,
        assistant("m1", {"type": "thinking", "thinking": "hmm", "signature": "s"}),
        assistant("m1", {"type": "text", "text": "Hi"}),
    )
    kinds = [type(e) for e in events]
    assert kinds == [ev.ThinkingDelta, ev.ThinkingEnd, ev.TextDelta, ev.TextEnd]
    assert events[0].block != events[2].block  # type: ignore[attr-defined]


def test_streamed_thinking_and_redacted_thinking():
    parser = ClaudeCodeParser()
    events = feed(
        parser,
        start("m1", 0, "thinking"),
        delta("m1", 0, "let me", "thinking_delta"),
        stop("m1", 0),
        start("m1", 1, "redacted_thinking"),
        stop("m1", 1),
    )
    assert isinstance(events[0], ev.ThinkingDelta) and events[0].text == "let me"
    redacted = [e for e in events if isinstance(e, ev.ThinkingDelta) and e.redacted]
    assert len(redacted) == 1
    assert sum(isinstance(e, ev.ThinkingEnd) for e in events) == 2


def test_whole_redacted_thinking_is_marked():
    events = feed(ClaudeCodeParser(), assistant("m1", {"type": "redacted_thinking", "data": "xx"}))
    assert isinstance(events[0], ev.ThinkingDelta) and events[0].redacted
    assert events[0].text == ""


def test_an_aborted_message_ends_its_blocks_cancelled():
    parser = ClaudeCodeParser()
    whole = feed(parser, assistant("m1", {"type": "text", "text": "Once"}, aborted=True))
    assert only(whole, ev.TextEnd).cancelled
    streamed = feed(
        parser,
        start("m2", 0),
        delta("m2", 0, "Once"),
        assistant("m2", {"type": "text", "text": "Once"}, aborted=True),
        stop("m2", 0),
    )
    assert only(streamed, ev.TextEnd).cancelled


def interrupted_result() -> dict[str, Any]:
    return {
        "type": "result",
        "subtype": "error_during_execution",
        "is_error": True,
        "terminal_reason": "aborted_streaming",
    }


def test_turns_interrupted_mid_block_leave_no_open_block_behind():
    """A long-lived process whose turns are interrupted mid-block, again and again (the stream cut
    before content_block_stop): each result forgets the main agent's open block, so what the parser
    keeps does not grow with the turns. A stop that comes after its turn's result is stale."""
    parser = ClaudeCodeParser()
    turns = MAX_OPEN_BLOCKS + 8  # past the cap too: the result, not the cap, forgets them
    for n in range(turns):
        m = f"msg_{n}"
        events = feed(
            parser,
            stream(m, {"type": "message_start", "message": {"id": m}}),
            start(m, 0),
            delta(m, 0, f"turn {n} "),
            delta(m, 0, "cut here"),
            interrupted_result(),
        )
        assert [type(e) for e in events] == [ev.TextDelta, ev.TextDelta, ev.TurnEnded]
        assert events[-1].stop_reason == "cancelled"  # type: ignore[attr-defined]
        assert parser._blocks == {}
    assert feed(parser, delta("msg_0", 0, "late"), stop("msg_0", 0)) == []


def test_a_background_subagents_block_open_at_the_result_keeps_streaming():
    """The main agent's open block goes at the result; a background subagent's, still streaming
    then, stays and ends when its stop comes."""
    parser = ClaudeCodeParser()
    sub_start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
    sub_delta = {"type": "content_block_delta", "index": 0}
    feed(
        parser,
        start("main", 0),
        delta("main", 0, "cut"),
        stream("sub", sub_start, parent="t1"),
        stream("sub", {**sub_delta, "delta": {"type": "text_delta", "text": "a"}}, parent="t1"),
        interrupted_result(),
    )
    assert feed(parser, delta("main", 0, "late")) == []
    after = feed(
        parser,
        stream("sub", {**sub_delta, "delta": {"type": "text_delta", "text": "b"}}, parent="t1"),
        stop("sub", 0),
    )
    assert [(type(e), e.block, e.parent) for e in after] == [  # type: ignore[attr-defined]
        (ev.TextDelta, "sub:0", "t1"),
        (ev.TextEnd, "sub:0", "t1"),
    ]


def test_a_background_subagents_streamed_text_is_not_repeated_after_the_result():
    """A background subagent's message streamed before the main turn's result, its assistant line
    printed after it: the text is said once, by the stream."""
    parser = ClaudeCodeParser()
    sub_start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
    sub_delta = {"type": "content_block_delta", "index": 0}
    sub_assistant = assistant("sub", {"type": "text", "text": "ab"})
    sub_assistant["parent_tool_use_id"] = "t1"
    events = feed(
        parser,
        stream("sub", {"type": "message_start", "message": {"id": "sub"}}, parent="t1"),
        stream("sub", sub_start, parent="t1"),
        stream("sub", {**sub_delta, "delta": {"type": "text_delta", "text": "a"}}, parent="t1"),
        stream("sub", {**sub_delta, "delta": {"type": "text_delta", "text": "b"}}, parent="t1"),
        stream("sub", {"type": "content_block_stop", "index": 0}, parent="t1"),
        {"type": "result", "subtype": "success", "is_error": False, "result": "done"},
        sub_assistant,
    )
    said = [e.text for e in events if isinstance(e, ev.TextDelta)]  # type: ignore[attr-defined]
    assert said == ["a", "b"]
    assert sum(isinstance(e, ev.TextEnd) for e in events) == 1


def test_subagents_streamed_messages_are_forgotten_at_their_end_or_past_the_bound():
    """A subagent's streamed messages are kept past results until its end; those of subagents whose
    end never comes are bounded by MAX_STREAMED_MESSAGES, oldest first."""
    parser = ClaudeCodeParser()
    feed(parser, assistant("m1", tool_use("t1", "Agent", prompt="p", run_in_background=True)))
    feed(parser, stream("sub", {"type": "message_start", "message": {"id": "sub"}}, parent="t1"))
    feed(parser, {"type": "result", "subtype": "success", "is_error": False})
    assert "sub" in parser._streamed
    notification = {"type": "system", "subtype": "task_notification", "tool_use_id": "t1"}
    only(feed(parser, notification), ev.SubagentEnded)
    assert parser._streamed == {}
    for n in range(MAX_STREAMED_MESSAGES + 1):
        m = f"sub_{n}"
        feed(parser, stream(m, {"type": "message_start", "message": {"id": m}}, parent=f"t{n}"))
    assert len(parser._streamed) == MAX_STREAMED_MESSAGES
    assert "sub_0" not in parser._streamed and f"sub_{MAX_STREAMED_MESSAGES}" in parser._streamed


def test_open_blocks_that_never_stop_are_bounded_oldest_first():
    """Subagent blocks never stopped (the subagent was stopped mid-block) outlive results: past
    MAX_OPEN_BLOCKS the oldest is forgotten, the newest still stream."""
    parser = ClaudeCodeParser()
    block_start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
    for n in range(MAX_OPEN_BLOCKS + 1):
        feed(parser, stream(f"sub_{n}", block_start, parent=f"t{n}"))
    assert len(parser._blocks) == MAX_OPEN_BLOCKS
    assert feed(parser, delta("sub_0", 0, "x")) == []
    (newest,) = feed(parser, delta(f"sub_{MAX_OPEN_BLOCKS}", 0, "x"))
    assert isinstance(newest, ev.TextDelta) and newest.block == f"sub_{MAX_OPEN_BLOCKS}:0"
    (second,) = feed(parser, delta("sub_1", 0, "x"))
    assert isinstance(second, ev.TextDelta)


def test_text_in_plan_mode_and_the_exit_plan_mode_plan_are_plan_content():
    parser = ClaudeCodeParser()
    feed(parser, {"type": "system", "subtype": "init", "permissionMode": "plan", "tools": []})
    (text, _end) = feed(parser, assistant("m1", {"type": "text", "text": "Step 1"}))
    assert text.role == "plan"  # type: ignore[attr-defined]
    # Leaving plan mode (an acknowledged set_permission_mode) ends it.
    feed(
        parser,
        {
            "type": "control_response",
            "response": {"subtype": "success", "request_id": "r", "response": {"mode": "default"}},
        },
    )
    (text, _end) = feed(parser, assistant("m2", {"type": "text", "text": "Done"}))
    assert text.role is None  # type: ignore[attr-defined]
    events = feed(parser, assistant("m3", tool_use("t1", "ExitPlanMode", plan="1. do it")))
    assert [type(e) for e in events] == [ev.TextDelta, ev.TextEnd, ev.ToolCall]
    assert events[0].role == "plan" and events[0].text == "1. do it"  # type: ignore[attr-defined]


# --- tools ---------------------------------------------------------------------------------------


def test_calls_of_one_message_share_its_group_and_subagents_are_named():
    parser = ClaudeCodeParser()
    events = feed(
        parser,
        assistant("m1", tool_use("t1", "Read", file_path="/a")),
        assistant(
            "m1", tool_use("t2", "Agent", description="look", prompt="p", subagent_type="Explore")
        ),
        assistant("m2", tool_use("t3", "Agent", description="d", prompt="p")),
    )
    calls = [e for e in events if isinstance(e, ev.ToolCall)]
    assert calls[0].group == calls[1].group == "m1" and calls[2].group == "m2"
    assert calls[1].subagent_type == "Explore" and calls[1].description == "look"
    assert calls[2].subagent_type == "general-purpose"
    assert calls[0].subagent_type is None


def _result_of(name: str, tool_input: dict[str, Any], content: Any, rich: Any, **extra: Any):
    parser = ClaudeCodeParser()
    feed(parser, assistant("m1", tool_use("t1", name, **tool_input)))
    return only(feed(parser, result_line("t1", content, rich, **extra)), ev.ToolResult)


def test_grep_file_names_mode_is_a_listing():
    rich = {"mode": "files_with_matches", "filenames": ["a.py", "b.py"], "numFiles": 2}
    result = _result_of("Grep", {"pattern": "x"}, "Found 2 files", rich)
    assert result.output == ["a.py", "b.py"] and result.listing


def test_bash_output_has_stdout_and_stderr():
    rich = {"stdout": "out", "stderr": "err", "interrupted": False}
    assert _result_of("Bash", {"command": "x"}, "out", rich).output == "out\nerr"


def test_an_interrupted_bash_is_cancelled():
    rich = {"stdout": "", "stderr": "", "interrupted": True}
    assert _result_of("Bash", {"command": "x"}, "", rich).cancelled


def test_a_call_the_user_interrupted_is_cancelled_a_refused_one_an_error():
    interrupted = _result_of(
        "Bash",
        {"command": "sleep 9"},
        "stopped",
        "User rejected tool use",
        is_error=True,
    )
    assert interrupted.cancelled and interrupted.is_error
    refused = _result_of("Write", {"file_path": "/a"}, "denied", "Error: denied", is_error=True)
    assert refused.is_error and not refused.cancelled


def test_tool_use_error_tags_are_stripped():
    result = _result_of(
        "Edit", {}, "<tool_use_error>String not found</tool_use_error>", "Error", is_error=True
    )
    assert result.output == "String not found"


def test_edit_and_write_diffs():
    hunks = [
        {"oldStart": 3, "oldLines": 1, "newStart": 3, "newLines": 2, "lines": ["-a", "+b", "+c"]}
    ]
    assert unified_diff("/f", hunks) == "--- /f\n+++ /f\n@@ -3,1 +3,2 @@\n-a\n+b\n+c\n"
    assert new_file_diff("/n", "x\ny") == (
        "--- /dev/null\n+++ /n\n@@ -0,0 +1,2 @@\n+x\n+y\n\\ No newline at end of file\n"
    )
    rich = {"filePath": "/f", "structuredPatch": hunks}
    result = _result_of("MultiEdit", {"file_path": "/f"}, "ok", rich)
    assert result.changed and result.output.startswith("--- /f")
    same = _result_of("Write", {"file_path": "/f"}, "ok", {"type": "update", "structuredPatch": []})
    assert same.changed is False and same.output is None


def test_duration_from_the_cli_timestamps_when_the_tool_reports_none():
    parser = ClaudeCodeParser()
    feed(
        parser,
        assistant("m1", tool_use("t1", "Bash", command="x"), timestamp="2026-01-01T00:00:00.100Z"),
    )
    rich = {"stdout": "", "stderr": ""}
    res = result_line("t1", "", rich)
    res["timestamp"] = "2026-01-01T00:00:01.350Z"
    assert only(feed(parser, res), ev.ToolResult).duration_ms == 1250


def test_foreground_subagent_ends_right_before_its_result_background_later():
    parser = ClaudeCodeParser()
    feed(parser, assistant("m1", tool_use("t1", "Agent", description="d", prompt="p")))
    rich = {
        "status": "completed",
        "content": [
            {
                "type": "text",
                "text": "<tools-used-before-summary>Bash</tools-used-before-summary>\n",
            },
            {"type": "text", "text": "report"},
        ],
        "totalDurationMs": 50,
        "totalTokens": 7,
        "usage": {"input_tokens": 5, "output_tokens": 2},
    }
    # The foreground task_notification says nothing new: the result tells the end.
    feed(
        parser,
        {
            "type": "system",
            "subtype": "task_started",
            "tool_use_id": "t1",
            "is_backgrounded": False,
        },
    )
    assert (
        feed(
            parser,
            {
                "type": "system",
                "subtype": "task_notification",
                "tool_use_id": "t1",
                "status": "completed",
            },
        )
        == []
    )
    events = feed(parser, result_line("t1", [{"type": "text", "text": "x"}], rich))
    assert [type(e) for e in events] == [ev.SubagentEnded, ev.ToolResult]
    ended, result = events
    assert ended.status == "completed" and ended.duration_ms == 50  # type: ignore[attr-defined]
    assert ended.usage.input_tokens == 5 and ended.usage.total_tokens == 7  # type: ignore[attr-defined]
    assert result.output["text"] == "report" and not result.background  # type: ignore[attr-defined]

    feed(parser, assistant("m2", tool_use("t2", "Agent", description="d", prompt="p")))
    feed(
        parser,
        {"type": "system", "subtype": "task_started", "tool_use_id": "t2", "is_backgrounded": True},
    )
    (held,) = feed(
        parser, result_line("t2", "launched", {"isAsync": True, "status": "async_launched"})
    )
    assert isinstance(held, ev.ToolResult) and held.background
    (end,) = feed(
        parser,
        {
            "type": "system",
            "subtype": "task_notification",
            "tool_use_id": "t2",
            "status": "completed",
            "summary": "all good",
            "usage": {"total_tokens": 9, "duration_ms": 70},
        },
    )
    assert isinstance(end, ev.SubagentEnded)
    assert end.summary == "all good" and end.usage.total_tokens == 9 and end.duration_ms == 70  # type: ignore[union-attr]


def test_lines_from_inside_a_subagent_carry_its_parent():
    parser = ClaudeCodeParser()
    obj = assistant("m9", tool_use("t9", "Bash", command="x"))
    obj["parent_tool_use_id"] = "t1"
    (call,) = feed(parser, obj)
    assert call.parent == "t1"


def test_can_use_tool_is_a_permission_request_with_affected_paths():
    parser = ClaudeCodeParser()
    (req,) = feed(
        parser,
        {
            "type": "control_request",
            "request_id": "r1",
            "request": {
                "subtype": "can_use_tool",
                "tool_name": "Bash",
                "input": {"command": "touch x"},
                "tool_use_id": "t1",
                "decision_reason_type": "mode",
                "blocked_path": "/w/x",
            },
        },
    )
    assert isinstance(req, ev.PermissionRequest)
    assert (req.request_id, req.tool_name, req.call_id, req.reason) == ("r1", "Bash", "t1", "mode")
    assert req.affected_paths == ["/w/x"]


# --- session-level lines ----------------------------------------------------------------------------


def test_init_names_mcp_tools_by_server():
    servers = [{"name": "echo", "status": "failed"}, {"name": "other", "status": "connected"}]
    init = system(
        "init",
        session_id="s-1",
        tools=["Bash", "mcp__echo__ping", "mcp__other__x"],
        mcp_servers=servers,
        slash_commands=["compact", "mine"],
    )
    (started,) = feed(ClaudeCodeParser(), init)
    assert isinstance(started, ev.SessionStarted)
    assert started.agent_session_id == "s-1"
    assert started.mcp_servers[0].tools == ["mcp__echo__ping"]
    assert started.commands[0].description and started.commands[1].description is None


def test_api_retry_and_permission_denied_are_notices():
    parser = ClaudeCodeParser()
    retrying = system(
        "api_retry",
        attempt=1,
        max_retries=3,
        retry_delay_ms=500,
        error_status=529,
        error="overloaded",
    )
    (retry,) = feed(parser, retrying)
    assert isinstance(retry, ev.Notice) and retry.severity == "warning" and retry.recoverable
    assert retry.http_status == 529
    refusal = system("permission_denied", tool_name="Write", tool_use_id="t1", message="no")
    (denied,) = feed(parser, refusal)
    assert isinstance(denied, ev.Notice) and denied.call_id == "t1" and denied.tool_name == "Write"


SUMMARY = """This session is being continued from a previous conversation.

Summary:
1. Primary Request and Intent:
   The user wants the parser done.
2. Key Technical Concepts:
   - msgspec tagged unions
3. Files and Code Sections:
   - parsers/claude_code.py
     - the parser
   - `/srv/app/gateway/protocol/mapper.py`: the mapper
4. Errors and fixes:
   - ParseError on empty lines: skipped them
7. Pending Tasks:
   - write the docs
   - run the bench

If you need specific details from before compaction, read the transcript."""


def test_compaction_waits_for_its_summary_and_names_preserved_elements():
    parser = ClaudeCodeParser()
    boundary = {
        "type": "system",
        "subtype": "compact_boundary",
        "compact_metadata": {"trigger": "manual", "pre_tokens": 900, "post_tokens": 40},
    }
    assert feed(parser, boundary, {"type": "system", "subtype": "init", "tools": []})[1:] == []
    (compacted,) = feed(
        parser,
        {"type": "user", "message": {"role": "user", "content": SUMMARY}, "isSynthetic": True},
    )
    assert isinstance(compacted, ev.Compacted)
    assert (compacted.trigger, compacted.pre_tokens, compacted.post_tokens) == ("manual", 900, 40)
    assert (
        compacted.summary.startswith("1. Primary Request")
        and "If you need" not in compacted.summary
    )
    preserved = compacted.preserved or {}
    assert preserved["files_modified"] == [
        "parsers/claude_code.py",
        "/srv/app/gateway/protocol/mapper.py",
    ]
    assert preserved["errors_encountered"] == ["ParseError on empty lines: skipped them"]
    assert preserved["decisions_made"] == ["msgspec tagged unions"]
    assert preserved["active_todos"] == [
        {"content": "write the docs"},
        {"content": "run the bench"},
    ]


def test_a_summary_without_those_sections_preserves_nothing():
    assert preserved_elements("1. Primary Request and Intent: say hi") is None


def test_a_compaction_without_summary_is_reported_when_something_else_comes():
    parser = ClaudeCodeParser()
    feed(
        parser,
        {
            "type": "system",
            "subtype": "compact_boundary",
            "compact_metadata": {"trigger": "auto", "pre_tokens": 5},
        },
    )
    events = feed(
        parser, {"type": "result", "subtype": "success", "stop_reason": None, "num_turns": 0}
    )
    assert [type(e) for e in events] == [ev.Compacted, ev.TurnEnded]
    assert events[0].summary == "" and events[0].post_tokens == 0  # type: ignore[attr-defined]
    feed(
        parser,
        {"type": "system", "subtype": "compact_boundary", "compact_metadata": {"pre_tokens": 5}},
    )
    assert [type(e) for e in parser.end()] == [ev.Compacted]


def _stop(**fields: Any) -> str:
    (ended,) = [
        e
        for e in feed(ClaudeCodeParser(), {"type": "result", **fields})
        if isinstance(e, ev.TurnEnded)
    ]
    return ended.stop_reason


def test_stop_reasons():
    assert (
        _stop(subtype="success", stop_reason="end_turn", terminal_reason="completed") == "end_turn"
    )
    assert _stop(subtype="success", stop_reason="max_tokens") == "max_tokens"
    assert (
        _stop(subtype="error_during_execution", terminal_reason="aborted_streaming") == "cancelled"
    )
    assert (
        _stop(
            subtype="error_during_execution",
            terminal_reason="aborted_tools",
            stop_reason="tool_use",
        )
        == "cancelled"
    )
    assert (
        _stop(subtype="success", is_error=True, api_error_status=500, terminal_reason="api_error")
        == "error"
    )
    assert _stop(subtype="error_during_execution") == "error"
    assert _stop(subtype="error_max_turns") == "max_tokens"
    assert _stop(subtype="success", stop_reason=None) == "end_turn"


def test_result_usage_and_context_window():
    parser = ClaudeCodeParser()
    msg = assistant("m1", {"type": "text", "text": "x"})
    msg["message"]["usage"] = {
        "input_tokens": 10,
        "cache_read_input_tokens": 5,
        "cache_creation_input_tokens": 1,
        "output_tokens": 4,
    }
    feed(parser, msg)
    (ended,) = feed(
        parser,
        {
            "type": "result",
            "subtype": "success",
            "stop_reason": "end_turn",
            "num_turns": 2,
            "total_cost_usd": 0.5,
            "usage": {
                "input_tokens": 10,
                "output_tokens": 4,
                "cache_read_input_tokens": 5,
                "cache_creation_input_tokens": 1,
                "output_tokens_details": {"thinking_tokens": 3},
            },
            "modelUsage": {"a": {"contextWindow": 200000}, "b": {"contextWindow": 1000000}},
        },
    )
    assert isinstance(ended, ev.TurnEnded)
    assert ended.usage == tokens(10, 4, cache_read=5, cache_write=1, thinking=3)
    assert (ended.context_window, ended.context_used, ended.cost_usd, ended.num_turns) == (
        1000000,
        20,
        0.5,
        2,
    )


def test_an_api_error_result_without_its_message_still_gives_a_notice():
    events = feed(
        ClaudeCodeParser(),
        {
            "type": "result",
            "subtype": "success",
            "is_error": True,
            "api_error_status": 400,
            "result": "API Error: 400",
        },
    )
    assert [type(e) for e in events] == [ev.Notice, ev.TurnEnded]


def test_counts_from_free_form_json_are_whole_non_negative_numbers():
    """``true`` is an int to Python: taken as a duration or a token count it made an invalid
    frame field. Such values, and negative ones, are passed over."""
    parser = ClaudeCodeParser()
    feed(parser, assistant("m1", tool_use("t1", "Glob", pattern="*")))
    (glob,) = feed(parser, result_line("t1", "a", {"filenames": ["a"], "durationMs": True}))
    assert isinstance(glob, ev.ToolResult) and glob.duration_ms is None
    feed(parser, assistant("m2", tool_use("t2", "Agent", prompt="x", run_in_background=True)))
    notification = {"type": "system", "subtype": "task_notification", "tool_use_id": "t2"}
    usage = {"total_tokens": True, "duration_ms": -1}
    (ended,) = feed(parser, {**notification, "status": "completed", "usage": usage})
    assert isinstance(ended, ev.SubagentEnded) and (ended.duration_ms, ended.usage) == (None, None)
    result = {"type": "result", "subtype": "success", "modelUsage": {"m": {"contextWindow": True}}}
    odd, turn = feed(
        parser, {**result, "usage": {"output_tokens_details": {"thinking_tokens": True}}}
    )
    assert odd == ev.OddNumbers(
        kind="result", fields=["usage.output_tokens_details.thinking_tokens"]
    )
    assert isinstance(turn, ev.TurnEnded) and turn.context_window is None
    assert turn.usage is not None and turn.usage.thinking_tokens is None


def test_an_api_error_noticed_by_a_process_that_died_is_not_taken_for_the_next_ones():
    """The CLI printed an API error message and died before its result: the next process's API
    error result is still a Notice of its own."""
    parser = ClaudeCodeParser()
    error_line = assistant(
        "m1", {"type": "text", "text": "API Error: 500"}, is_api_error_message=True
    )
    (first,) = feed(parser, {**error_line, "api_error_status": 500})
    assert isinstance(first, ev.Notice) and first.code == "API_ERROR"
    assert parser.end() == []
    result = {"type": "result", "subtype": "success", "is_error": True, "api_error_status": 529}
    notice, ended = feed(parser, {**result, "result": "API Error: 529 overloaded"})
    assert isinstance(notice, ev.Notice) and notice.http_status == 529
    assert isinstance(ended, ev.TurnEnded) and ended.stop_reason == "error"


def test_a_slash_command_output_is_text_a_replayed_prompt_is_not():
    parser = ClaudeCodeParser()
    replay = {"type": "user", "message": {"role": "user", "content": "hi"}, "isReplay": True}
    assert feed(parser, replay) == []
    out = "<local-command-stdout>Total cost: $0.01</local-command-stdout>"
    delta, end = feed(parser, {"type": "user", "message": {"role": "user", "content": out}})
    assert isinstance(delta, ev.TextDelta) and isinstance(end, ev.TextEnd)
    assert (delta.text, delta.role) == ("Total cost: $0.01", "command_output")


def test_control_response_is_an_ack():
    (ack,) = feed(
        ClaudeCodeParser(),
        {
            "type": "control_response",
            "response": {"subtype": "error", "request_id": "r", "error": "nope"},
        },
    )
    assert isinstance(ack, ev.ControlAck) and not ack.ok and ack.error == "nope"


def test_initialize_answer_lists_the_commands_and_init_names_them_alike():
    """DPS-12.1-commands: the answer to initialize (the CLI's shape, 2.1.328) becomes
    CommandsListed, descriptions cut to their first line and 200 characters; the init that names
    the same commands later describes them the same way, so nothing is published twice."""
    long = "Use this skill whenever you chart. " * 20 + "\nSecond line."
    listed = [
        {"name": "compact", "description": "Clear history but keep a summary", "argumentHint": ""},
        {"name": "dataviz", "description": long, "argumentHint": "", "builtin": True},
        {"name": "plain"},
        {"description": "no name"},
        "not an object",
    ]
    parser = ClaudeCodeParser()
    ack, commands = feed(
        parser,
        {
            "type": "control_response",
            "response": {
                "subtype": "success",
                "request_id": "rawp-1",
                "response": {"commands": listed, "models": [], "pid": 1},
            },
        },
    )
    assert isinstance(ack, ev.ControlAck) and ack.ok
    assert isinstance(commands, ev.CommandsListed)
    by_name = {c.name: c.description for c in commands.commands}
    assert list(by_name) == ["compact", "dataviz", "plain"]
    assert by_name["compact"] == "Compact the conversation, keeping a summary in context"
    assert len(by_name["dataviz"]) <= 200 and by_name["dataviz"].endswith("…")
    assert by_name["plain"] is None
    init = {
        "type": "system",
        "subtype": "init",
        "session_id": "s",
        "tools": ["Bash"],
        "slash_commands": ["compact", "dataviz", "plain"],
    }
    (started,) = feed(parser, init)
    assert isinstance(started, ev.SessionStarted)
    assert started.commands == commands.commands


def test_builtin_tools_are_what_the_real_cli_lists():
    """SPEC.tools (the first catalog of the long-lived profile) is the init tool list of a fixture
    recorded with --input-format stream-json and --permission-prompt-tool stdio."""
    meta = json.loads((CLAUDE_CODE / "permission-prompt.meta.json").read_text())
    assert "--input-format" in meta["argv"] and "--permission-prompt-tool" in meta["argv"]
    init = json.loads((CLAUDE_CODE / "permission-prompt.jsonl").read_bytes().splitlines()[0])
    assert init["subtype"] == "init"
    assert list(SPEC.tools) == init["tools"]
    # the one-shot profile (prompt in argv, no permission prompt tool) expects fewer
    from gateway.agent.profiles import builtin_profiles

    meta = json.loads((CLAUDE_CODE / "text.meta.json").read_text())
    assert "--input-format" not in meta["argv"] and "--permission-prompt-tool" not in meta["argv"]
    init = json.loads((CLAUDE_CODE / "text.jsonl").read_bytes().splitlines()[0])
    assert list(builtin_profiles()["claude-code-oneshot"].tools) == init["tools"]


# --- stdin ---------------------------------------------------------------------------------------


def _recorded_stdin(name: str) -> list[dict[str, Any]]:
    meta = json.loads((CLAUDE_CODE / f"{name}.meta.json").read_text())
    return [json.loads(s) for s in meta["stdin"]]


def test_input_lines_are_what_the_real_cli_was_given():
    """The stdin lines the fixtures were recorded with, rebuilt by ClaudeCodeInput."""
    cc = ClaudeCodeInput()
    prompt, interrupt = _recorded_stdin("interrupt-stream")
    assert json.loads(cc.prompt(prompt["message"]["content"])) == prompt  # type: ignore[arg-type]
    assert json.loads(cc.interrupt(interrupt["request_id"])) == interrupt  # type: ignore[arg-type]
    _, allow, deny = _recorded_stdin("permission-prompt")
    got = cc.permission(
        allow["response"]["request_id"],
        allow=True,
        updated_input=allow["response"]["response"]["updatedInput"],
    )
    assert json.loads(got) == allow  # type: ignore[arg-type]
    got = cc.permission(
        deny["response"]["request_id"], allow=False, message=deny["response"]["response"]["message"]
    )
    assert json.loads(got) == deny  # type: ignore[arg-type]
    for data in (cc.prompt("x"), cc.interrupt("i"), cc.set_mode("m", "plan")):
        assert data is not None and data.endswith(b"\n") and data.count(b"\n") == 1


def test_initialize_and_set_mode_lines():
    assert json.loads(ClaudeCodeInput().initialize("rawp-2")) == {  # type: ignore[arg-type]
        "type": "control_request",
        "request_id": "rawp-2",
        "request": {"subtype": "initialize"},
    }
    assert json.loads(ClaudeCodeInput().set_mode("rawp-1", "plan")) == {  # type: ignore[arg-type]
        "type": "control_request",
        "request_id": "rawp-1",
        "request": {"subtype": "set_permission_mode", "mode": "plan"},
    }


def test_spec_is_registered_as_claude_code():
    assert base.get("claude-code") is SPEC
    assert isinstance(SPEC.parser(), ClaudeCodeParser)
    assert isinstance(SPEC.input(), ClaudeCodeInput)


def test_a_delta_of_the_other_kind_than_its_block_is_dropped():
    """A text delta on a thinking block (or the reverse) never comes from the CLI; if it did, it
    must not mix text into thinking: the block keeps its own kind's deltas only."""

    def event(e: dict[str, Any]) -> bytes:
        return line({"type": "stream_event", "event": e, "session_id": "s",
                     "parent_tool_use_id": None, "uuid": "u"})  # fmt: skip

    parser = ClaudeCodeParser()
    parser.feed(event({"type": "message_start", "message": {"id": "m1", "type": "message",
        "role": "assistant", "model": "x", "content": [], "usage": {}}}))  # fmt: skip
    for kind, other in (("thinking", "text"), ("text", "thinking")):
        index = 0 if kind == "thinking" else 1
        parser.feed(event({"type": "content_block_start", "index": index,
                           "content_block": {"type": kind, kind: ""}}))  # fmt: skip
        wrong = {"type": f"{other}_delta", other: "wrong"}
        right = {"type": f"{kind}_delta", kind: "right"}
        assert (
            parser.feed(event({"type": "content_block_delta", "index": index, "delta": wrong}))
            == []
        )
        [got] = parser.feed(event({"type": "content_block_delta", "index": index, "delta": right}))
        assert isinstance(got, ev.ThinkingDelta if kind == "thinking" else ev.TextDelta)
        assert got.text == "right"
