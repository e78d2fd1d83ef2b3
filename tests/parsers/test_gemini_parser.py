"""The Gemini parser line by line (what ``gemini -p ... --output-format stream-json`` prints, shapes
from the recorded fixtures under ``tests/fixtures/gemini/``), and the exit-code naming the
session machine takes from a parser (``describe_exit``)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.agent.exit import classify_exit
from gateway.agent.profiles import builtin_profiles, command_for, template_args
from gateway.protocol.actions import Emit
from gateway.protocol.machine import SessionMachine
from parsers import events as ev
from parsers.base import NoInput
from parsers.base import get as get_parser
from parsers.claude_code import ClaudeCodeInput, ClaudeCodeParser
from parsers.gemini import GeminiParser
from tests.support.parsing import Files, feed, line, whole_text

TS0 = "2026-11-29T21:20:54.185Z"
TS1 = "2026-11-29T21:20:54.624Z"


def say(text: str, *, delta: bool | None = True, role: str = "assistant") -> dict[str, Any]:
    obj: dict[str, Any] = {"type": "message", "timestamp": TS0, "role": role, "content": text}
    if delta is not None:
        obj["delta"] = delta
    return obj


def tool_use(tool_id: str, name: str, **params: Any) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "timestamp": TS0,
        "tool_name": name,
        "tool_id": tool_id,
        "parameters": params,
    }


def tool_result(tool_id: str, status: str = "success", **kw: Any) -> dict[str, Any]:
    return {"type": "tool_result", "timestamp": TS1, "tool_id": tool_id, "status": status, **kw}


def stats(total: int, i: int, o: int, cached: int = 0) -> dict[str, Any]:
    return {
        "total_tokens": total,
        "input_tokens": i,
        "output_tokens": o,
        "cached": cached,
        "input": i - cached,
        "duration_ms": 10,
        "tool_calls": 0,
    }


def test_spec_is_registered_as_gemini():
    spec = get_parser("gemini")
    assert isinstance(spec.parser(), GeminiParser)
    assert isinstance(spec.input(), NoInput)


def test_init_is_the_agent_session_id_and_model():
    (event,) = feed(
        GeminiParser(),
        {"type": "init", "timestamp": TS0, "session_id": "d76f-1", "model": "gemini-2.5-flash"},
    )
    assert event == ev.SessionStarted(agent_session_id="d76f-1", model="gemini-2.5-flash")


def test_DPS_4_1_text_the_prompt_echo_is_skipped_and_chunks_make_one_block():
    parser = GeminiParser()
    events = feed(
        parser,
        say("Run echo.", delta=None, role="user"),
        say("I will "),
        say("run it."),
        tool_use("t0", "run_shell_command", command="echo hi"),
        tool_result("t0", output="hi"),
        say("It said "),
        say("hi."),
    )
    events += parser.end()
    texts = [
        (type(e).__name__, getattr(e, "block", None), getattr(e, "text", None)) for e in events
    ]
    assert texts == [
        ("TextDelta", "text-1", "I will "),
        ("TextDelta", "text-1", "run it."),
        ("TextEnd", "text-1", None),
        ("ToolCall", None, None),
        ("ToolResult", None, None),
        ("TextDelta", "text-2", "It said "),
        ("TextDelta", "text-2", "hi."),
    ]  # stdout closed without a result: the last block is the mapper's to end with the turn


def test_a_whole_assistant_message_is_a_block_of_its_own():
    events = feed(GeminiParser(), say("Part "), say("Whole answer.", delta=None))
    assert events == whole_text("text-1", "Part ") + whole_text("text-2", "Whole answer.")


def test_DPS_5_3_1_result_pairs_by_tool_id_with_the_duration_between_the_lines():
    events = feed(
        GeminiParser(),
        tool_use("a", "read_file", file_path="/w/x"),
        tool_use("b", "read_file", file_path="/w/missing"),
        tool_result("a", output=""),
        tool_result(
            "b",
            "error",
            output="File not found.",
            error={"type": "file_not_found", "message": "File not found: /w/missing"},
        ),
    )
    call_a, call_b, result_a, result_b = events
    assert isinstance(call_a, ev.ToolCall) and isinstance(call_b, ev.ToolCall)
    assert call_a.group == call_b.group is not None  # printed together: issued together
    assert call_a.input == {"file_path": "/w/x"}
    assert isinstance(result_a, ev.ToolResult) and result_a.call_id == "a"
    assert not result_a.is_error and result_a.output == "" and result_a.duration_ms == 439
    assert isinstance(result_b, ev.ToolResult) and result_b.is_error
    assert result_b.output == "File not found: /w/missing"


def test_timestamps_with_and_without_a_time_zone_give_no_duration():
    parser = GeminiParser(read_file=Files("/w/").read)
    feed(parser, {**tool_use("t1", "list_directory"), "timestamp": "2026-01-01T00:00:00Z"})
    (result,) = feed(parser, {**tool_result("t1"), "timestamp": "2026-01-01T00:00:01"})
    assert isinstance(result, ev.ToolResult) and result.duration_ms is None


def test_a_failing_shell_command_stays_a_success_as_the_cli_reports_it():
    """The CLI says ``success`` and prints no exit code: the gateway does not guess otherwise; the
    master sees the command's error text as its output."""
    _, result = feed(
        GeminiParser(),
        tool_use("s", "run_shell_command", command="ls /nope"),
        tool_result("s", output="ls: cannot access '/nope': No such file or directory"),
    )
    assert isinstance(result, ev.ToolResult)
    assert not result.is_error and "No such file" in result.output


def test_DPS_5_3_3_output_type_writes_are_diffs_read_from_the_workspace():
    files = Files("/w/", **{"notes.txt": "alpha\nbeta\n"})
    parser = GeminiParser(files.read)
    feed(
        parser,
        tool_use("r", "replace", file_path="/w/notes.txt", old_string="beta", new_string="gamma"),
        tool_use("w", "write_file", file_path="/w/hello.txt", content="hello\n"),
    )
    files.files["/w/notes.txt"] = "alpha\ngamma\n"
    files.files["/w/hello.txt"] = "hello\n"
    replaced, written = feed(parser, tool_result("r"), tool_result("w"))
    assert isinstance(replaced, ev.ToolResult) and isinstance(written, ev.ToolResult)
    assert replaced.output_type == written.output_type == "diff"
    assert replaced.changed and written.changed
    assert replaced.output == (
        "--- /w/notes.txt\n+++ /w/notes.txt\n@@ -1,2 +1,2 @@\n alpha\n-beta\n+gamma\n"
    )
    assert written.output == "--- /dev/null\n+++ /w/hello.txt\n@@ -0,0 +1 @@\n+hello\n"
    # Written with what it already held: nothing to diff, and no diff claimed.
    feed(parser, tool_use("w2", "write_file", file_path="/w/hello.txt", content="hello\n"))
    (same,) = feed(parser, tool_result("w2"))
    assert isinstance(same, ev.ToolResult) and same.output_type is None
    assert same.output == "write_file /w/hello.txt"


def test_writes_are_read_in_the_workspace_the_agent_runs_in_and_only_there(tmp_path, monkeypatch):
    """Told its workspace (the agent's cwd): a relative path is read there, not in the gateway's
    cwd; a write outside it (absolute, "..", a link out) is reported without a diff, and what the
    outside file held is in no event, even when the write changed it."""
    (tmp_path / "secret.txt").write_text("SECRET\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("alpha\n")
    (ws / "link.txt").symlink_to(tmp_path / "secret.txt")
    monkeypatch.chdir(tmp_path)  # the gateway's cwd
    parser = GeminiParser()
    parser.set_workspace(str(ws))
    feed(parser, tool_use("w", "write_file", file_path="notes.txt", content="beta\n"))
    (ws / "notes.txt").write_text("beta\n")
    (inside,) = feed(parser, tool_result("w"))
    assert isinstance(inside, ev.ToolResult) and inside.output_type == "diff"
    assert inside.output == "--- notes.txt\n+++ notes.txt\n@@ -1 +1 @@\n-alpha\n+beta\n"

    outside = [str(tmp_path / "secret.txt"), "../secret.txt", "link.txt", "a\0b"]
    events: list[ev.AgentEvent] = []
    for n, path in enumerate(outside):
        events += feed(parser, tool_use(f"o{n}", "write_file", file_path=path, content="x\n"))
        (tmp_path / "secret.txt").write_text(f"written {n}\n")
        events += feed(parser, tool_result(f"o{n}"))
        (tmp_path / "secret.txt").write_text("SECRET\n")
    results = [e for e in events if isinstance(e, ev.ToolResult)]
    assert [r.output for r in results] == [f"write_file {p}" for p in outside]
    assert all(r.output_type is None for r in results)  # §5.3.3 decides: no diff claimed
    assert not any("SECRET" in repr(e) or "written" in repr(e) for e in events)


def test_write_todos_result_is_the_list():
    todos = [{"description": "read", "status": "completed"}]
    _, result = feed(
        GeminiParser(), tool_use("t", "write_todos", todos=todos), tool_result("t", output="ok")
    )
    assert isinstance(result, ev.ToolResult)
    assert result.output == todos and result.output_type == "structured"


def test_DPS_7_3_usage_from_result_stats():
    (ended,) = feed(
        GeminiParser(),
        {"type": "result", "timestamp": TS1, "status": "success", "stats": stats(170, 120, 12, 20)},
    )
    assert isinstance(ended, ev.TurnEnded) and ended.stop_reason == "end_turn"
    assert ended.usage == ev.UsageInfo(
        input_tokens=100, output_tokens=12, cache_read_tokens=20, thinking_tokens=38
    )


@pytest.mark.parametrize(
    ("message", "code", "status", "text"),
    [
        (
            '[API Error: {"error":{"code":400,"message":"Request contains an invalid argument.",'
            '"status":"INVALID_ARGUMENT"}}]',
            "API_BAD_REQUEST",
            400,
            "Request contains an invalid argument.",
        ),
        (
            "[API Error: Resource has been exhausted (e.g. check quota).]\nPlease wait.",
            "API_RATE_LIMITED",
            429,
            "Resource has been exhausted (e.g. check quota).\nPlease wait.",
        ),
        ("something odd", "API_ERROR", None, "something odd"),
    ],
)
def test_DPS_4_4_error_a_failed_result_is_a_notice_with_a_readable_code(
    message, code, status, text
):
    notice, ended = feed(
        GeminiParser(),
        {
            "type": "result",
            "timestamp": TS1,
            "status": "error",
            "error": {"type": "unknown", "message": message},
            "stats": stats(0, 0, 0),
        },
    )
    assert isinstance(notice, ev.Notice)
    assert (notice.code, notice.http_status, notice.message) == (code, status, text)
    assert notice.severity == "error" and not notice.recoverable
    assert isinstance(ended, ev.TurnEnded) and ended.stop_reason == "error" and ended.is_error


def test_error_events_are_notices_with_the_clis_severity():
    warning, error, empty = feed(
        GeminiParser(),
        {"type": "error", "timestamp": TS0, "severity": "warning", "message": "Loop detected"},
        {
            "type": "error",
            "timestamp": TS0,
            "severity": "error",
            "message": "Model stream ended without a finish reason.",
        },
        {
            "type": "error",
            "timestamp": TS0,
            "severity": "error",
            "message": "The model returned an empty response with no text or thoughts.",
        },
    )
    assert isinstance(warning, ev.Notice) and warning.severity == "warning" and warning.recoverable
    assert isinstance(error, ev.Notice) and error.code == "STREAM_ERROR"
    assert isinstance(empty, ev.Notice) and empty.code == "EMPTY_RESPONSE"


def test_tolerant_of_what_it_does_not_know_and_never_raises():
    parser = GeminiParser()
    for raw in (b"", b"{", b"[]", b'{"type":"tool_use","parameters":3}', b"\x80"):
        (event,) = parser.feed(raw)
        assert isinstance(event, ev.ParseError)
    (event,) = parser.feed(b'{"type":"stats","x":1}')
    assert isinstance(event, ev.Unknown) and event.kind == "stats"
    assert (parser.parse_errors, parser.unknown_lines) == (5, 1)


# --- exit codes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exit_code", "code", "says"),
    [
        (144, "API_BAD_REQUEST", "HTTP 400"),
        (145, "API_UNAUTHORIZED", "HTTP 401"),
        (173, "API_RATE_LIMITED", "HTTP 429"),
        (244, "API_SERVER_ERROR", "HTTP 500"),
        (247, "API_UNAVAILABLE", "HTTP 503"),
        (41, "AUTH_ERROR", "authentication"),
        (42, "INPUT_ERROR", "not accepted"),
        (44, "SANDBOX_ERROR", "sandbox"),
        (52, "CONFIG_ERROR", "configuration"),
        (53, "TURN_LIMIT", "turn limit"),
        (54, "TOOL_ERROR", "tool"),
        (55, "UNTRUSTED_FOLDER", "not trusted"),
        (130, "CANCELLED", "cancelled"),
    ],
)
def test_describe_exit_names_the_clis_exit_codes(exit_code: int, code: str, says: str):
    named = GeminiParser().describe_exit(exit_code)
    assert named is not None
    assert named[0] == code and says in named[1] and str(exit_code) in named[1]


@pytest.mark.parametrize("exit_code", [1, 2, 17, 127, 255])
def test_describe_exit_leaves_other_codes_generic(exit_code: int):
    assert GeminiParser().describe_exit(exit_code) is None


def test_describe_exit_quotes_only_the_error_of_the_run_that_exited():
    parser = GeminiParser()
    failed = {"type": "result", "status": "error", "error": {"message": "[API Error: quota]"}}
    feed(parser, {"type": "init", "session_id": "s1", "model": "m"}, failed)
    parser.end()
    assert parser.describe_exit(173) is not None and "quota" in parser.describe_exit(173)[1]
    feed(parser, {"type": "init", "session_id": "s1", "model": "m"})  # the next run, resumed
    parser.end()
    named = parser.describe_exit(41)
    assert named is not None and named[0] == "AUTH_ERROR" and "quota" not in named[1]


def gemini_run(exit_code: int, *lines: dict[str, Any], parser: Any = None) -> list[Any]:
    machine = SessionMachine(
        "0b7f3c1e-5d2a-4e8f-9a6b-1c2d3e4f5a6b", parser or GeminiParser(), NoInput()
    )
    actions = []
    for obj in lines:
        actions += machine.agent_line(line(obj))
    actions += machine.agent_stdout_closed()
    status = classify_exit(exit_code)
    actions += machine.agent_exited(status.kind, status.returncode, status.signal, "stderr tail")
    return [a.frame for a in actions if isinstance(a, Emit)]


def test_DPS_17_2_2_exit_a_named_exit_code_gives_the_fatal_agent_error_its_code():
    """Exit 144 would be "signal 16" by the 128+N rule; Gemini's parser says it is HTTP 400, and
    the fatal agent.error says so, quoting the API's message; the exit code stays in details."""
    frames = gemini_run(
        144,
        {"type": "init", "timestamp": TS0, "session_id": "s1", "model": "m"},
        {
            "type": "result",
            "timestamp": TS1,
            "status": "error",
            "error": {
                "type": "unknown",
                "message": '[API Error: {"error":{"code":400,'
                '"message":"Bad thing.","status":"INVALID_ARGUMENT"}}]',
            },
            "stats": stats(0, 0, 0),
        },
    )
    errors = [f.payload for f in frames if f.TYPE == "agent.error"]
    assert [(e.error_code, e.severity) for e in errors] == [
        ("API_BAD_REQUEST", "error"),
        ("API_BAD_REQUEST", "fatal"),
    ]
    fatal = errors[1]
    assert fatal.message.startswith("gemini exited 144: the model API answered HTTP 400")
    assert fatal.message.endswith(": Bad thing.")
    assert fatal.details.exit_code == 144 and fatal.details.signal is None
    assert fatal.details.stderr == "stderr tail" and not fatal.recoverable
    assert [f.TYPE for f in frames][-1] == "session.deleted"


def test_DPS_17_2_2_exit_an_unnamed_code_and_a_parser_without_names_stay_generic():
    frames = gemini_run(1, {"type": "init", "timestamp": TS0, "session_id": "s1"})
    (error,) = [f.payload for f in frames if f.TYPE == "agent.error"]
    assert error.error_code == "AGENT_EXIT" and error.details.exit_code == 1
    # Claude Code's parser names no codes: 144 is 128+16 there, as DPS-17.2.2 says.
    machine = SessionMachine(
        "0b7f3c1e-5d2a-4e8f-9a6b-1c2d3e4f5a6b", ClaudeCodeParser(), ClaudeCodeInput()
    )
    status = classify_exit(144)
    (emit, *_) = machine.agent_exited(status.kind, status.returncode, status.signal)
    assert isinstance(emit, Emit)
    payload = emit.frame.payload  # type: ignore[attr-defined]
    assert payload.error_code == "SIGNAL_EXIT" and payload.details.signal == 16


def test_gemini_profile_resumes_with_its_flag():
    profile = builtin_profiles(gemini="/bin/gemini")["gemini"]
    assert profile.single_turn_process and profile.resume_command is None
    argv = command_for(profile, prompt="- hi {x}", workspace="/w")
    # one argument that a leading "-" cannot turn into an option (checked with the real CLI)
    assert argv[0] == "/bin/gemini" and argv[-1] == "--prompt=- hi {x}"
    assert {"--output-format", "stream-json", "--skip-trust"} <= set(argv)
    assert argv[argv.index("--approval-mode") + 1] == "yolo"
    assert profile.resume_flag is not None
    assert template_args(profile.resume_flag, session_id="d76f") == ["--resume", "d76f"]
