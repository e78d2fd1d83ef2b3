"""The plain parser (any line-oriented program: each stdout line becomes text), and the built-in
``plain`` profile through the real server."""

from __future__ import annotations

from dataclasses import replace

from gateway.agent.profiles import builtin_profiles
from parsers import events as ev
from parsers.base import get as get_parser
from parsers.plain import PlainInput, PlainParser
from tests.support.gateway_peer import (
    Master,
    create_session,
    make_config,
    prompt_and_wait,
    start_gateway,
)


def test_spec_is_registered_as_plain():
    spec = get_parser("plain")
    assert isinstance(spec.parser(), PlainParser) and isinstance(spec.input(), PlainInput)


def test_DPS_4_1_text_each_line_is_text_of_one_block_per_run():
    parser = PlainParser()
    events = parser.feed(b"first") + parser.feed(b"") + parser.feed(b"\xffbad")
    assert events == [
        ev.TextDelta(block="out-1", text="first\n"),
        ev.TextDelta(block="out-1", text="\n"),
        ev.TextDelta(block="out-1", text="\ufffdbad\n"),
    ]
    assert parser.end() == []  # the block ends with the turn, in the mapper
    assert parser.feed(b"again") == [ev.TextDelta(block="out-2", text="again\n")]


def test_input_is_one_line_per_prompt_and_nothing_else():
    agent_input = PlainInput()
    assert agent_input.prompt("two\nlines") == b"two lines\n"
    assert agent_input.interrupt("r1") is None
    assert agent_input.permission("r1", allow=True) is None
    assert agent_input.set_mode("r1", "plan") is None


async def test_plain_profile_wraps_a_program_through_the_server(tmp_path):
    """The built-in plain profile as it is (Python printing its argument): each prompt is one
    process whose output lines are the turn's text, ended by exit 0 (DPS-18-respawn)."""
    client = await start_gateway(make_config(tmp_path))
    try:
        session = await create_session(client, "plain")
        master = await Master.attach(client, session["session_id"])
        for text in ("hello; $(rm -rf /)", "second"):
            frames = await prompt_and_wait(master, text, timeout=20)
            types = [f["type"] for f in frames]
            assert types.index("session.turn.start") < types.index("agent.text.delta")
            done = next(f for f in frames if f["type"] == "agent.text.done")
            assert done["payload"]["full_text"] == text + "\n"  # one argument, no shell
            end = next(f for f in frames if f["type"] == "session.turn.end")
            assert end["payload"]["stop_reason"] == "end_turn"
    finally:
        await client.close()


async def test_plain_program_failing_is_a_fatal_agent_error(tmp_path):
    base = builtin_profiles()["plain"]
    failing = replace(
        base, command=(base.command[0], "-c", "import sys; print('oops'); sys.exit(3)", "{prompt}")
    )
    client = await start_gateway(make_config(tmp_path, agents={"plain": failing}))
    try:
        session = await create_session(client, "plain")
        master = await Master.attach(client, session["session_id"])
        await master.send("control.prompt.request", {"prompt_text": "x"})
        error = await master.until("agent.error", timeout=20)
        assert error["payload"]["error_code"] == "AGENT_EXIT"
        assert error["payload"]["details"]["exit_code"] == 3
        end = await master.until("session.turn.end")
        assert end["payload"]["stop_reason"] == "error"
    finally:
        await client.close()
