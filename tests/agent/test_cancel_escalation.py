"""A cancel that the agent does not obey escalates (docs/protocol-notes.md, ``control.prompt.cancel``;
DPS-6.1.2-cancel): the interrupt on stdin, SIGINT 2 s later, the process stopped 10 s after the
cancel; a single-turn process gets SIGINT at once. A stop for a cancel is the cancel working: the
turn ends ``cancelled`` and the session goes on, the next prompt starting the agent again resumed.
The session machine on its own (timers fired by hand), and the real server with an agent that
ignores all but the stop (``tests/support/hostile/ignores_cancel.py``), its timers shortened."""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import replace

from gateway.agent.profiles import builtin_profiles
from gateway.protocol import actions as act
from gateway.protocol import machine as sm
from gateway.protocol.states import Lifecycle, ProcessState
from gateway.server import SESSIONS
from parsers.base import get as get_parser
from tests.support.gateway_peer import (
    Master,
    create_session,
    envelope,
    make_config,
    of,
    prompt_and_wait,
    start_gateway,
)
from tests.support.paths import HOSTILE

STUBBORN = str(HOSTILE / "ignores_cancel.py")


def running_turn(**config: object) -> tuple[sm.SessionMachine, str]:
    """A machine whose agent runs (its session id "agent-7") and is in a turn; the turn's id."""
    spec = get_parser("claude-code")
    m = sm.SessionMachine("s-1", spec.parser(), spec.input(), sm.SessionConfig(**config))
    m.start()
    m.attached("c1")
    prompt(m, "go")
    m.agent_line(b'{"type": "system", "subtype": "init", "session_id": "agent-7"}')
    assert m.turn is not None
    return m, m.turn.turn_id


def prompt(m: sm.SessionMachine, text: str) -> list[act.Action]:
    frame = envelope("s-1", "control.prompt.request", {"prompt_text": text})
    return m.receive("c1", json.dumps(frame))


def cancel(m: sm.SessionMachine, turn_id: str) -> list[act.Action]:
    frame = envelope("s-1", "control.prompt.cancel", {"target_turn_id": turn_id})
    return m.receive("c1", json.dumps(frame))


def ends(actions: list[act.Action]) -> list[str]:
    return [
        a.frame.payload.stop_reason  # type: ignore[attr-defined]
        for a in actions
        if isinstance(a, act.Emit) and a.frame.TYPE == "session.turn.end"
    ]


def types(actions: list[act.Action]) -> list[str]:
    """The types of the frames the gateway makes (not a master's frame relayed to the others)."""
    return [
        a.frame.TYPE
        for a in actions
        if isinstance(a, act.Emit) and not a.frame.TYPE.startswith("control.")
    ]


def test_DPS_6_1_2_cancel_interrupts_then_sigint_after_2_s_then_stops_after_10_s():
    """DPS-6.1.2-cancel: the stop of an agent that ignored the cancel ends the turn
    ``cancelled``, with no fatal error; the session goes on with no process, and the next prompt
    starts the agent again resumed with its session id, in a new turn."""
    m, turn_id = running_turn()
    actions = cancel(m, turn_id)
    (write,) = [a for a in actions if isinstance(a, act.WriteStdin)]
    assert json.loads(write.data)["request"]["subtype"] == "interrupt"
    timers = [a for a in actions if isinstance(a, act.StartTimer)]
    assert timers == [
        act.StartTimer(sm.CANCEL_SIGINT_TIMER, 2.0),
        act.StartTimer(sm.CANCEL_STOP_TIMER, 10.0),
    ]
    assert not [a for a in actions if isinstance(a, act.Signal | act.Terminate)]
    assert m.timer_fired(sm.CANCEL_SIGINT_TIMER) == [act.Signal(signal.SIGINT)]
    stop = m.timer_fired(sm.CANCEL_STOP_TIMER)
    assert isinstance(stop[-1], act.Terminate)
    exited = m.agent_exited("signal", -15, 15)
    assert ends(exited) == ["cancelled"]  # the turn ends with the process
    assert "agent.error" not in types(exited) and "session.deleted" not in types(exited)
    assert not [a for a in exited if isinstance(a, act.CloseAll | act.Spawn)]
    assert (m.lifecycle, m.process) == (Lifecycle.IDLE, ProcessState.NONE)
    again = prompt(m, "again")
    assert types(again)[0] == "session.turn.start" and m.turn is not None
    assert m.turn.turn_id != turn_id
    assert act.Spawn(prompt="again", resume_id="agent-7") in again


def test_DPS_6_1_2_a_prompt_while_the_stopped_agent_exits_waits_for_its_exit():
    """The turn ended (the agent finished it after all) while the gateway was stopping the agent
    for the cancel: the next prompt is not written to the process that is going away, and its exit
    is no fatal error; the prompt's process starts when that exit is reported."""
    m, turn_id = running_turn()
    cancel(m, turn_id)
    m.timer_fired(sm.CANCEL_STOP_TIMER)
    ended = m.agent_line(b'{"type": "result", "subtype": "success", "is_error": false}')
    assert ends(ended) == ["cancelled"]
    again = prompt(m, "again")
    assert types(again) == ["session.turn.start"]
    assert not [a for a in again if isinstance(a, act.WriteStdin | act.Spawn)]
    exited = m.agent_exited("signal", -15, 15)
    assert "agent.error" not in types(exited) and "session.deleted" not in types(exited)
    assert exited[-1] == act.Spawn(prompt="again", resume_id="agent-7")
    assert m.turn is not None and m.process is ProcessState.ALIVE


def test_DPS_6_1_2_a_single_turn_process_gets_sigint_at_once():
    m, turn_id = running_turn(single_turn_process=True)
    actions = cancel(m, turn_id)
    assert act.Signal(signal.SIGINT) in actions
    assert not [a for a in actions if isinstance(a, act.WriteStdin)]
    assert [a for a in actions if isinstance(a, act.StartTimer)] == [
        act.StartTimer(sm.CANCEL_STOP_TIMER, 10.0)
    ]


def test_timers_of_a_turn_that_ended_do_nothing():
    m, turn_id = running_turn()
    cancel(m, turn_id)
    m.agent_line(b'{"type": "result", "subtype": "success", "is_error": false}')
    assert m.turn is None
    assert m.timer_fired(sm.CANCEL_SIGINT_TIMER) == [] and m.timer_fired(sm.CANCEL_STOP_TIMER) == []


def test_the_escalation_durations_are_the_configs():
    m, turn_id = running_turn(cancel_sigint_sec=0.5, cancel_stop_sec=3.0)
    timers = [a for a in cancel(m, turn_id) if isinstance(a, act.StartTimer)]
    assert timers == [
        act.StartTimer(sm.CANCEL_SIGINT_TIMER, 0.5),
        act.StartTimer(sm.CANCEL_STOP_TIMER, 3.0),
    ]


async def test_DPS_6_1_2_an_agent_that_ignores_the_cancel_gets_each_step_then_is_stopped(tmp_path):
    """DPS-6.1.2-cancel: the real server's timers fire the escalation on a real process: the
    interrupt, SIGINT, then SIGTERM (which it obeys), in that order; the turn ends ``cancelled``
    with no error, and the next prompt runs a new turn in the agent started again with
    ``--resume`` and its session id."""
    base = builtin_profiles()["claude-code"]
    profile = replace(base, name="stubborn", command=(sys.executable, STUBBORN), env={})
    client = await start_gateway(make_config(tmp_path, agents={"stubborn": profile}))
    try:
        sid = (await create_session(client, "stubborn"))["session_id"]
        live = client.server.app[SESSIONS][sid]
        live.machine.config = replace(
            live.machine.config, cancel_sigint_sec=0.2, cancel_stop_sec=0.8
        )
        master = await Master.attach(client, sid)
        await master.send("control.prompt.request", {"prompt_text": "a long story"})
        start = await master.until("session.turn.start")
        await master.until("agent.text.delta")
        await master.send("control.prompt.cancel", {"target_turn_id": start["payload"]["turn_id"]})
        end = await master.until("session.turn.end", timeout=15)
        assert end["payload"]["stop_reason"] == "cancelled"
        log = (tmp_path / "cancel.log").read_text().splitlines()
        after_prompt = log[log.index("stdin user") + 1 :]
        assert after_prompt == ["stdin control_request interrupt", "SIGINT", "SIGTERM"]
        frames = await prompt_and_wait(master, "and then?")
        (start,) = of(frames, "session.turn.start")
        assert start["payload"]["turn_id"] != end["payload"]["turn_id"]
        assert of(frames, "session.turn.end")[0]["payload"]["stop_reason"] == "end_turn"
        assert not [f for f in master.frames if f["type"] in ("agent.error", "session.error")]
        starts = [line for line in (tmp_path / "cancel.log").read_text().splitlines()]
        starts = [json.loads(line[len("start ") :]) for line in starts if line.startswith("start ")]
        assert starts[0] == [] and starts[1][:2] == ["--resume", "stubborn-1"]
    finally:
        await client.close()
