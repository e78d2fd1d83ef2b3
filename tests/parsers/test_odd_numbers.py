"""Odd numbers in the line that ends a turn, for every parser: the turn still ends.

A recorded fixture of each agent is played again with one cost or token field of its last line
(Claude Code's ``result``, Codex's ``turn.completed``, Gemini's ``result``, the ACP prompt's
answer and ``usage_update``) replaced by an odd value: the wrong type, not finite (``NaN``,
``Infinity``, ``1e400`` as the raw JSON text), negative, past 64 bits, a float where a count
belongs. The turn ends (``session.turn.end``, DPS-7.5.2-end), the ``session.usage`` after it has
that field as 0 and every other field as the agent reported it (DPS-7.5.2-usage), the machine
logs what it dropped, and neither the usage tally nor a budget takes anything odd.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from gateway.agent.profiles import builtin_profiles
from gateway.cli.translate import translate
from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.actions import Action, Emit, Log
from gateway.protocol.budget import Ledger, Limits
from gateway.protocol.machine import SessionConfig, SessionMachine
from gateway.protocol.usage import UsageTally, reported_cost, usage_payload
from parsers import events as ev
from parsers import numbers
from parsers.base import NoInput
from parsers.claude_code import ClaudeCodeInput, ClaudeCodeParser
from parsers.codex import CodexParser
from parsers.gemini import GeminiParser
from parsers.plain import PlainParser
from tests.support.paths import FIXTURES

SESSION_ID = "0dd0dd00-5d2a-4e8f-9a6b-1c2d3e4f5a6b"
MARK = "@@odd@@"

# Raw JSON texts: NaN, Infinity and 1e400 are what Python's json prints for non-finite floats (and
# what msgspec refuses to decode); the others decode but are the wrong type or out of range.
ODD_COSTS = ['"5"', "NaN", "Infinity", "-Infinity", "1e400", "-1", "true", "1e12", "[1]", "{}"]
ODD_COUNTS = [
    '"5"',
    "NaN",
    "Infinity",
    "1e400",
    "-3",
    "1.5",
    "12.0",
    "99999999999999999999999",
    str(2**60),
    "true",
    "[1]",
]


def _no_files(path: str) -> str | None:
    raise FileNotFoundError(path)


def with_odd(raw: bytes, path: tuple[str, ...], odd: str) -> bytes:
    """The JSON line ``raw`` with the field at ``path`` replaced by the raw JSON text ``odd``."""
    obj = json.loads(raw)
    at = obj
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = MARK
    return json.dumps(obj).replace(f'"{MARK}"', odd).encode()


def fixture_lines(agent: str, name: str) -> list[bytes]:
    return [line for line in (FIXTURES / agent / f"{name}.jsonl").read_bytes().splitlines() if line]


def play(machine: SessionMachine, lines: list[bytes], started: list[Action]) -> list[Action]:
    """The lines as the shell feeds them, then stdout closing and a clean exit."""
    actions = list(started)
    for line in lines:
        actions += machine.agent_line(line)
    actions += machine.agent_stdout_closed()
    actions += machine.agent_exited("ok", 0)
    return actions


def frames_of(actions: list[Action]) -> list[F.Frame]:
    return [a.frame for a in actions if isinstance(a, Emit)]


def dropped_logs(actions: list[Action]) -> list[Log]:
    return [a for a in actions if isinstance(a, Log) and "numbers dropped" in a.message]


def the_usage_after_the_end(frames: list[F.Frame]) -> F.Usage:
    """DPS-7.5.2-end/usage: one turn end, and the session.usage right after it, for that turn."""
    ends = [i for i, f in enumerate(frames) if f.TYPE == "session.turn.end"]
    assert len(ends) == 1, [f.TYPE for f in frames]
    after = frames[ends[0] + 1]
    assert after.TYPE == "session.usage"
    assert isinstance(after.payload, F.Usage)
    return after.payload


def assert_nothing_odd_counted(usage: F.Usage) -> None:
    """The usage tally and a budget fed this session.usage stay finite and whole."""
    tally = UsageTally()
    tally.add(usage)
    for name in UsageTally.__slots__:
        value = getattr(tally, name)
        assert value is None or (math.isfinite(value) and value >= 0), (name, value)
    # The budget takes the running total the frame says, then a good one after it: it counts the
    # good one's increase as it would have with no odd report before it.
    book = Ledger(Limits(session_usd=10.0, user_daily_usd=10.0))
    cost = reported_cost(usage) or 0.0
    assert 0.0 <= cost <= 1.0
    book.report("s1", "ann", cost, "2026-12-07")
    book.report("s1", "ann", 2.0, "2026-12-07")
    assert book.sessions["s1"].spent == pytest.approx(2.0)
    assert book.users["ann"].spent == pytest.approx(2.0)


# --- Claude Code --------------------------------------------------------------------------------


def claude_run(field: tuple[str, ...], odd: str) -> tuple[list[Action], dict[str, Any]]:
    lines = fixture_lines("claude-code", "text")
    (at,) = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "result"]
    result = json.loads(lines[at])
    lines[at] = with_odd(lines[at], field, odd)
    machine = SessionMachine(SESSION_ID, ClaudeCodeParser(), ClaudeCodeInput())
    return play(machine, lines, machine.start()), result


@pytest.mark.parametrize("odd", ODD_COSTS)
def test_DPS_7_5_2_end_claude_code_result_with_an_odd_cost_ends_the_turn(odd: str):
    actions, result = claude_run(("total_cost_usd",), odd)
    usage = the_usage_after_the_end(frames_of(actions))
    assert usage.cost_usage.used == 0.0
    assert usage.token_usage.input_tokens == result["usage"]["input_tokens"]
    assert usage.token_usage.output_tokens == result["usage"]["output_tokens"]
    assert usage.message_usage.used == result["num_turns"]
    (logged,) = dropped_logs(actions)
    assert "total_cost_usd" in logged.fields["fields"]
    assert_nothing_odd_counted(usage)


@pytest.mark.parametrize("odd", ODD_COUNTS)
@pytest.mark.parametrize("field", ["input_tokens", "output_tokens", "cache_read_input_tokens"])
def test_DPS_7_5_2_end_claude_code_result_with_an_odd_token_count_ends_the_turn(
    field: str, odd: str
):
    actions, result = claude_run(("usage", field), odd)
    usage = the_usage_after_the_end(frames_of(actions))
    tokens = usage.token_usage
    got = {
        "input_tokens": tokens.input_tokens,
        "output_tokens": tokens.output_tokens,
        "cache_read_input_tokens": tokens.cache_read_tokens or 0,
    }
    assert got.pop(field) == 0
    assert got == {k: result["usage"][k] for k in got}
    assert usage.cost_usage.used == result["total_cost_usd"]
    (logged,) = dropped_logs(actions)
    assert f"usage.{field}" in logged.fields["fields"]
    assert_nothing_odd_counted(usage)


# --- Codex and Gemini ---------------------------------------------------------------------------


def codex_gemini_run(agent: str, kind: str, field: tuple[str, ...], odd: str):
    lines = fixture_lines(agent, "text")
    (at,) = [i for i, line in enumerate(lines) if json.loads(line)["type"] == kind]
    reported = json.loads(lines[at])
    lines[at] = with_odd(lines[at], field, odd)
    parser = CodexParser(_no_files) if agent == "codex" else GeminiParser(_no_files)
    profile = builtin_profiles()[agent]
    config = SessionConfig(
        agent=agent, features=profile.features, single_turn_process=profile.single_turn_process
    )
    machine = SessionMachine(SESSION_ID, parser, NoInput(), config)
    return play(machine, lines, machine.start()), reported


CODEX_FIELDS = ["input_tokens", "cached_input_tokens", "output_tokens", "reasoning_output_tokens"]


@pytest.mark.parametrize("odd", ODD_COUNTS)
@pytest.mark.parametrize("field", CODEX_FIELDS)
def test_DPS_7_5_2_end_codex_turn_completed_with_an_odd_count_ends_the_turn(field: str, odd: str):
    actions, completed = codex_gemini_run("codex", "turn.completed", ("usage", field), odd)
    usage = the_usage_after_the_end(frames_of(actions))
    reported = {**completed["usage"], field: 0}
    tokens = usage.token_usage
    assert tokens.input_tokens == max(0, reported["input_tokens"] - reported["cached_input_tokens"])
    assert tokens.output_tokens == reported["output_tokens"]
    assert tokens.cache_read_tokens == reported["cached_input_tokens"]
    assert tokens.thinking_tokens == reported["reasoning_output_tokens"]
    (logged,) = dropped_logs(actions)
    assert f"usage.{field}" in logged.fields["fields"]
    assert_nothing_odd_counted(usage)


@pytest.mark.parametrize("odd", ['"x"', "7", "[]"])
def test_codex_turn_completed_with_a_usage_that_is_no_object_ends_the_turn(odd: str):
    actions, _ = codex_gemini_run("codex", "turn.completed", ("usage",), odd)
    usage = the_usage_after_the_end(frames_of(actions))
    assert usage.token_usage.input_tokens == usage.token_usage.output_tokens == 0
    assert dropped_logs(actions)


@pytest.mark.parametrize("odd", ODD_COUNTS)
@pytest.mark.parametrize("field", ["input", "output_tokens", "cached", "total_tokens"])
def test_DPS_7_5_2_end_gemini_result_with_an_odd_count_ends_the_turn(field: str, odd: str):
    actions, result = codex_gemini_run("gemini", "result", ("stats", field), odd)
    usage = the_usage_after_the_end(frames_of(actions))
    stats = result["stats"]
    tokens = usage.token_usage
    if field == "output_tokens":
        assert tokens.output_tokens == 0
        assert tokens.input_tokens == stats["input"]
    elif field == "input":  # then the uncached input is input_tokens - cached
        assert tokens.input_tokens == stats["input_tokens"] - stats["cached"]
    elif field == "cached":
        assert tokens.cache_read_tokens == 0
    else:  # total_tokens: nothing beyond input and output is thinking
        assert tokens.thinking_tokens == 0
    assert f"stats.{field}" in dropped_logs(actions)[0].fields["fields"]
    assert_nothing_odd_counted(usage)


# --- ACP ----------------------------------------------------------------------------------------


def acp_run(where: Callable[[dict[str, Any]], bool], field: tuple[str, ...], odd: str):
    """The recorded ACP transcript translated with one field of the first message ``where``
    picks replaced by ``odd``: its frames, and what translate said of the lines with a problem
    (the machine's warnings)."""
    lines = fixture_lines("acp", "claude-bash")
    at = next(i for i, line in enumerate(lines) if where(json.loads(line)))
    lines[at] = with_odd(lines[at], field, odd)
    out, err = io.BytesIO(), io.StringIO()
    bad = translate(lines, out, agent="acp", session_id="s-acp", err=err)
    frames = [codec.decode(line).frame for line in out.getvalue().splitlines()]  # type: ignore[union-attr]
    said = err.getvalue().splitlines()
    assert bad == len(said) == 1, said
    return frames, said[0]


def _prompt_answer(o: dict[str, Any]) -> bool:
    return "stopReason" in (o.get("result") or {})


def _usage_update(o: dict[str, Any]) -> bool:
    update = (o.get("params") or {}).get("update") or {}
    return update.get("sessionUpdate") == "usage_update"


@pytest.mark.parametrize("odd", ODD_COUNTS)
@pytest.mark.parametrize("field", ["inputTokens", "outputTokens", "totalTokens"])
def test_DPS_7_5_2_end_acp_prompt_answer_with_an_odd_count_ends_the_turn(field: str, odd: str):
    frames, said = acp_run(_prompt_answer, ("result", "usage", field), odd)
    usage = the_usage_after_the_end(frames)
    ends = [f.payload for f in frames if f.TYPE == "session.turn.end"]
    assert [e.stop_reason for e in ends] == ["end_turn"]  # type: ignore[attr-defined]
    if field == "inputTokens":
        assert usage.token_usage.input_tokens == 0
    elif field == "outputTokens":
        assert usage.token_usage.output_tokens == 0
    assert not [f for f in frames if f.TYPE == "agent.error"]
    assert "numbers dropped" in said and f"usage.{field}" in said
    assert_nothing_odd_counted(usage)


@pytest.mark.parametrize("odd", ODD_COSTS)
def test_DPS_7_5_2_end_acp_usage_update_with_an_odd_cost_ends_the_turn(odd: str):
    frames, said = acp_run(_usage_update, ("params", "update", "cost", "amount"), odd)
    usage = the_usage_after_the_end(frames)
    assert usage.cost_usage.used == 0.0
    assert "numbers dropped" in said and "cost.amount" in said
    assert_nothing_odd_counted(usage)


@pytest.mark.parametrize("odd", ODD_COUNTS)
@pytest.mark.parametrize("field", ["used", "size"])
def test_acp_usage_update_with_an_odd_context_count_ends_the_turn(field: str, odd: str):
    frames, said = acp_run(_usage_update, ("params", "update", field), odd)
    usage = the_usage_after_the_end(frames)
    window = usage.context_window
    assert window is None or getattr(window, "capacity" if field == "size" else "used") is None
    assert "numbers dropped" in said
    assert_nothing_odd_counted(usage)


# --- plain, and the numbers where every agent's meet ---------------------------------------------


@pytest.mark.parametrize("text", ["NaN", "1e400", '{"total_cost_usd": NaN}'])
def test_plain_text_that_looks_like_an_odd_number_is_text(text: str):
    """The plain parser reports no numbers at all: such a line is text like any other."""
    parser = PlainParser()
    (delta,) = parser.feed(text.encode())
    assert isinstance(delta, ev.TextDelta) and delta.text == text + "\n"


@pytest.mark.parametrize("cost", [math.nan, math.inf, -math.inf, -1.0, 1e300])
def test_session_usage_never_carries_an_odd_number_a_plugin_let_through(cost: float):
    """Checked again where every agent's numbers meet, for a plugin (a third-party one) that
    reports them as it read them."""
    ended = ev.TurnEnded(
        stop_reason="end_turn",
        usage=ev.UsageInfo(input_tokens=-5, output_tokens=2**80, thinking_tokens=-1),
        cost_usd=cost,
        num_turns=-2,
        context_window=-1,
        context_used=10,
    )
    usage = usage_payload(ended, "t1")
    assert usage.cost_usage.used == 0.0
    assert usage.message_usage.used == 0
    assert usage.token_usage.input_tokens == usage.token_usage.output_tokens == 0
    assert usage.token_usage.thinking_tokens is None
    assert usage.context_window is not None and usage.context_window.capacity is None
    assert_nothing_odd_counted(usage)


def test_a_line_with_many_odd_numbers_names_a_bounded_few():
    line = json.dumps({"type": "result", "junk": [MARK] * 1000}).replace(f'"{MARK}"', "NaN")
    again = numbers.without_odd_numbers(line.encode())
    assert again is not None
    fixed, names = again
    assert json.loads(fixed)["junk"] == [None] * 1000
    assert len(names) == numbers.MAX_NAMES


def test_a_line_refused_for_something_else_is_not_read_again():
    assert numbers.without_odd_numbers(b'{"type": "result", "x": 1}') is None
    assert numbers.without_odd_numbers(b"not json NaN") is None
