"""Fuzzing the input edges: the frame codec and the session machine with random and mutated frames,
each agent parser (through the mapper and the machine) with random and mutated agent lines. Deep
nesting, numbers beyond a double, invalid UTF-8 and values of the wrong type: no exception escapes,
and every frame that comes out is a valid frame (it decodes as ``Accepted``) within max_frame_size.

Real lines and frames are the seeds: the recorded CLI fixtures, and frames derived from the
payload types (``tests/support/strategies.py``). Example counts stay moderate so the suite stays fast.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import builtin_profiles
from gateway.protocol import actions as act
from gateway.protocol import codec
from gateway.protocol import machine as sm
from gateway.protocol.factory import FrameFactory
from parsers.base import get as get_parser
from parsers.json_depth import MAX_JSON_DEPTH, too_deep
from tests.support.paths import FIXTURES
from tests.support.strategies import deep_json, hostile_values, mutated, payloads

SESSION = "0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a"
FIXTURES = FIXTURES
MAX_FRAME_SIZE = 64 * 1024
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _lines(agent: str) -> list[bytes]:
    return sorted(
        {
            line
            for path in (FIXTURES / agent).glob("*.jsonl")
            for line in path.read_bytes().splitlines()
            if line.strip()
        }
    )


LINES = {agent: _lines(agent) for agent in ("claude-code", "codex", "gemini")}
LINES["plain"] = [b"hello", b"", b"\tcolumns\tand tabs", "d\u00e9j\u00e0 vu".encode()]


def assert_conforming(actions: list[act.Action]) -> None:
    """Every frame the machine emits is valid (DPS-2.1-envelope) and within max_frame_size."""
    for action in actions:
        if isinstance(action, act.Emit):
            data = codec.encode(action.frame)
            assert len(data) <= MAX_FRAME_SIZE, (action.frame.TYPE, len(data))
            assert isinstance(codec.decode(data), codec.Accepted), action.frame.TYPE


# --- the depth measure itself ------------------------------------------------------------------------


@given(
    st.integers(0, 300),
    st.sampled_from(["[", '{"k":']),
    st.text(st.characters(codec="utf-8", min_codepoint=32, exclude_characters='"\\'), max_size=5),
)
def test_too_deep_measures_nesting_outside_strings(depth, opener, noise):
    closer = "]" if opener == "[" else "}"
    # brackets inside strings (escaped quotes included) do not count
    text = f'["{noise}", "[[[{{{{\\"", ' + opener * depth + "1" + closer * depth + "]"
    if depth < 100:
        msgspec.json.decode(text)  # the test's own JSON is valid
    assert too_deep(text) == (depth + 1 > MAX_JSON_DEPTH)
    assert too_deep(text.encode()) == (depth + 1 > MAX_JSON_DEPTH)


# --- frames from a master ----------------------------------------------------------------------------

_factory = FrameFactory(SESSION)
frame_bytes = payloads.map(lambda p: codec.encode(_factory.frame(p)))


@st.composite
def hostile_frames(draw: st.DrawFn) -> bytes:
    seed = draw(frame_bytes)
    return draw(mutated([seed]))


@FUZZ
@given(hostile_frames() | deep_json | hostile_values)
def test_codec_and_machine_never_raise_on_hostile_frames(data):
    got = codec.decode(data)
    assert isinstance(got, codec.Accepted | codec.Rejected | codec.Ignored)
    if isinstance(got, codec.Rejected):
        assert got.error.error_code in ("INVALID_FRAME", "UNSUPPORTED_VERSION")
    if isinstance(got, codec.Accepted):  # what is accepted conforms: it round-trips
        assert isinstance(codec.decode(codec.encode(got.frame)), codec.Accepted)
    spec = get_parser("claude-code")
    machine = sm.SessionMachine(
        SESSION,
        spec.parser(),
        spec.input(),
        sm.SessionConfig(max_frame_size=MAX_FRAME_SIZE),
    )
    machine.start()
    assert_conforming(machine.receive("c1", data))
    if isinstance(data, bytes):
        assert_conforming(machine.receive("c1", data.decode("utf-8", "surrogateescape")))


# --- lines from an agent -------------------------------------------------------------------------------


def _machine(agent: str) -> sm.SessionMachine:
    profile = builtin_profiles()[agent]
    spec = get_parser(profile.parser)
    return sm.SessionMachine(
        SESSION,
        spec.parser(),
        spec.input(),
        sm.SessionConfig(
            agent=agent,
            features=profile.features,
            single_turn_process=profile.single_turn_process,
            max_frame_size=MAX_FRAME_SIZE,
        ),
    )


@pytest.mark.parametrize("agent", ["claude-code", "codex", "gemini", "plain"])
@FUZZ
@given(data=st.data())
def test_parsers_never_raise_and_every_frame_out_conforms(agent, data):
    """Real lines of the agent, mutated ones and junk, in any order: the parser, the mapper and
    the machine take them all; the end of the run (stdout closed, exit) too."""
    seeds = LINES[agent] if agent != "plain" else LINES["claude-code"] + LINES["plain"]
    line = st.sampled_from(seeds) | mutated(seeds) | deep_json | hostile_values
    lines = data.draw(st.lists(line, max_size=12))
    machine = _machine(agent)
    assert_conforming(machine.start())
    for item in lines:
        assert_conforming(machine.agent_line(item))
    assert_conforming(machine.agent_stdout_closed())
    assert_conforming(machine.agent_exited(data.draw(st.sampled_from(["ok", "error"])), 1))


@pytest.mark.parametrize("agent", ["claude-code", "codex", "gemini"])
def test_a_deeply_nested_agent_line_is_a_parse_error(agent):
    """msgspec raised RecursionError on it (the session's stdout pump died with it)."""
    parser = get_parser(agent).parser()
    for line in (b'{"type":"assistant","message":' + b"[" * 1000 + b"]" * 1000 + b"}", b"{" * 99):
        events = parser.feed(line)
        assert [type(e).__name__ for e in events] == ["ParseError"]
        assert "nested deeper than 64 levels" in events[0].message
    assert parser.parse_errors == 2


def test_a_line_that_decodes_but_nests_past_64_levels_is_a_parse_error():
    """Within msgspec's reach (100 levels) but past the agent line limit: a tool input that deep
    would reach masters in a frame nested past their limit, so the line is refused."""
    parser = get_parser("claude-code").parser()
    deep_input = '{"a":' * 100 + "1" + "}" * 100
    line = (
        '{"type":"assistant","message":{"id":"m1","content":[{"type":"tool_use","id":"t1",'
        f'"name":"Bash","input":{deep_input}}}]}}}}'
    ).encode()
    msgspec.json.decode(line)  # valid JSON
    events = parser.feed(line)
    assert [type(e).__name__ for e in events] == ["ParseError"]
    assert "nested deeper than 64 levels" in events[0].message
