"""Every recorded Codex and Gemini fixture through parser, mapper and session machine, checked frame
by frame: the same checks as ``test_claude_code_fixtures.py``, for the two other agents.

Each fixture (``tests/fixtures/{codex,gemini}/*.jsonl``, recorded from ``@openai/codex@0.171.0`` and
``@google/gemini-cli@0.61.0``) is played into a ``SessionMachine`` the way the shell would: its stdout
lines, then stdout closing and the recorded exit (classified as the process adapter does). The
machine gets the agent's parser and its built-in profile's features, nothing Claude-specific.
Expected values (ids, texts, token counts, statuses) are read from the fixture lines, never copied
by hand.

The parsers read the workspace to diff changed files; the recordings' workspaces are not on this
machine in a known state, so the replay's reader finds no files (``_no_files``): a change is then
reported without a diff, deterministically. Diffs are tested in the parser tests and end to end.
"""

from __future__ import annotations

import functools
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gateway.agent.exit import classify_exit
from gateway.agent.profiles import builtin_profiles
from gateway.cli.translate import translate
from gateway.protocol import codec
from gateway.protocol.actions import Action, Emit
from gateway.protocol.machine import SessionConfig, SessionMachine
from gateway.protocol.states import ProcessState
from parsers.base import NoInput
from parsers.codex import CodexParser
from parsers.gemini import GeminiParser
from tests.support.frame_checks import (
    assert_blocks_joined,
    assert_one_result_per_request,
    assert_states_consistent,
    assert_valid_envelopes,
)
from tests.support.gateway_peer import envelope
from tests.support.paths import FIXTURES
from tests.support.replay import Run, play

CODEX = sorted((FIXTURES / "codex").glob("*.jsonl"))
GEMINI = sorted((FIXTURES / "gemini").glob("*.jsonl"))
ALL = CODEX + GEMINI
SESSION_ID = "7c0de3a1-5d2a-4e8f-9a6b-1c2d3e4f5a6b"
CODEX_TOOL_ITEMS = {"command_execution", "file_change", "mcp_tool_call", "web_search"}


def _no_files(path: str) -> str | None:
    raise FileNotFoundError(path)


@functools.cache
def run_of(path: Path) -> Run:
    """The fixture played as the shell would, with the agent's parser and its built-in profile's
    features; the recorded exit classified as the process adapter does."""
    agent = path.parent.name
    parser = CodexParser(_no_files) if agent == "codex" else GeminiParser(_no_files)
    profile = builtin_profiles()[agent]
    config = SessionConfig(
        agent=agent, features=profile.features, single_turn_process=profile.single_turn_process
    )
    machine = SessionMachine(SESSION_ID, parser, NoInput(), config)

    def exited(meta: dict[str, Any]) -> list[Action]:
        if meta.get("signal"):
            return machine.agent_exited("signal", None, 15 if meta["signal"] == "SIGTERM" else 2)
        status = classify_exit(meta["exit_code"])
        return machine.agent_exited(status.kind, status.returncode, status.signal)

    return play(path, machine, [Emit(machine.capabilities_frame), *machine.start()], exited)


def fixture(agent: str, name: str) -> Run:
    return run_of(FIXTURES / agent / f"{name}.jsonl")


every_fixture = pytest.mark.parametrize("path", ALL, ids=[f"{p.parent.name}/{p.stem}" for p in ALL])
every_codex = pytest.mark.parametrize("path", CODEX, ids=[p.stem for p in CODEX])
every_gemini = pytest.mark.parametrize("path", GEMINI, ids=[p.stem for p in GEMINI])


def test_there_are_fixtures_to_check():
    assert len(CODEX) >= 17 and len(GEMINI) >= 18


# --- every fixture ------------------------------------------------------------------------------


@every_fixture
def test_DPS_2_1_envelope_every_frame_is_valid(path: Path):
    """DPS-2.1-envelope: every frame survives encode → decode as Accepted (zero envelope
    violations), with a UUID v4 message_id and the session's id."""
    assert_valid_envelopes(run_of(path).frames, SESSION_ID)


@every_fixture
def test_DPS_2_1_turn_id_on_every_in_turn_frame(path: Path):
    """DPS-2.1-turn-id and DPS-7.5.1-start: a turn starts before any of its frames and every frame
    up to its usage carries its id."""
    run = run_of(path)
    current: str | None = None
    starts = 0
    for i, frame in enumerate(run.frames):
        if frame.TYPE == "session.turn.start":
            assert current is None
            current = frame.payload.turn_id  # type: ignore[attr-defined]
            assert frame.payload.turn_index == starts  # type: ignore[attr-defined]
            starts += 1
        if current is not None:
            assert frame.turn_id == current, (i, frame.TYPE)
        elif frame.TYPE.startswith(("tool.invoke", "agent.text", "agent.thinking")):
            pytest.fail(f"{frame.TYPE} outside a turn")
        if frame.TYPE == "session.usage" and i and run.frames[i - 1].TYPE == "session.turn.end":
            current = None
    assert starts == 1  # one prompt per process: one turn per recording


@every_fixture
def test_DPS_5_3_1_result_each_request_gets_exactly_one_result_after_it(path: Path):
    """DPS-5.3.1-result: one tool.invoke.result per request, after it, same id and tool name; one
    request per tool item (Codex) or tool_use (Gemini) the CLI printed, in the CLI's order."""
    run = run_of(path)
    assert_one_result_per_request(run.frames)
    if run.agent == "codex":
        expected: list[str] = []
        for o in run.lines:
            item = o.get("item") or {}
            if item.get("type") in CODEX_TOOL_ITEMS and item["id"] not in expected:
                expected.append(item["id"])
    else:
        expected = [o["tool_id"] for o in run.kinds("tool_use")]
    agent_ids = [f.metadata["agent_call_id"] for f in run.of("tool.invoke.request")]
    # web_search items repeat "id": the item's own (first) one names the call.
    assert agent_ids == [_first_item_id(run, i) for i in expected]


def _first_item_id(run: Run, item_id: str) -> str:
    if run.agent != "codex":
        return item_id
    path = FIXTURES / run.agent / f"{run.name}.jsonl"
    for line in path.read_text().splitlines():
        m = re.search(r'"item":\{"id":"([^"]+)"', line)
        if m and f'"{item_id}"' in line:
            return m.group(1)
    return item_id


@every_fixture
def test_DPS_4_1_text_full_text_is_the_joined_deltas(path: Path):
    """DPS-4.1-text and DPS-4.2-thinking: each content block has deltas then exactly one done; text
    done's full_text is the concatenation of its deltas; indexes are unique in the turn."""
    assert_blocks_joined(run_of(path).frames)


@every_codex
def test_DPS_4_1_text_codex_each_message_is_one_delta_and_one_done(path: Path):
    """Codex prints text whole: each agent_message is one delta and one done with its text, each
    reasoning item one thinking delta and done (DPS-4.2-thinking)."""
    run = run_of(path)
    items = [o["item"] for o in run.kinds("item.completed")]
    messages = [i["text"] for i in items if i["type"] == "agent_message"]
    reasoning = [i["text"] for i in items if i["type"] == "reasoning"]
    assert [p.text for p in run.payloads("agent.text.delta")] == messages
    assert [p.full_text for p in run.payloads("agent.text.done")] == messages
    assert [p.text for p in run.payloads("agent.thinking.delta")] == reasoning
    assert len(run.payloads("agent.thinking.done")) == len(reasoning)


@every_gemini
def test_DPS_4_1_text_gemini_blocks_are_runs_of_assistant_deltas(path: Path):
    """Gemini: the prompt's echo is not text; each run of assistant deltas between other lines is
    one block whose full_text is the chunks joined, and no thinking is claimed (the CLI prints
    none)."""
    run = run_of(path)
    blocks: list[str] = []
    current: list[str] | None = None
    for o in run.lines:
        if o["type"] == "message" and o["role"] == "assistant":
            if current is None:
                current = []
                blocks.append("")
            current.append(o["content"])
            blocks[-1] = "".join(current)
        elif o["type"] != "message":
            current = None
    assert [p.full_text for p in run.payloads("agent.text.done")] == blocks
    prompts = [o["content"] for o in run.lines if o.get("role") == "user"]
    assert not {p.text for p in run.payloads("agent.text.delta")} & set(prompts)
    assert not run.of("agent.thinking.delta", "agent.thinking.done")


@every_fixture
def test_DPS_7_5_2_usage_follows_every_turn_end(path: Path):
    """DPS-7.5.2-end and DPS-7.5.2-usage: the turn ends once, counting its requests, and
    session.usage follows it immediately, for that turn."""
    run = run_of(path)
    ends = [i for i, f in enumerate(run.frames) if f.TYPE == "session.turn.end"]
    assert len(ends) == 1
    for i in ends:
        end, after = run.frames[i], run.frames[i + 1]
        assert after.TYPE == "session.usage"
        assert after.turn_id == end.turn_id
        assert after.payload.turn_id == end.turn_id  # type: ignore[attr-defined]
        assert end.payload.tool_invocation_count == len(run.of("tool.invoke.request"))  # type: ignore[attr-defined]


def usage_and_report(path: Path, kind: str) -> tuple[Any, dict[str, Any] | None]:
    """The token usage the fixture's one turn reported, and the first line of ``kind`` the CLI
    reported it in; a turn without that line (failed or cut) reports zero tokens, checked here."""
    run = run_of(path)
    (usage,) = run.payloads("session.usage")
    reports = run.kinds(kind)
    if not reports:
        assert usage.token_usage.input_tokens == usage.token_usage.output_tokens == 0
        return usage.token_usage, None
    return usage.token_usage, reports[0]


@every_codex
def test_DPS_7_3_usage_codex_tokens_come_from_turn_completed(path: Path):
    """DPS-7.3-usage: the usage after the turn is turn.completed's (the first turn a parser sees
    of a thread: its share is all of it), with cached input reported as cache reads and not again
    as input; a failed or cut turn reports zero tokens."""
    usage, completed = usage_and_report(path, "turn.completed")
    if completed is None:
        return
    tokens = completed["usage"]
    assert usage.input_tokens == tokens["input_tokens"] - tokens["cached_input_tokens"]
    assert usage.output_tokens == tokens["output_tokens"]
    assert usage.cache_read_tokens == tokens["cached_input_tokens"]
    assert usage.cache_write_tokens == tokens["cache_write_input_tokens"]
    assert usage.thinking_tokens == tokens["reasoning_output_tokens"]


@every_gemini
def test_DPS_7_3_usage_gemini_tokens_come_from_result_stats(path: Path):
    """DPS-7.3-usage: result.stats → usage (uncached input, output, cache reads, and the tokens
    total_tokens counts beyond input and output as thinking)."""
    usage, result = usage_and_report(path, "result")
    if result is None:
        return
    stats = result["stats"]
    assert usage.input_tokens == stats["input"]
    assert usage.output_tokens == stats["output_tokens"]
    assert usage.cache_read_tokens == stats["cached"]
    assert usage.thinking_tokens == (
        stats["total_tokens"] - stats["input_tokens"] - stats["output_tokens"]
    )


@every_fixture
def test_DPS_5_3_3_output_type_and_status_of_every_result(path: Path):
    """DPS-5.3.1-result / DPS-5.3.3-output-type: statuses are the CLI's (Codex: exit_code 0 or
    not; Gemini: the result's status, success even for a failed shell command), a call whose
    result never came is cancelled at the turn's end, and output types fit the outputs."""
    run = run_of(path)
    by_call = {
        f.metadata["agent_call_id"]: f.payload  # type: ignore[attr-defined]
        for f in run.of("tool.invoke.result")
    }
    requests = {
        f.metadata["agent_call_id"]: f.payload  # type: ignore[attr-defined]
        for f in run.of("tool.invoke.request")
    }
    if run.agent == "codex":
        done = {
            o["item"]["id"]: o["item"]
            for o in run.kinds("item.completed")
            if o["item"]["type"] in CODEX_TOOL_ITEMS
        }
        for call_id, result in by_call.items():
            item = done.get(call_id) or next(
                (i for i in done.values() if i["type"] == "web_search"), None
            )
            if item is None:
                assert result.status == "cancelled"
                continue
            if item["type"] == "command_execution":
                assert result.status == ("success" if item["exit_code"] == 0 else "error")
                assert result.output == item["aggregated_output"]
                assert result.output_type == "text"
            elif item["type"] == "file_change":
                paths = [c["path"] for c in item["changes"]]
                assert result.status == "success"
                assert result.output_type == "text"  # no files to diff in a replay
                assert all(p in result.output for p in paths)
            elif item["type"] == "mcp_tool_call":
                assert requests[call_id].tool_name == f"mcp__{item['server']}__{item['tool']}"
                assert requests[call_id].input == item["arguments"]
                text = "".join(c["text"] for c in item["result"]["content"])
                failed = item["status"] == "failed" or item["error"] is not None
                assert (result.status, result.output, result.output_type) == (
                    "error" if failed else "success",
                    text,
                    "text",
                )
    else:
        finished = {o["tool_id"]: o for o in run.kinds("tool_result")}
        for call_id, result in by_call.items():
            line = finished.get(call_id)
            if line is None:
                assert result.status == "cancelled"
                continue
            assert result.status == line["status"]
            if line["status"] == "error":
                assert result.output == line["error"]["message"]
            elif line.get("output"):
                assert result.output == line["output"]
            if result.tool_name in ("write_file", "replace") and result.status == "success":
                # §5.3.3: a write with no diff to show (a replay has no workspace) is empty
                assert result.output_type in ("diff", "empty")
            else:
                assert result.output_type == "text"
            assert result.duration_ms is not None and result.duration_ms >= 0


@every_fixture
def test_DPS_4_6_state_changes_are_consistent(path: Path):
    """DPS-4.6-state: each agent.state.changed starts from the state the previous one reached and
    uses the reserved states; every run ends idle."""
    assert_states_consistent(run_of(path).frames)


@every_fixture
def test_DPS_12_2_caps_say_what_the_agent_supports(path: Path):
    """DPS-12.2-caps: the capabilities frame comes first and announces the profile's features:
    no subagents, compaction, plan mode or tool streaming for either CLI; thinking only for Codex
    (its reasoning summaries)."""
    run = run_of(path)
    caps = run.frames[0].payload  # type: ignore[attr-defined]
    assert run.frames[0].TYPE == "session.capabilities"
    assert caps.protocol_version == "rawp-dps-1.0"
    features = caps.features
    assert features.adapter_type == "process"
    assert not features.subagent and not features.context_compaction and not features.plan_mode
    assert not features.tool_streaming
    assert bool(features.thinking_stream) == (run.agent == "codex")


@every_fixture
def test_no_line_is_unknown_or_unparsable(path: Path):
    """Every kind the recorded CLI printed is understood: no ParseError, no Unknown."""
    parser = CodexParser(_no_files) if path.parent.name == "codex" else GeminiParser(_no_files)
    for line in path.read_bytes().splitlines():
        parser.feed(line)
    parser.end()
    assert parser.parse_errors == 0
    assert parser.unknown_lines == 0


@every_fixture
def test_DPS_4_4_error_a_failed_exit_is_one_fatal_agent_error(path: Path):
    """DPS-4.4-error and DPS-17.2.2-exit: a non-zero exit gives exactly one fatal agent.error, then
    the session ends (session.deleted); exit 0 gives none and no session end."""
    run = run_of(path)
    fatal = [p for p in run.payloads("agent.error") if p.severity == "fatal"]
    failed = run.meta.get("signal") or run.meta["exit_code"] != 0
    assert len(fatal) == (1 if failed else 0)
    assert bool(run.of("session.deleted")) == bool(failed)
    if failed:
        assert run.frames[-1].TYPE == "session.deleted"


# --- particular fixtures ----------------------------------------------------------------------------


def test_DPS_5_2_request_codex_parallel_commands_share_a_group_and_finish_out_of_order():
    """DPS-5.2-request: items started one right after another share a parallel_group_id; their
    results pair by id although they complete in the other order."""
    run = fixture("codex", "multi-step")
    requests = run.of("tool.invoke.request")
    groups = [f.payload.parallel_group_id for f in requests]  # type: ignore[attr-defined]
    ids = [f.metadata["agent_call_id"] for f in requests]
    assert ids == ["item_1", "item_2", "item_3", "item_4", "item_5"]
    assert groups[1] == groups[2]
    assert len({groups[0], groups[1], groups[3], groups[4]}) == 4
    by_invocation = {f.payload.invocation_id: f.metadata["agent_call_id"] for f in requests}  # type: ignore[attr-defined]
    order = [by_invocation[p.invocation_id] for p in run.payloads("tool.invoke.result")]
    assert order == ["item_1", "item_3", "item_2", "item_4", "item_5"]
    outputs = {by_invocation[p.invocation_id]: p.output for p in run.payloads("tool.invoke.result")}
    assert outputs["item_2"] == "one\ntwo\nthree\n" and outputs["item_3"] == "3 notes.txt\n"


def test_DPS_5_2_request_gemini_calls_printed_together_share_a_group():
    run = fixture("gemini", "edit")
    groups = {f.payload.parallel_group_id for f in run.of("tool.invoke.request")}  # type: ignore[attr-defined]
    assert len(run.of("tool.invoke.request")) == 2 and len(groups) == 1
    run = fixture("gemini", "multi-step")
    groups = {f.payload.parallel_group_id for f in run.of("tool.invoke.request")}  # type: ignore[attr-defined]
    assert len(groups) == 4  # one call per model response


def test_codex_web_search_with_a_repeated_id_key_is_one_call_and_one_result():
    run = fixture("codex", "web-search")
    (request,) = run.of("tool.invoke.request")
    (result,) = run.payloads("tool.invoke.result")
    assert request.metadata["agent_call_id"] == "item_0"
    assert request.payload.tool_name == "web_search"  # type: ignore[attr-defined]
    assert request.payload.input == {"query": "RAWP protocol"}  # type: ignore[attr-defined]
    assert result.status == "success" and result.output_type == "structured"
    assert result.output["query"] == "RAWP protocol"


def test_codex_sandbox_refusals_and_failed_patches_print_no_item_so_no_call():
    """The CLI prints nothing for them: the master sees the answer only, never a dangling call."""
    for name in ("sandbox-denied", "patch-fail"):
        run = fixture("codex", name)
        assert not run.of("tool.invoke.request", "tool.invoke.result")
        assert run.payloads("session.turn.end")[0].stop_reason == "end_turn"


@pytest.mark.parametrize(
    ("name", "code", "status"),
    [
        ("http-400", "API_BAD_REQUEST", 400),
        ("http-401", "API_UNAUTHORIZED", 401),
        ("http-500", "API_ERROR", None),
        ("stream-failed", "STREAM_ERROR", None),
    ],
)
def test_DPS_4_4_error_codex_api_errors_have_readable_codes(name: str, code: str, status: Any):
    """An error line becomes agent.error with a code saying what failed (not the message), the
    turn ends with error, and the exit 1 that follows is named by the same code."""
    run = fixture("codex", name)
    errors = run.payloads("agent.error")
    assert [e.error_code for e in errors] == [code, code]
    first, fatal = errors
    assert first.severity == "error" and fatal.severity == "fatal"
    assert (first.details.http_status if first.details else None) == status
    assert "{" not in first.message  # the API's message, not its JSON body
    assert fatal.details.exit_code == 1 and fatal.details.signal is None
    assert run.payloads("session.turn.end")[0].stop_reason == "error"


@pytest.mark.parametrize(
    ("name", "exit_code", "code"),
    [
        ("http-400", 144, "API_BAD_REQUEST"),
        ("http-429", 173, "API_RATE_LIMITED"),
        ("http-500", 244, "API_SERVER_ERROR"),
    ],
)
def test_DPS_4_4_error_gemini_http_exit_codes_are_named(name: str, exit_code: int, code: str):
    """Gemini exits with the HTTP status cut to 8 bits: the fatal agent.error names the status
    (not "signal 16" for 144), keeps the exit code in details and quotes the API's message."""
    run = fixture("gemini", name)
    assert run.meta["exit_code"] == exit_code
    *_, fatal = run.payloads("agent.error")
    assert fatal.severity == "fatal" and fatal.error_code == code
    assert fatal.details.exit_code == exit_code and fatal.details.signal is None
    result_error = run.kinds("result")[0]["error"]["message"]
    assert str(exit_code) in fatal.message
    assert any(word in result_error for word in fatal.message.split(": ")[-1].split()[:3])


@pytest.mark.parametrize(
    ("name", "code"), [("empty-response", "EMPTY_RESPONSE"), ("stream-error", "STREAM_ERROR")]
)
def test_gemini_error_events_end_the_turn_with_error_but_keep_the_session(name: str, code: str):
    run = fixture("gemini", name)
    (error,) = run.payloads("agent.error")
    assert error.error_code == code and error.severity == "error"
    assert run.payloads("session.turn.end")[0].stop_reason == "error"
    assert not run.of("session.deleted")


def test_gemini_failing_shell_command_is_a_success_as_the_cli_says():
    run = fixture("gemini", "shell-fail")
    (result,) = run.payloads("tool.invoke.result")
    assert result.status == "success"
    assert "No such file or directory" in result.output


def test_gemini_thinking_is_not_streamed_but_counted():
    run = fixture("gemini", "thinking")
    assert not run.of("agent.thinking.delta")
    assert run.payloads("session.usage")[0].token_usage.thinking_tokens == 18


@pytest.mark.parametrize("agent", ["codex", "gemini"])
def test_SessionStarted_gives_the_resume_id(agent: str):
    """thread.started / init carry the id the next prompt resumes with (DPS-18-respawn)."""
    path = FIXTURES / agent / "resume.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    expected = lines[0].get("thread_id") or lines[0].get("session_id")
    parser = CodexParser(_no_files) if agent == "codex" else GeminiParser(_no_files)
    machine = SessionMachine(SESSION_ID, parser, NoInput())
    for line in path.read_bytes().splitlines():
        machine.agent_line(line)
    assert machine.agent_session_id == expected


# --- rawp-gateway translate -------------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL, ids=[f"{p.parent.name}/{p.stem}" for p in ALL])
def test_translate_agent_codex_and_gemini(path: Path):
    """``rawp-gateway translate --agent codex|gemini``: every line understood, every frame a valid
    DPS frame, the exit code (``--exit-code``) handled like the server does."""
    meta = json.loads(path.with_suffix(".meta.json").read_text())
    out, err = io.BytesIO(), io.StringIO()
    bad = translate(
        path.read_bytes().splitlines(),
        out,
        agent=path.parent.name,
        session_id=SESSION_ID,
        exit_code=meta["exit_code"] or 0,
        err=err,
    )
    assert bad == 0, err.getvalue()
    frames = [codec.decode(line) for line in out.getvalue().splitlines()]
    assert frames and all(isinstance(f, codec.Accepted) for f in frames)
    types = [f.frame.TYPE for f in frames]  # type: ignore[union-attr]
    assert types[0] == "session.capabilities"
    assert types.count("session.turn.end") == 1
    assert types[types.index("session.turn.end") + 1] == "session.usage"


# --- what the profiles say they cannot do ------------------------------------------------------------


@pytest.mark.parametrize("agent", ["codex", "gemini"])
def test_DPS_6_3_1_compact_and_DPS_6_3_2_mode_are_not_supported(agent: str):
    """DPS-6.3.1-compact / DPS-6.3.2-mode: neither CLI has compaction or a plan mode the gateway
    can drive in a one-prompt process, so the profile says so and masters get the spec's
    COMPACTION_NOT_SUPPORTED / MODE_NOT_SUPPORTED (fatal: false), and nothing is spawned."""
    profile = builtin_profiles()[agent]
    config = SessionConfig(
        agent=agent, features=profile.features, single_turn_process=profile.single_turn_process
    )
    parser = CodexParser(_no_files) if agent == "codex" else GeminiParser(_no_files)
    machine = SessionMachine(SESSION_ID, parser, NoInput(), config)
    for type_, payload, code in (
        ("control.session.compact", {}, "COMPACTION_NOT_SUPPORTED"),
        ("control.mode.switch", {"mode": "plan"}, "MODE_NOT_SUPPORTED"),
    ):
        actions = machine.receive("c1", json.dumps(envelope(SESSION_ID, type_, payload)))
        errors = [
            a.frame.payload  # type: ignore[attr-defined]
            for a in actions
            if isinstance(a, Emit) and a.frame.TYPE == "session.error"
        ]
        assert [(e.error_code, e.fatal) for e in errors] == [(code, False)]
        assert machine.turn is None and machine.process is ProcessState.NONE
