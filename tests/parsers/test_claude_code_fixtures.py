"""Every recorded Claude Code fixture through parser, mapper and session machine, checked frame by frame.

Each fixture (``tests/fixtures/claude-code/*.jsonl``, recorded from the real CLI 2.1.328) is played
into a ``SessionMachine`` the way the shell would: its stdout lines, then stdout closing and the
recorded exit. The emitted frames are then checked as sequences against the rules named in the test
names (conformance IDs). Expected values (token counts, tool names, ids) are read from the fixture
lines themselves, never copied by hand.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.actions import Emit
from gateway.protocol.factory import FrameFactory
from gateway.protocol.machine import SessionMachine
from gateway.protocol.mapper import Mapper
from parsers import events as ev
from parsers.claude_code import ClaudeCodeInput, ClaudeCodeParser
from tests.support.frame_checks import (
    UUID4,
    assert_blocks_joined,
    assert_one_result_per_request,
    assert_states_consistent,
    assert_valid_envelopes,
)
from tests.support.paths import FIXTURES

FIXTURES = FIXTURES / "claude-code"
ALL = sorted(FIXTURES.glob("*.jsonl"))
SESSION_ID = "0b7f3c1e-5d2a-4e8f-9a6b-1c2d3e4f5a6b"


@dataclass
class Run:
    name: str
    lines: list[dict[str, Any]]
    meta: dict[str, Any]
    frames: list[F.Frame] = field(default_factory=list)

    def of(self, *types: str) -> list[F.Frame]:
        return [f for f in self.frames if f.TYPE in types]

    def payloads(self, *types: str) -> list[Any]:
        return [f.payload for f in self.of(*types)]  # type: ignore[attr-defined]

    def line_kinds(self, kind: str, subtype: str | None = None) -> list[dict[str, Any]]:
        return [
            o
            for o in self.lines
            if o.get("type") == kind and (subtype is None or o.get("subtype") == subtype)
        ]


def play(path: Path) -> Run:
    """Drive a session machine with the fixture as the shell would and collect what it emits."""
    raw = path.read_bytes().splitlines()
    meta = json.loads(path.with_suffix(".meta.json").read_text())
    run = Run(path.stem, [json.loads(line) for line in raw if line.strip()], meta)
    machine = SessionMachine(SESSION_ID, ClaudeCodeParser(), ClaudeCodeInput())
    actions = machine.start()
    for line in raw:
        actions += machine.agent_line(line)
    actions += machine.agent_stdout_closed()
    code = meta["exit_code"]
    if meta.get("signal") or (code is not None and code > 128):
        actions += machine.agent_exited("signal", code, meta.get("signal") or code - 128)
    else:
        actions += machine.agent_exited("ok" if code == 0 else "error", code)
    run.frames = [a.frame for a in actions if isinstance(a, Emit)]
    return run


_RUNS: dict[Path, Run] = {}


def run_of(path: Path) -> Run:
    if path not in _RUNS:
        _RUNS[path] = play(path)
    return _RUNS[path]


def fixture(name: str) -> Run:
    return run_of(FIXTURES / f"{name}.jsonl")


every_fixture = pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])


def test_there_are_fixtures_to_check():
    assert len(ALL) >= 40


# --- every fixture ------------------------------------------------------------------------------


@every_fixture
def test_DPS_2_1_envelope_every_frame_is_valid(path: Path):
    """DPS-2.1-envelope: every frame survives encode → decode as Accepted, with a UUID v4
    message_id and the session's id."""
    assert_valid_envelopes(run_of(path).frames, SESSION_ID)


@every_fixture
def test_DPS_2_1_turn_id_on_every_in_turn_frame(path: Path):
    """DPS-2.1-turn-id: every frame from a turn's start to its usage carries that turn's id."""
    run = run_of(path)
    current: str | None = None
    for i, frame in enumerate(run.frames):
        if frame.TYPE == "session.turn.start":
            current = frame.payload.turn_id  # type: ignore[attr-defined]
        if current is not None:
            assert frame.turn_id == current, (i, frame.TYPE)
        if frame.TYPE == "session.usage" and i and run.frames[i - 1].TYPE == "session.turn.end":
            current = None


@every_fixture
def test_DPS_5_3_1_result_each_request_gets_exactly_one_result_after_it(path: Path):
    """DPS-5.3.1-result: one tool.invoke.result per request, after it, same id and tool name."""
    run = run_of(path)
    assert_one_result_per_request(run.frames)
    # One request per tool_use block the CLI printed.
    tool_uses = [
        b["id"]
        for o in run.line_kinds("assistant")
        for b in o["message"]["content"]
        if b.get("type") == "tool_use"
    ]
    agent_ids = [f.metadata["agent_call_id"] for f in run.of("tool.invoke.request")]
    assert agent_ids == tool_uses


@every_fixture
def test_DPS_4_1_text_full_text_is_the_joined_deltas(path: Path):
    """DPS-4.1-text and DPS-4.2-thinking: per turn, each content block has deltas then exactly one
    done; text done's full_text is the concatenation of its deltas; indexes are unique in a turn."""
    assert_blocks_joined(run_of(path).frames)


@every_fixture
def test_DPS_4_1_text_is_said_once_with_or_without_partial_messages(path: Path):
    """The text the master gets is the text of the CLI's assistant blocks, each exactly once
    (with partial messages the assistant lines must not repeat the streamed text)."""
    run = run_of(path)
    expected = []
    for o in run.lines:
        if o["type"] == "assistant" and not o.get("is_api_error_message"):
            expected += [b["text"] for b in o["message"]["content"] if b.get("type") == "text"]
        elif o["type"] == "user" and isinstance(o["message"]["content"], str):
            # A slash command's output, printed by the CLI itself.
            expected += re.findall(
                r"<local-command-stdout>(.*?)</local-command-stdout>", o["message"]["content"], re.S
            )
    got = [p.full_text for p in run.payloads("agent.text.done")]
    assert got == expected
    thinking = [
        b["thinking"]
        for o in run.line_kinds("assistant")
        for b in o["message"]["content"]
        if b.get("type") == "thinking"
    ]
    assert len(run.of("agent.thinking.done")) == len(thinking)
    assert "".join(p.text for p in run.payloads("agent.thinking.delta")) == "".join(thinking)


@every_fixture
def test_DPS_7_5_2_usage_follows_every_turn_end(path: Path):
    """DPS-7.5.2-usage: session.usage right after each session.turn.end, for that turn; every turn
    that started ends (DPS-7.5.2-end)."""
    run = run_of(path)
    starts = [p.turn_id for p in run.payloads("session.turn.start")]
    ends = []
    for i, frame in enumerate(run.frames):
        if frame.TYPE == "session.turn.end":
            ends.append(frame.payload.turn_id)  # type: ignore[attr-defined]
            after = run.frames[i + 1]
            assert after.TYPE == "session.usage"
            assert after.payload.turn_id == frame.payload.turn_id  # type: ignore[attr-defined]
    assert ends == starts


@every_fixture
def test_DPS_7_5_2_end_counts_and_usage_come_from_the_result_lines(path: Path):
    """session.turn.end counts the turn's requests; session.usage carries the result line's tokens
    (cache and thinking included), cost and num_turns, and the model's context window."""
    run = run_of(path)
    results = run.line_kinds("result")
    usages = run.payloads("session.usage")
    main_usages = [
        u
        for f, u in zip(run.of("session.usage"), usages, strict=True)
        if "subagent_context" not in (f.metadata or {})
    ]
    if not results:
        return
    assert len(main_usages) == len(results)
    for line, usage in zip(results, main_usages, strict=True):
        tokens = line["usage"]
        assert usage.token_usage.input_tokens == tokens["input_tokens"]
        assert usage.token_usage.output_tokens == tokens["output_tokens"]
        assert usage.token_usage.cache_read_tokens == tokens["cache_read_input_tokens"]
        assert usage.token_usage.cache_write_tokens == tokens["cache_creation_input_tokens"]
        thinking = tokens["output_tokens_details"]["thinking_tokens"]
        assert usage.token_usage.thinking_tokens == thinking
        assert usage.cost_usage.used == line["total_cost_usd"]
        assert usage.cost_usage.unit == "USD"
        assert usage.message_usage.used == line["num_turns"]
        windows = [m["contextWindow"] for m in line["modelUsage"].values()]
        if windows:
            assert usage.context_window.capacity == max(windows)
    requests = run.of("tool.invoke.request")
    ends = run.payloads("session.turn.end")
    assert sum(e.tool_invocation_count for e in ends) == len(requests)


@every_fixture
def test_DPS_10_3_order_subagent_started_and_ended_around_its_frames(path: Path):
    """DPS-10.3-order and DPS-10.1-request: a subagent request is followed at once by
    agent.subagent.started; agent.subagent.ended comes right before its agent_result; every frame
    with its context lies between the two."""
    run = run_of(path)
    for i, frame in enumerate(run.frames):
        if frame.TYPE != "tool.invoke.request" or frame.payload.subagent is None:  # type: ignore[attr-defined]
            continue
        request = frame.payload  # type: ignore[attr-defined]
        inv = request.invocation_id
        assert request.subagent.agent_type == request.input.get("subagent_type", "general-purpose")
        assert request.subagent.description == request.input["description"]
        started = run.frames[i + 1]
        assert started.TYPE == "agent.subagent.started"
        assert started.payload.parent_invocation_id == inv  # type: ignore[attr-defined]
        (r,) = [
            j
            for j, f in enumerate(run.frames)
            if f.TYPE == "tool.invoke.result" and f.payload.invocation_id == inv  # type: ignore[attr-defined]
        ]
        ended = run.frames[r - 1]
        assert ended.TYPE == "agent.subagent.ended"
        assert ended.payload.parent_invocation_id == inv  # type: ignore[attr-defined]
        assert run.frames[r].payload.output_type == "agent_result"  # type: ignore[attr-defined]
        inner = [
            j
            for j, f in enumerate(run.frames)
            if (f.metadata or {}).get("subagent_context") is not None
            and f.metadata["subagent_context"].parent_invocation_id == inv
        ]
        assert inner, "a subagent with no frames of its own"
        assert all(i + 1 < j < r - 1 for j in inner)


@every_fixture
def test_DPS_10_2_context_exactly_on_frames_from_inside_a_subagent(path: Path):
    """DPS-10.2-context: a request made by a line with parent_tool_use_id carries
    subagent_context (parent = the Agent call's invocation, depth 1); main-agent requests none."""
    run = run_of(path)
    parent_of = {
        b["id"]: o.get("parent_tool_use_id")
        for o in run.line_kinds("assistant")
        for b in o["message"]["content"]
        if b.get("type") == "tool_use"
    }
    invocation_of = {
        f.metadata["agent_call_id"]: f.payload.invocation_id  # type: ignore[attr-defined]
        for f in run.of("tool.invoke.request")
    }
    for frame in run.of("tool.invoke.request", "tool.invoke.result"):
        call_id = frame.metadata["agent_call_id"]
        context = frame.metadata.get("subagent_context")
        parent = parent_of[call_id]
        if parent is None:
            assert context is None
        else:
            assert context.parent_invocation_id == invocation_of[parent]
            assert context.depth == 1
    for frame in run.of("session.turn.end", "tool.catalog.publish", "session.turn.start"):
        assert "subagent_context" not in (frame.metadata or {})
    # Text: each block is from inside a subagent exactly when its assistant line was.
    expected = [
        o.get("parent_tool_use_id") is not None
        for o in run.line_kinds("assistant")
        if not o.get("is_api_error_message")
        for b in o["message"]["content"]
        if b.get("type") == "text"
    ]
    got = [
        "subagent_context" in (f.metadata or {})
        for f in run.of("agent.text.done")
        if (f.metadata or {}).get("content_role") != "command_output"
    ]
    assert got == expected


@every_fixture
def test_DPS_5_3_3_output_type_and_status_of_every_result(path: Path):
    """DPS-5.3.3-output-type: success results typed by the catalog/category rule; status from
    is_error; the tools' own shapes (Glob paths, Read text, TodoWrite list)."""
    run = run_of(path)
    for frame in run.of("tool.invoke.result"):
        p = frame.payload  # type: ignore[attr-defined]
        assert p.status in ("success", "error", "timeout", "cancelled")
        if p.status != "success":
            continue
        expected = {
            "Read": "file_content",
            "Glob": "file_list",
            "Bash": "text",
            "TodoWrite": "structured",
            "Agent": "agent_result",
            "Edit": "diff",
            "Write": "diff",
        }.get(p.tool_name)
        if expected:
            assert p.output_type == expected, p.tool_name
        if p.tool_name == "Glob":
            assert isinstance(p.output, list)
        if p.tool_name == "TodoWrite":
            assert all("content" in todo for todo in p.output)


@every_fixture
def test_DPS_5_4_catalog_and_DPS_12_1_commands_from_init(path: Path):
    """DPS-5.4-catalog, DPS-12.1-commands: the first init's tools and slash commands are published,
    each tool with a description; published again only when an init changes them."""
    run = run_of(path)
    inits = run.line_kinds("system", "init")
    if not inits:
        assert not run.of("tool.catalog.publish")
        return
    catalogs = run.payloads("tool.catalog.publish")
    commands = run.payloads("agent.commands.publish")
    assert [t.name for t in catalogs[0].tools] == inits[0]["tools"]
    assert all(t.description for t in catalogs[0].tools)
    assert [c.name for c in commands[0].commands] == inits[0]["slash_commands"]
    distinct_tools = {json.dumps(o["tools"]) for o in inits}
    assert len(catalogs) == len(distinct_tools)
    assert len(commands) == len({json.dumps(o["slash_commands"]) for o in inits})


@every_fixture
def test_DPS_4_6_state_changes_are_consistent(path: Path):
    """DPS-4.6-state: each agent.state.changed starts from the state the previous one reached and
    uses the reserved states; every turn ends idle."""
    assert_states_consistent(run_of(path).frames)


@every_fixture
def test_no_line_is_unknown_or_unparsable(path: Path):
    """Every kind the recorded CLI printed is understood: no ParseError, no Unknown."""
    parser = ClaudeCodeParser()
    for line in path.read_bytes().splitlines():
        parser.feed(line)
    parser.end()
    assert parser.parse_errors == 0
    assert parser.unknown_lines == 0


# --- particular fixtures ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["parallel", "parallel--partial"])
def test_DPS_5_2_request_parallel_calls_share_one_group(name: str):
    """DPS-5.2-request: the calls of one API message (same message.id) share a parallel_group_id."""
    run = fixture(name)
    by_message: dict[str, list[str]] = {}
    for o in run.line_kinds("assistant"):
        for b in o["message"]["content"]:
            if b.get("type") == "tool_use":
                by_message.setdefault(o["message"]["id"], []).append(b["id"])
    (calls,) = [c for c in by_message.values() if len(c) > 1]
    assert len(calls) == 3
    group = {
        f.metadata["agent_call_id"]: f.payload.parallel_group_id  # type: ignore[attr-defined]
        for f in run.of("tool.invoke.request")
    }
    assert len({group[c] for c in calls}) == 1
    assert UUID4.match(group[calls[0]])


@pytest.mark.parametrize("name", ["tool-edit", "tool-edit--partial"])
def test_edit_result_is_a_real_unified_diff(name: str):
    """Edit's structuredPatch becomes a unified diff (``---``/``+++``/``@@``) with its lines."""
    run = fixture(name)
    (edit,) = [p for p in run.payloads("tool.invoke.result") if p.tool_name == "Edit"]
    assert edit.output_type == "diff"
    lines = edit.output.splitlines()
    assert lines[0].startswith("--- ") and lines[1].startswith("+++ ")
    assert lines[2].startswith("@@ -")
    patch = next(
        o["tool_use_result"]["structuredPatch"]
        for o in run.line_kinds("user")
        if isinstance(o.get("tool_use_result"), dict) and "structuredPatch" in o["tool_use_result"]
    )
    assert lines[3:] == patch[0]["lines"]
    h = patch[0]
    assert lines[2] == f"@@ -{h['oldStart']},{h['oldLines']} +{h['newStart']},{h['newLines']} @@"


def test_write_of_a_new_file_is_a_creation_diff():
    run = fixture("tool-write")
    (write,) = run.payloads("tool.invoke.result")
    content = run.line_kinds("user")[0]["tool_use_result"]["content"]
    assert write.output_type == "diff"
    assert write.output.startswith("--- /dev/null\n+++ ")
    assert [line[1:] for line in write.output.splitlines()[3:]] == content.splitlines()


def test_glob_result_lists_paths_and_its_duration():
    run = fixture("tool-glob-grep")
    glob_line = next(
        o for o in run.line_kinds("user") if "filenames" in (o.get("tool_use_result") or {})
    )
    glob = next(p for p in run.payloads("tool.invoke.result") if p.tool_name == "Glob")
    assert glob.output == glob_line["tool_use_result"]["filenames"]
    assert glob.duration_ms == glob_line["tool_use_result"]["durationMs"]
    grep = next(p for p in run.payloads("tool.invoke.result") if p.tool_name == "Grep")
    assert grep.output_type == "text"  # output_mode content


@pytest.mark.parametrize("name", ["compact-manual", "compact-auto"])
def test_DPS_7_2_compacted_once_with_the_recorded_token_counts(name: str):
    """DPS-7.2-compacted, DPS-6.3.1-auto: one session.compacted with the boundary's trigger and
    token counts and the summary's text."""
    run = fixture(name)
    (boundary,) = run.line_kinds("system", "compact_boundary")
    (compacted,) = run.payloads("session.compacted")
    meta = boundary["compact_metadata"]
    assert compacted.previous_token_count == meta["pre_tokens"]
    assert compacted.current_token_count == meta["post_tokens"]
    assert compacted.trigger == meta["trigger"]
    summary_line = next(o for o in run.line_kinds("user") if o.get("isSynthetic"))
    if name == "compact-manual":
        (output,) = [f for f in run.of("agent.text.done") if f.metadata]
        assert output.metadata == {"content_role": "command_output"}
    content = summary_line["message"]["content"]
    text = content if isinstance(content, str) else content[0]["text"]
    assert compacted.summary and compacted.summary in text


@pytest.mark.parametrize(
    "name",
    [
        "interrupt-stream",
        "interrupt-stream--partial",
        "interrupt-tool",
        "interrupt-tool--partial",
        "interrupt-continue",
        "sigint",
    ],
)
def test_DPS_6_1_2_cancel_interrupted_turns_end_cancelled(name: str):
    """DPS-6.1.2-cancel: an interrupted turn ends ``cancelled``; its cut text is done with
    is_cancelled; an interrupted tool's result is ``cancelled``."""
    run = fixture(name)
    first_end = run.payloads("session.turn.end")[0]
    assert first_end.stop_reason == "cancelled"
    aborted = [o for o in run.line_kinds("assistant") if o.get("aborted")]
    dones = run.payloads("agent.text.done")
    if aborted:
        assert dones[0].is_cancelled is True
    for result in run.payloads("tool.invoke.result"):
        assert result.status == "cancelled"


@pytest.mark.parametrize(
    "name",
    ["api-error-400", "api-error-401", "api-error-500", "api-error-529", "api-stream-error-start"],
)
def test_DPS_4_4_error_api_errors_become_agent_error(name: str):
    """DPS-4.4-error: the synthetic API error message → agent.error severity error with the HTTP
    status; the turn ends with ``error``."""
    run = fixture(name)
    (result,) = run.line_kinds("result")
    errors = [p for p in run.payloads("agent.error") if p.error_code == "API_ERROR"]
    assert len(errors) == 1
    assert errors[0].severity == "error" and errors[0].recoverable is False
    assert errors[0].details.http_status == result["api_error_status"]
    assert errors[0].message == result["result"]
    assert run.payloads("session.turn.end")[0].stop_reason == "error"
    assert not run.of("agent.text.delta"), "the synthetic message is not model text"


@pytest.mark.parametrize("name", ["api-retry-success", "api-error-401", "api-error-529"])
def test_api_retry_is_a_recoverable_warning(name: str):
    run = fixture(name)
    retries = run.line_kinds("system", "api_retry")
    warnings = [p for p in run.payloads("agent.error") if p.error_code == "API_RETRY"]
    assert len(warnings) == len(retries)
    for line, warning in zip(retries, warnings, strict=True):
        assert warning.severity == "warning" and warning.recoverable is True
        assert warning.details.http_status == line["error_status"]


@pytest.mark.parametrize("name", ["permission-denied", "plan-mode"])
def test_permission_denied_is_visible_and_the_tool_gets_one_error_result(name: str):
    run = fixture(name)
    (denied,) = run.line_kinds("system", "permission_denied")
    (notice,) = [p for p in run.payloads("agent.error") if p.error_code == "PERMISSION_DENIED"]
    (result,) = run.payloads("tool.invoke.result")
    assert notice.details.related_tool == denied["tool_name"]
    assert notice.details.related_invocation_id == result.invocation_id
    assert result.status == "error"


def test_DPS_4_3_interaction_permission_request_from_can_use_tool():
    """DPS-4.3-interaction: can_use_tool → agent.interaction.request PERMISSION with the tool's
    name, input and affected paths, after the tool's request."""
    run = fixture("permission-prompt")
    asked = [o["request"] for o in run.line_kinds("control_request")]
    interactions = run.payloads("agent.interaction.request")
    assert len(interactions) == len(asked)
    for req, interaction in zip(asked, interactions, strict=True):
        assert interaction.interaction_type == "PERMISSION"
        assert interaction.context.tool_name == req["tool_name"]
        assert interaction.context.tool_input == req["input"]
        expected = [req["input"][k] for k in ("file_path",) if k in req["input"]]
        expected += [req["blocked_path"]] if "blocked_path" in req else []
        assert interaction.context.affected_paths == expected


@pytest.mark.parametrize("name", ["subagent-background", "subagent-background--partial"])
def test_DPS_10_5_usage_background_subagent_reported_with_its_context(name: str):
    """DPS-10.5-usage: the background subagent's task_notification usage is its own session.usage
    with subagent_context, before ended; the held Agent result carries the subagent's summary."""
    run = fixture(name)
    (note,) = run.line_kinds("system", "task_notification")
    sub_usage = [f for f in run.of("session.usage") if "subagent_context" in (f.metadata or {})]
    assert len(sub_usage) == 1
    assert sub_usage[0].metadata["total_tokens"] == note["usage"]["total_tokens"]
    types = [f.TYPE for f in run.frames]
    i = run.frames.index(sub_usage[0])
    assert types[i + 1 : i + 3] == ["agent.subagent.ended", "tool.invoke.result"]
    ended, result = run.frames[i + 1].payload, run.frames[i + 2].payload  # type: ignore[attr-defined]
    assert ended.duration_ms == note["usage"]["duration_ms"]
    assert result.output["text"] == note["summary"]
    # The CLI's second result line (its own turn after the notification) is reported as usage.
    assert len(run.line_kinds("result")) == 2


def test_DPS_10_5_usage_foreground_subagent_from_its_result():
    run = fixture("subagent")
    agent_result = next(
        o["tool_use_result"]
        for o in run.line_kinds("user")
        if isinstance(o.get("tool_use_result"), dict) and "agentId" in o["tool_use_result"]
    )
    (usage,) = [f for f in run.of("session.usage") if "subagent_context" in (f.metadata or {})]
    assert usage.payload.token_usage.input_tokens == agent_result["usage"]["input_tokens"]  # type: ignore[attr-defined]
    ended = run.payloads("agent.subagent.ended")[0]
    assert ended.status == "completed"
    assert ended.duration_ms == agent_result["totalDurationMs"]


def test_subagent_progress_becomes_tool_invoke_stream():
    """DPS-5.3.2-stream: task_progress → tool.invoke.stream progress on the Agent call, 0-based."""
    run = fixture("subagent")
    progress = run.line_kinds("system", "task_progress")
    streams = run.payloads("tool.invoke.stream")
    assert [s.chunk for s in streams] == [p["description"] for p in progress]
    assert [s.sequence for s in streams] == list(range(len(streams)))
    assert all(s.stream_type == "progress" and s.tool_name == "Agent" for s in streams)


def test_partial_and_whole_transcripts_give_the_same_frames():
    """With and without --include-partial-messages the same things are said, in the same order:
    only the number of deltas differs."""
    for partial in sorted(FIXTURES.glob("*--partial.jsonl")):
        whole = partial.with_name(partial.name.replace("--partial", ""))
        if not whole.exists():
            continue
        skip = {"agent.text.delta", "agent.thinking.delta", "agent.state.changed"}
        a = [f.TYPE for f in run_of(partial).frames if f.TYPE not in skip]
        b = [f.TYPE for f in run_of(whole).frames if f.TYPE not in skip]
        assert a == b, partial.stem


def test_agent_session_id_is_kept():
    """§18.3: the CLI's session_id is kept for --resume."""
    run_fixture = FIXTURES / "resume.jsonl"
    machine = SessionMachine(SESSION_ID, ClaudeCodeParser(), ClaudeCodeInput())
    machine.start()
    for line in run_fixture.read_bytes().splitlines():
        machine.agent_line(line)
    assert (
        machine.agent_session_id == fixture("resume").line_kinds("system", "init")[0]["session_id"]
    )


# --- any order of real lines ------------------------------------------------------------------------

_ALL_LINES = sorted({line for p in ALL for line in p.read_bytes().splitlines() if line.strip()})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_ALL_LINES), max_size=40))
def test_DPS_5_3_1_result_holds_for_real_lines_in_any_order(lines: list[bytes]):
    """Parser and mapper never raise on real CLI lines in any order and mix, and every request
    still gets exactly one result by the end of its turn (DPS-5.3.1-result, DPS-4.1-text)."""
    parser = ClaudeCodeParser()
    mapper = Mapper(FrameFactory(SESSION_ID))
    turns = (f"6a1b2c3d-4e5f-4a6b-8c7d-{n:012d}" for n in range(1000))
    mapper.begin_turn(next(turns))
    frames: list[F.Frame] = []
    for line in lines:
        for event in parser.feed(line):
            if isinstance(event, ev.TurnEnded):
                frames += mapper.end_turn(event.stop_reason, event)
                mapper.begin_turn(next(turns))
            else:
                frames += mapper.map(event)
    for event in parser.end():
        frames += mapper.map(event)
    frames += mapper.end_turn("error")
    requests = Counter(
        p.invocation_id for p in (f.payload for f in frames) if isinstance(p, F.InvokeRequest)
    )
    results = Counter(
        p.invocation_id for p in (f.payload for f in frames) if isinstance(p, F.InvokeResult)
    )
    assert results == requests
    parts: dict[tuple[str | None, int], list[str]] = {}
    done: set[tuple[str | None, int]] = set()
    for frame in frames:
        assert isinstance(codec.decode(codec.encode(frame)), codec.Accepted)
        payload = frame.payload  # type: ignore[attr-defined]
        if isinstance(payload, F.TextDelta | F.ThinkingDelta):
            key = (frame.turn_id, payload.content_index)
            assert key not in done
            parts.setdefault(key, []).append(payload.text)
        elif isinstance(payload, F.TextDone | F.ThinkingDone):
            key = (frame.turn_id, payload.content_index)
            assert key in parts and key not in done
            done.add(key)
            if isinstance(payload, F.TextDone):
                assert payload.full_text == "".join(parts[key])
    assert done == set(parts)
    # DPS-10.3-order holds whatever the order of the lines.
    for i, frame in enumerate(frames):
        payload = frame.payload  # type: ignore[attr-defined]
        if isinstance(payload, F.InvokeRequest) and payload.subagent is not None:
            assert isinstance(frames[i + 1].payload, F.SubagentStarted)  # type: ignore[attr-defined]
        if isinstance(payload, F.InvokeResult) and payload.output_type == "agent_result":
            ended = frames[i - 1].payload  # type: ignore[attr-defined]
            assert isinstance(ended, F.SubagentEnded)
            assert ended.parent_invocation_id == payload.invocation_id
