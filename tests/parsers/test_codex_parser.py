"""The Codex parser line by line (what ``codex exec --json`` prints, shapes from
the recorded fixtures under ``tests/fixtures/codex/``), and the Codex profile's resume through
the real server with a stand-in CLI that prints Codex lines and reports the argv it was given."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import Any

import pytest

from gateway.config import ConfigError, builtin_profiles, command_for, load_config
from gateway.protocol import frames as F
from gateway.protocol.actions import Emit, Signal, Spawn
from gateway.protocol.machine import SessionMachine
from gateway.protocol.states import Lifecycle, ProcessState
from parsers import events as ev
from parsers.base import NoInput
from parsers.base import get as get_parser
from parsers.codex import CodexParser
from parsers.codex.stdout import _MAX_OPEN_CALLS
from tests.support.gateway_peer import Master, create_session, make_config, start_gateway
from tests.support.parsing import Files, feed, line, tokens, whole_text, whole_thinking
from tests.support.paths import HOSTILE


def started(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "item.started", "item": item}


def completed(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "item.completed", "item": item}


def command(item_id: str, cmd: str, output: str = "", exit_code: int | None = 0, **kw: Any):
    status = "in_progress" if exit_code is None else ("completed" if exit_code == 0 else "failed")
    return {
        "id": item_id,
        "type": "command_execution",
        "command": cmd,
        "aggregated_output": output,
        "exit_code": exit_code,
        "status": kw.get("status", status),
    }


def usage(i: int, o: int, cached: int = 0, reasoning: int = 0) -> dict[str, Any]:
    return {
        "type": "turn.completed",
        "usage": {
            "input_tokens": i,
            "cached_input_tokens": cached,
            "cache_write_input_tokens": 0,
            "output_tokens": o,
            "reasoning_output_tokens": reasoning,
        },
    }


def test_spec_is_registered_as_codex():
    spec = get_parser("codex")
    assert isinstance(spec.parser(), CodexParser)
    assert isinstance(spec.input(), NoInput)


def test_thread_started_is_the_agent_session_id():
    (event,) = feed(CodexParser(), {"type": "thread.started", "thread_id": "01a2-thread"})
    assert isinstance(event, ev.SessionStarted)
    assert event.agent_session_id == "01a2-thread"
    assert event.tools == [] and event.commands == []


def test_DPS_4_1_text_a_message_is_one_delta_and_its_end():
    events = feed(
        CodexParser(),
        {"type": "turn.started"},
        completed({"id": "item_0", "type": "reasoning", "text": "**Plan**\n\nthink"}),
        completed({"id": "item_1", "type": "agent_message", "text": "Hello."}),
    )
    assert events == whole_thinking("item_0", "**Plan**\n\nthink") + whole_text("item_1", "Hello.")


def test_DPS_5_3_1_result_command_exit_code_decides_the_status():
    parser = CodexParser()
    events = feed(
        parser,
        started(command("item_0", "/bin/bash -lc 'ls x'", exit_code=None)),
        completed(command("item_0", "/bin/bash -lc 'ls x'", "ls: x: No such file\n", 2)),
        completed(command("item_1", "true", "", None, status="declined")),
    )
    call, result, call2, declined = events
    assert isinstance(call, ev.ToolCall) and call.name == "shell"
    assert call.input == {"command": "/bin/bash -lc 'ls x'"} and call.call_id == "item_0"
    assert isinstance(result, ev.ToolResult)
    assert result.is_error and result.output == "ls: x: No such file\n"
    assert result.output_type == "text"
    # Completed without a start: the call is reported with its result.
    assert isinstance(call2, ev.ToolCall) and call2.call_id == "item_1"
    assert isinstance(declined, ev.ToolResult) and declined.is_error


def test_DPS_5_2_request_items_started_together_share_a_group_and_pair_by_id():
    """Parallel commands: started one after another (one group), completed in the other order."""
    events = feed(
        CodexParser(),
        started(command("item_1", "ls", exit_code=None)),
        completed(command("item_1", "ls", "a\n")),
        started(command("item_2", "cat a", exit_code=None)),
        started(command("item_3", "wc a", exit_code=None)),
        completed(command("item_3", "wc a", "1 a\n")),
        completed(command("item_2", "cat a", "x\n")),
    )
    calls = [e for e in events if isinstance(e, ev.ToolCall)]
    results = [e for e in events if isinstance(e, ev.ToolResult)]
    assert [c.call_id for c in calls] == ["item_1", "item_2", "item_3"]
    assert calls[1].group == calls[2].group and calls[0].group != calls[1].group
    assert [(r.call_id, r.output) for r in results] == [
        ("item_1", "a\n"),
        ("item_3", "1 a\n"),
        ("item_2", "x\n"),
    ]


def test_web_search_repeated_id_key_the_item_id_names_the_call():
    raw = (
        b'{"type":"item.started","item":{"id":"item_0","type":"web_search","id":"ws_1",'
        b'"query":"RAWP","action":{"type":"search","query":"RAWP"}}}'
    )
    parser = CodexParser()
    (call,) = parser.feed(raw)
    (result,) = parser.feed(raw.replace(b"item.started", b"item.completed"))
    assert isinstance(call, ev.ToolCall) and isinstance(result, ev.ToolResult)
    assert call.call_id == result.call_id == "item_0"
    assert call.name == "web_search" and call.input == {"query": "RAWP"}
    assert result.output == {"query": "RAWP", "action": {"type": "search", "query": "RAWP"}}
    assert result.output_type == "structured" and not result.is_error


def test_mcp_calls_are_mcp_tools_with_the_result_text_or_the_error():
    item = {
        "id": "item_0",
        "type": "mcp_tool_call",
        "server": "echo",
        "tool": "echo",
        "arguments": {"text": "hi"},
        "result": None,
        "error": None,
        "status": "in_progress",
    }
    done = {
        **item,
        "status": "completed",
        "result": {"content": [{"type": "text", "text": "echo: hi"}], "structured_content": None},
    }
    failed = {**item, "id": "item_1", "status": "failed", "error": {"message": "server gone"}}
    events = feed(CodexParser(), started(item), completed(done), completed(failed))
    call, result, _, error = events
    assert isinstance(call, ev.ToolCall) and call.name == "mcp__echo__echo"
    assert call.input == {"text": "hi"}
    assert isinstance(result, ev.ToolResult) and result.output == "echo: hi"
    assert not result.is_error
    assert isinstance(error, ev.ToolResult) and error.is_error and error.output == "server gone"


def test_an_mcp_result_whose_content_is_not_a_list_is_an_empty_output():
    item = {"id": "item_0", "type": "mcp_tool_call", "server": "s", "tool": "t"}
    odd = {**item, "status": "completed", "result": {"content": 5}}
    call, result = feed(CodexParser(), completed(odd))
    assert isinstance(call, ev.ToolCall) and call.name == "mcp__s__t"
    assert isinstance(result, ev.ToolResult) and result.output == "" and not result.is_error


def change(item_id: str, status: str, *changes: tuple[str, str]) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "file_change",
        "changes": [{"path": f"/w/{p}", "kind": k} for p, k in changes],
        "status": status,
    }


def test_DPS_5_3_3_output_type_file_change_is_a_diff_read_from_the_workspace():
    files = Files("/w/", **{"notes.txt": "alpha\nbeta\n", "old.txt": "bye\n"})
    parser = CodexParser(files.read)
    (call,) = feed(
        parser,
        started(change("item_1", "in_progress", ("notes.txt", "update"), ("hello.txt", "add"))),
    )
    assert isinstance(call, ev.ToolCall) and call.name == "apply_patch"
    assert call.input["changes"][1] == {"path": "/w/hello.txt", "kind": "add"}
    files.files["/w/notes.txt"] = "alpha\ngamma\n"
    files.files["/w/hello.txt"] = "hello\n"
    (result,) = feed(
        parser,
        completed(change("item_1", "completed", ("notes.txt", "update"), ("hello.txt", "add"))),
    )
    assert isinstance(result, ev.ToolResult)
    assert result.output_type == "diff" and result.changed is True and not result.is_error
    assert result.output == (
        "--- /w/notes.txt\n+++ /w/notes.txt\n@@ -1,2 +1,2 @@\n alpha\n-beta\n+gamma\n"
        "--- /dev/null\n+++ /w/hello.txt\n@@ -0,0 +1 @@\n+hello\n"
    )
    # A deleted file that was read before: its lines go.
    feed(parser, started(change("item_2", "in_progress", ("old.txt", "delete"))))
    del files.files["/w/old.txt"]
    (deleted,) = feed(parser, completed(change("item_2", "completed", ("old.txt", "delete"))))
    assert isinstance(deleted, ev.ToolResult)
    assert deleted.output == "--- /w/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"


def test_file_change_without_a_readable_before_says_what_changed_instead_of_a_diff():
    """The patch was already applied when item.started was read (the CLI writes right after
    printing it): no diff can be told for sure, so none is claimed."""
    files = Files("/w/", **{"notes.txt": "already new\n"})
    parser = CodexParser(files.read)
    feed(parser, started(change("item_1", "in_progress", ("notes.txt", "update"))))
    (result,) = feed(parser, completed(change("item_1", "completed", ("notes.txt", "update"))))
    assert isinstance(result, ev.ToolResult)
    assert result.output_type == "text" and result.changed is True
    assert result.output == "update /w/notes.txt\n"
    # Reported with no announcement: no baseline, so no diff either (not even against an older
    # read: a command may have changed the file since).
    files.files["/w/notes.txt"] = "newer\n"
    _, unannounced = feed(parser, completed(change("item_3", "completed", ("notes.txt", "update"))))
    assert isinstance(unannounced, ev.ToolResult) and unannounced.output_type == "text"
    _, failed = feed(parser, completed(change("item_2", "failed", ("notes.txt", "update"))))
    assert isinstance(failed, ev.ToolResult) and failed.is_error
    assert "update /w/notes.txt" in failed.output


def file_change(item_id: str, status: str, *changes: tuple[str, str]) -> dict[str, Any]:
    """A file_change item with its paths as the agent named them."""
    return {
        "id": item_id,
        "type": "file_change",
        "changes": [{"path": p, "kind": k} for p, k in changes],
        "status": status,
    }


def test_file_changes_are_read_in_the_workspace_the_agent_runs_in_and_only_there(
    tmp_path, monkeypatch
):
    """Told its workspace (the agent's cwd), the parser reads a relative path there, not in the
    gateway's cwd, and reads nothing outside it: a change of an outside file (absolute, "..", a
    link that leads out) is reported without a diff, and its text is in no event."""
    (tmp_path / "secret.txt").write_text("SECRET\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("alpha\n")
    (ws / "link.txt").symlink_to(tmp_path / "secret.txt")
    monkeypatch.chdir(tmp_path)  # the gateway's cwd, where "secret.txt" is another file
    parser = CodexParser()
    parser.set_workspace(str(ws))

    feed(parser, started(file_change("item_1", "in_progress", ("notes.txt", "update"))))
    (ws / "notes.txt").write_text("beta\n")
    (ws / "hello.txt").write_text("hello\n")
    (inside,) = feed(
        parser,
        completed(
            file_change("item_1", "completed", ("notes.txt", "update"), ("hello.txt", "add"))
        ),
    )
    assert isinstance(inside, ev.ToolResult) and inside.output_type == "diff"
    assert inside.output == (
        "--- notes.txt\n+++ notes.txt\n@@ -1 +1 @@\n-alpha\n+beta\n"
        "--- /dev/null\n+++ hello.txt\n@@ -0,0 +1 @@\n+hello\n"
    )

    outside = [str(tmp_path / "secret.txt"), "../secret.txt", "link.txt", "secret.txt", "a\0b"]
    events: list[ev.AgentEvent] = []
    for n, path in enumerate(outside):
        events += feed(parser, started(file_change(f"item_o{n}", "in_progress", (path, "update"))))
        events += feed(parser, completed(file_change(f"item_o{n}", "completed", (path, "update"))))
        events += feed(parser, completed(file_change(f"item_a{n}", "completed", (path, "add"))))
    results = [e for e in events if isinstance(e, ev.ToolResult)]
    assert len(results) == 2 * len(outside)
    assert all(r.output_type == "text" and r.changed and not r.is_error for r in results)
    assert not any("SECRET" in repr(e) for e in events)


def test_a_parser_not_told_its_workspace_reads_no_file(tmp_path):
    """The default (a replay, ``translate``): the change is reported, without a diff."""
    (tmp_path / "a.txt").write_text("there\n")
    path = str(tmp_path / "a.txt")
    _, result = feed(CodexParser(), completed(file_change("item_1", "completed", (path, "add"))))
    assert isinstance(result, ev.ToolResult) and result.output_type == "text"
    assert result.output == f"add {path}\n"


def test_todo_list_each_version_is_an_update_plan_call_with_its_result():
    def todo(status: str, *items: tuple[str, bool]) -> dict[str, Any]:
        return {
            "id": "item_5",
            "type": "todo_list",
            "items": [{"text": t, "completed": c} for t, c in items],
        }

    events = feed(
        CodexParser(),
        started(todo("", ("read", False), ("write", False))),
        {"type": "item.updated", "item": todo("", ("read", True), ("write", False))},
        completed(todo("", ("read", True), ("write", False))),  # unchanged: nothing new
    )
    calls = [e for e in events if isinstance(e, ev.ToolCall)]
    results = [e for e in events if isinstance(e, ev.ToolResult)]
    assert [c.call_id for c in calls] == ["item_5#0", "item_5#1"]
    assert [r.call_id for r in results] == ["item_5#0", "item_5#1"]
    assert all(c.name == "update_plan" for c in calls)
    assert results[1].output == [
        {"content": "read", "completed": True},
        {"content": "write", "completed": False},
    ]
    assert results[1].output_type == "structured"


def test_a_todo_list_left_open_by_a_process_is_forgotten_when_its_stdout_closes():
    """Each ``codex exec`` numbers its items from item_0: the next process's first todo list
    (here the same text as the interrupted one) is a call of its own, not an unchanged version."""
    todo = {"id": "item_0", "type": "todo_list", "items": [{"text": "read", "completed": False}]}
    parser = CodexParser()
    first, _ = feed(parser, started(todo))
    assert parser.end() == []
    again, _ = feed(parser, started(todo))
    assert isinstance(first, ev.ToolCall) and isinstance(again, ev.ToolCall)
    assert first.input == again.input == {"todos": [{"content": "read", "completed": False}]}


def test_todo_lists_never_completed_are_remembered_up_to_a_bound():
    """Past _MAX_OPEN_CALLS open todo lists the oldest is forgotten: the same version of it again
    is a new call; the newest are still remembered (an unchanged version says nothing)."""
    parser = CodexParser()

    def todo(i: int) -> dict[str, Any]:
        return started({"id": f"item_{i}", "type": "todo_list", "items": [{"text": "t"}]})

    for i in range(_MAX_OPEN_CALLS + 1):
        feed(parser, todo(i))
    assert feed(parser, todo(_MAX_OPEN_CALLS)) == []
    assert [type(e) for e in feed(parser, todo(0))] == [ev.ToolCall, ev.ToolResult]


def test_DPS_7_3_usage_is_the_turns_share_of_the_threads_cumulative_count():
    parser = CodexParser()
    feed(parser, {"type": "thread.started", "thread_id": "t1"})
    (first,) = feed(parser, usage(300, 40, cached=100, reasoning=12))
    assert isinstance(first, ev.TurnEnded) and first.stop_reason == "end_turn"
    assert first.usage == tokens(200, 40, cache_read=100, cache_write=0, thinking=12)
    # The resumed thread: same thread id, counts cumulative.
    feed(parser, {"type": "thread.started", "thread_id": "t1"})
    (second,) = feed(parser, usage(700, 60, cached=300, reasoning=12))
    assert isinstance(second, ev.TurnEnded) and second.usage is not None
    assert (second.usage.input_tokens, second.usage.cache_read_tokens) == (200, 200)
    assert (second.usage.output_tokens, second.usage.thinking_tokens) == (20, 0)
    # Another thread counts from its own start.
    feed(parser, {"type": "thread.started", "thread_id": "t2"})
    (third,) = feed(parser, usage(100, 10))
    assert isinstance(third, ev.TurnEnded) and third.usage is not None
    assert (third.usage.input_tokens, third.usage.output_tokens) == (100, 10)
    # A count that went down (the CLI counted afresh) is taken as it is.
    (fourth,) = feed(parser, usage(50, 5))
    assert isinstance(fourth, ev.TurnEnded) and fourth.usage is not None
    assert (fourth.usage.input_tokens, fourth.usage.output_tokens) == (50, 5)


@pytest.mark.parametrize(
    ("message", "code", "status", "text"),
    [
        (
            "unexpected status 401 Unauthorized: Incorrect API key provided, url: http://x/v1",
            "API_UNAUTHORIZED",
            401,
            "unexpected status 401 Unauthorized: Incorrect API key provided, url: http://x/v1",
        ),
        (
            '{"error": {"message": "Invalid value for \'input\'.", '
            '"type": "invalid_request_error", "param": "input", "code": "invalid_value"}}',
            "API_BAD_REQUEST",
            400,
            "Invalid value for 'input'.",
        ),
        ("unexpected status 429 Too Many Requests: slow down", "API_RATE_LIMITED", 429, None),
        ("stream disconnected before completion: boom", "STREAM_ERROR", None, None),
        ("We're currently experiencing high demand.", "API_ERROR", None, None),
        ('{"error": {"message": "odd", "code": true}}', "API_ERROR", None, "odd"),
        ('{"error": {"message": "odd", "code": -5}}', "API_ERROR", None, "odd"),
    ],
)
def test_DPS_4_4_error_api_errors_get_readable_codes(message, code, status, text):
    parser = CodexParser()
    feed(parser, {"type": "turn.started"})
    notice, *_ = feed(parser, {"type": "error", "message": message})
    (ended,) = feed(parser, {"type": "turn.failed", "error": {"message": message}})
    assert isinstance(notice, ev.Notice)
    assert (notice.code, notice.http_status, notice.severity) == (code, status, "error")
    assert notice.message == (text or message)
    assert not notice.recoverable
    assert isinstance(ended, ev.TurnEnded) and ended.stop_reason == "error" and ended.is_error
    assert ended.error == (text or message)
    named = parser.describe_exit(1)
    assert named is not None and named[0] == code and (text or message) in named[1]


def test_turn_failed_alone_is_still_an_error_notice_and_reconnects_are_warnings():
    parser = CodexParser()
    retry, failed_notice, ended = feed(
        parser,
        {"type": "error", "message": "Reconnecting... 1/5 (stream disconnected)"},
        {"type": "turn.failed", "error": {"message": "unexpected status 500 Internal"}},
    )
    assert isinstance(retry, ev.Notice) and retry.severity == "warning"
    assert retry.code == "API_RETRY" and retry.recoverable
    assert isinstance(failed_notice, ev.Notice) and failed_notice.code == "API_SERVER_ERROR"
    assert isinstance(ended, ev.TurnEnded) and ended.stop_reason == "error"


def test_describe_exit_names_only_a_failed_turns_exit():
    parser = CodexParser()
    assert parser.describe_exit(1) is None  # e.g. SIGINT mid-stream: exit 1 and no error line
    feed(parser, {"type": "error", "message": "unexpected status 403 Forbidden: no"})
    assert parser.describe_exit(2) is None
    assert parser.describe_exit(1) == (
        "API_FORBIDDEN",
        "codex exec failed (exit 1): unexpected status 403 Forbidden: no",
    )
    feed(parser, {"type": "turn.started"})  # the next run starts clean
    assert parser.describe_exit(1) is None


def test_error_items_are_warnings():
    (notice,) = feed(
        CodexParser(), completed({"id": "item_9", "type": "error", "message": "skipped a file"})
    )
    assert isinstance(notice, ev.Notice)
    assert (notice.severity, notice.code, notice.message) == (
        "warning",
        "AGENT_WARNING",
        "skipped a file",
    )


def test_tolerant_of_what_it_does_not_know_and_never_raises():
    parser = CodexParser()
    garbage = [b"", b"not json", b"[1,2]", b'{"type":"item.completed","item":5}', b"\xff\xfe"]
    for raw in garbage:
        (event,) = parser.feed(raw)
        assert isinstance(event, ev.ParseError)
    assert parser.parse_errors == len(garbage)
    unknown = b'{"type":"thread.archived","thread_id":"x"}'
    (event,) = parser.feed(unknown)
    assert isinstance(event, ev.Unknown) and event.kind == "thread.archived"
    assert event.line == unknown
    item = b'{"type":"item.completed","item":{"id":"item_3","type":"collab_tool_call"}}'
    (event,) = parser.feed(item)
    assert isinstance(event, ev.Unknown) and event.kind == "item/collab_tool_call"
    assert parser.feed(line(started({"id": "item_4", "type": "collab_tool_call"}))) == []
    assert parser.unknown_lines == 2
    assert parser.end() == []


# --- through the session machine and the real server ----------------------------------------------


def test_DPS_18_respawn_the_next_prompt_resumes_the_reported_thread():
    """DPS-18-respawn: the first prompt spawns without a resume id; after the CLI reported its
    thread and exited 0, the next prompt spawns with that thread id."""
    machine = SessionMachine(
        "0b7f3c1e-5d2a-4e8f-9a6b-1c2d3e4f5a6b",
        CodexParser(),
        NoInput(),
    )
    machine.config = replace(machine.config, single_turn_process=True)
    first = machine._start_prompt("one", None)
    assert [a for a in first if isinstance(a, Spawn)] == [Spawn(prompt="one", resume_id=None)]
    machine.agent_line(line({"type": "thread.started", "thread_id": "01a2-t"}))
    machine.agent_line(line(usage(10, 1)))
    machine.agent_exited("ok", 0)
    second = machine._start_prompt("two", None)
    assert [a for a in second if isinstance(a, Spawn)] == [Spawn(prompt="two", resume_id="01a2-t")]


def single_turn_machine() -> SessionMachine:
    machine = SessionMachine("0b7f3c1e-5d2a-4e8f-9a6b-1c2d3e4f5a6b", CodexParser(), NoInput())
    machine.config = replace(machine.config, single_turn_process=True)
    return machine


def test_DPS_18_respawn_waits_for_the_previous_process_to_exit():
    """The turn ends at turn.completed, but codex exec is still writing its thread: a prompt then
    opens its turn at once and its process starts only when the previous one exited (two
    processes resuming one thread side by side leave the second with nothing to say)."""
    machine = single_turn_machine()
    machine._start_prompt("one", None)
    machine.agent_line(line({"type": "thread.started", "thread_id": "01a2-t"}))
    machine.agent_line(line(usage(10, 1)))
    assert machine.turn is None and machine.process is not ProcessState.NONE
    waiting = machine._start_prompt("two", None)
    assert machine.turn is not None and not [a for a in waiting if isinstance(a, Spawn)]
    turn_id = machine.turn.turn_id
    assert machine.agent_exited("ok", 0) == [Spawn(prompt="two", resume_id="01a2-t")]
    assert machine.turn is not None and machine.turn.turn_id == turn_id  # still the same turn
    assert machine.process is ProcessState.ALIVE


def test_DPS_6_1_2_cancel_a_prompt_whose_process_has_not_started():
    """DPS-6.1.2-cancel: nothing runs yet, so nothing is signalled: the turn ends cancelled at once
    and the previous process's exit starts nothing."""
    machine = single_turn_machine()
    machine._start_prompt("one", None)
    machine.agent_line(line(usage(10, 1)))
    machine._start_prompt("two", None)
    assert machine.turn is not None
    cancel = F.PromptCancel(target_turn_id=machine.turn.turn_id)
    actions = machine._cancel("c1", cancel, "m1")
    frames = [a.frame for a in actions if isinstance(a, Emit)]
    assert not [a for a in actions if isinstance(a, Signal)]
    end = next(f for f in frames if f.TYPE == "session.turn.end")
    assert end.payload.stop_reason == "cancelled"  # type: ignore[attr-defined]
    assert machine.turn is None
    assert machine.agent_exited("ok", 0) == []


def test_DPS_6_1_2_cancel_the_exit_it_causes_ends_the_turn_cancelled_not_the_session():
    """DPS-6.1.2-cancel on a single-turn agent: SIGINT, and codex exec exits 1 with no line about
    it; that exit is the cancel working, so the turn ends cancelled, no fatal error is sent and
    the next prompt resumes the thread (DPS-18-respawn)."""
    machine = single_turn_machine()
    machine._start_prompt("one", None)
    machine.agent_line(line({"type": "thread.started", "thread_id": "01a2-t"}))
    assert machine.turn is not None
    cancel = F.PromptCancel(target_turn_id=machine.turn.turn_id)
    assert Signal(2) in machine._cancel("c1", cancel, "m1")
    frames = [a.frame for a in machine.agent_exited("error", 1) if isinstance(a, Emit)]
    assert [f.TYPE for f in frames if f.TYPE.startswith("session.")] == [
        "session.turn.end",
        "session.usage",
    ]
    end = next(f for f in frames if f.TYPE == "session.turn.end")
    assert end.payload.stop_reason == "cancelled"  # type: ignore[attr-defined]
    assert not [f for f in frames if f.TYPE == "agent.error"]
    assert machine.lifecycle is Lifecycle.IDLE
    again = machine._start_prompt("two", None)
    assert [a for a in again if isinstance(a, Spawn)] == [Spawn(prompt="two", resume_id="01a2-t")]
    # Without a cancel the same exit is fatal (DPS-17.2.2-exit).
    frames = [a.frame for a in machine.agent_exited("error", 1) if isinstance(a, Emit)]
    assert [f.payload.severity for f in frames if f.TYPE == "agent.error"] == ["fatal"]  # type: ignore[attr-defined]


def test_codex_profile_resume_command_replaces_the_command():
    """``codex exec resume <thread_id> <prompt>``: a subcommand before the prompt, which a flag
    appended to argv cannot say; the profile's resume_command replaces the command instead."""
    profile = builtin_profiles(codex="/bin/codex")["codex"]
    assert profile.single_turn_process and profile.resume_flag is None
    flags = ["--json", "--skip-git-repo-check", "-c", "sandbox_mode=danger-full-access", "--"]
    first = command_for(profile, prompt="-p is a prompt", workspace="/w")
    assert first == ["/bin/codex", "exec", *flags, "-p is a prompt"]
    again = command_for(profile, prompt="next", workspace="/w", resume_id="01a2-t")
    assert again == ["/bin/codex", "exec", "resume", *flags, "01a2-t", "next"]


def test_resume_command_in_a_config_file(tmp_path):
    """A configured profile can say resume_command too; it must be a list (no shell)."""
    good = tmp_path / "good.toml"
    good.write_text(
        '[agents.my-codex]\nparser = "codex"\ncommand = ["codex", "exec", "--json", "{prompt}"]\n'
        "single_turn_process = true\n"
        'resume_command = ["codex", "exec", "resume", "--json", "{session_id}", "{prompt}"]\n'
    )
    profile = load_config(good, environ={}).agents["my-codex"]
    assert profile.resume_command == (
        "codex",
        "exec",
        "resume",
        "--json",
        "{session_id}",
        "{prompt}",
    )
    assert command_for(profile, prompt="p", workspace="/w", resume_id="t")[-2:] == ["t", "p"]
    bad = tmp_path / "bad.toml"
    bad.write_text('[agents.codex]\nresume_command = "codex exec resume {session_id}"\n')
    with pytest.raises(ConfigError, match="resume_command must be a non-empty list"):
        load_config(bad, environ={})


# A stand-in for `codex exec`: like the real CLI it reads a piped stdin to EOF first (so it would
# hang if the gateway left stdin open), then prints Codex lines whose message is its own argv.
FAKE_CODEX = """
import json, sys
sys.stdin.read()
args = sys.argv[1:]
thread = args[args.index("--") + 1] if "resume" in args else "01a2-fake-thread"
def out(o):
    print(json.dumps(o), flush=True)
out({"type": "thread.started", "thread_id": thread})
out({"type": "turn.started"})
out({"type": "item.completed", "item": {"id": "item_0", "type": "agent_message",
     "text": json.dumps(args)}})
out({"type": "turn.completed", "usage": {"input_tokens": 10, "cached_input_tokens": 0,
     "cache_write_input_tokens": 0, "output_tokens": 2, "reasoning_output_tokens": 0}})
"""


async def test_DPS_18_respawn_codex_profile_through_the_server(tmp_path):
    """DPS-18-respawn on the real server with the codex profile's own templates: stdin is closed
    for a prompt given in argv, the first prompt runs ``exec``, the second ``exec resume`` with
    the thread id the first run reported."""
    base = builtin_profiles()["codex"]
    stand_in = (sys.executable, "-c", FAKE_CODEX)
    assert base.resume_command is not None
    profile = replace(
        base,
        command=(*stand_in, *base.command[1:]),
        resume_command=(*stand_in, *base.resume_command[1:]),
    )
    client = await start_gateway(make_config(tmp_path, agents={"codex": profile}))
    try:
        session = await create_session(client, "codex")
        master = await Master.attach(client, session["session_id"])
        argvs = []
        for text in ("first prompt", "second prompt"):
            await master.send("control.prompt.request", {"prompt_text": text})
            done = await master.until("agent.text.done", timeout=20)
            end = await master.until("session.turn.end", timeout=20)
            assert end["payload"]["stop_reason"] == "end_turn"
            assert (await master.next())["type"] == "session.usage"
            argvs.append(json.loads(done["payload"]["full_text"]))
        flags = ["--json", "--skip-git-repo-check", "-c", "sandbox_mode=danger-full-access", "--"]
        assert argvs[0] == ["exec", *flags, "first prompt"]
        assert argvs[1] == ["exec", "resume", *flags, "01a2-fake-thread", "second prompt"]
        info = await (await client.get(f"/v1/session/{session['session_id']}")).json()
        assert info["agent_session_id"] == "01a2-fake-thread"
    finally:
        await client.close()


async def test_an_agent_naming_files_outside_its_workspace_gets_no_diff_of_them(tmp_path):
    """A hostile stand-in Codex (``tests/support/hostile/codex_names_outside_files.py``) run by the real
    server in a session's workspace reports as added a file it wrote there, by a relative path,
    and files outside it: an absolute path, "..", a link it made that leads out, a FIFO it made.
    The first is a diff (read from the agent's cwd, not the gateway's); the others are reported
    without one, their text reaches no master, and the FIFO does not hold the gateway."""
    (tmp_path / "secret.txt").write_text("SECRET\n")
    (tmp_path / "ws").mkdir()
    hostile = HOSTILE / "codex_names_outside_files.py"
    base = builtin_profiles()["codex"]
    profile = replace(base, command=(sys.executable, str(hostile), *base.command[1:]))
    client = await start_gateway(make_config(tmp_path, agents={"codex": profile}))
    try:
        session = await create_session(client, "codex", workspace_path="ws")
        master = await Master.attach(client, session["session_id"])
        start = len(master.frames)
        prompt = str(tmp_path / "secret.txt")
        await master.send("control.prompt.request", {"prompt_text": prompt})
        end = await master.until("session.turn.end", timeout=20)
        assert end["payload"]["stop_reason"] == "end_turn"
        frames = master.frames[start:]
        results = [f["payload"] for f in frames if f["type"] == "tool.invoke.result"]
        assert [r["output_type"] for r in results] == ["diff", "text", "text", "text", "text"]
        assert results[0]["output"] == "--- /dev/null\n+++ hello.txt\n@@ -0,0 +1 @@\n+hello\n"
        assert results[2]["output"] == "add ../secret.txt\n"
        assert not any("SECRET" in json.dumps(f) for f in frames)
    finally:
        await client.close()
