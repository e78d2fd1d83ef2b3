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
from gateway.protocol.actions import Log
from gateway.server import SESSIONS
from tests.support.gateway_peer import (
    Master,
    make_config,
    of,
    prompt_and_wait,
    start_gateway,
)
from tests.support.paths import HOSTILE
from tests.support.scenario import (
    CANCEL_SIGINT,
    CANCEL_STOP,
    CLAUDE,
    Placeholder,
    Scenario,
    cancel,
    escalation_ends,
    exited,
    fire,
    line,
    prompt,
    relayed,
    spawn,
    start,
    turn_end,
    turn_start,
)

STUBBORN = str(HOSTILE / "ignores_cancel.py")


TURN, AGAIN = Placeholder("TURN"), Placeholder("AGAIN")


def running_turn(**config: object) -> Scenario:
    """A session whose agent runs (its session id "agent-7") and is in a turn, ``TURN``."""
    return (
        Scenario(logs=True, **config)
        >> CLAUDE.started()
        >> CLAUDE.prompted("go", TURN)
        >> CLAUDE.introduced("agent-7", TURN)
    )


def cancelled(**config: object) -> Scenario:
    """That turn cancelled by a master: the interrupt, then SIGINT and the stop on their timers."""
    sigint, stop = config.get("cancel_sigint_sec", 2.0), config.get("cancel_stop_sec", 10.0)
    return (
        running_turn(**config)
        >> cancel(TURN)
        << relayed("control.prompt.cancel")
        << CLAUDE.escalation(sigint, stop)
    )


STOPPING = Log("warning", "the agent ignored the cancel; stopping it")
EXITED_ON_CANCEL = Log("info", "the agent exited on a cancel", {"returncode": -15, "signal": 15})


def test_DPS_6_1_2_cancel_interrupts_then_sigint_after_2_s_then_stops_after_10_s():
    """DPS-6.1.2-cancel: the stop of an agent that ignored the cancel ends the turn
    ``cancelled``, with no fatal error; the session goes on with no process, and the next prompt
    starts the agent again resumed with its session id, in a new turn."""
    assert (
        cancelled()
        >> fire(CANCEL_SIGINT)
        << act.Signal(signal.SIGINT)
        >> fire(CANCEL_STOP)
        << STOPPING
        << act.Terminate()
        >> exited("signal", -15, 15)
        << EXITED_ON_CANCEL
        << turn_end(TURN, "cancelled", settles=None)  # the turn ends with the process
        >> prompt("again")
        << relayed("control.prompt.request", prompt_text="again")
        << turn_start(AGAIN, 1)
        << spawn(prompt="again", resume_id="agent-7")
    )


def test_DPS_6_1_2_a_prompt_while_the_stopped_agent_exits_waits_for_its_exit():
    """The turn ended (the agent finished it after all) while the gateway was stopping the agent
    for the cancel: the next prompt is not written to the process that is going away, and its exit
    is no fatal error; the prompt's process starts when that exit is reported."""
    assert (
        cancelled()
        >> fire(CANCEL_STOP)
        << STOPPING
        << act.Terminate()
        >> line(CLAUDE.result)
        << CANCEL_SIGINT.cancelled()
        << turn_end(TURN, "cancelled", settles=None)
        >> prompt("again")
        << relayed("control.prompt.request", prompt_text="again")
        << turn_start(AGAIN, 1)
        >> exited("signal", -15, 15)
        << EXITED_ON_CANCEL
        << spawn(prompt="again", resume_id="agent-7")
    )


def test_DPS_6_1_2_a_single_turn_process_gets_sigint_at_once():
    assert (
        Scenario(single_turn_process=True)
        >> start()
        >> prompt("go")
        << relayed("control.prompt.request")
        << turn_start(TURN)
        << spawn(prompt="go")
        >> CLAUDE.introduced("agent-7", TURN)
        >> cancel(TURN)
        << relayed("control.prompt.cancel")
        << act.Signal(signal.SIGINT)
        << CANCEL_STOP.started(10.0)
    )


def test_timers_of_a_turn_that_ended_do_nothing():
    assert (
        cancelled()
        >> line(CLAUDE.result)
        << escalation_ends()
        << turn_end(TURN, "cancelled", settles=None)
        >> fire(CANCEL_SIGINT)
        >> fire(CANCEL_STOP)
    )


def test_the_escalation_durations_are_the_configs():
    assert cancelled(cancel_sigint_sec=0.5, cancel_stop_sec=3.0)


async def test_DPS_6_1_2_an_agent_that_ignores_the_cancel_gets_each_step_then_is_stopped(tmp_path):
    """DPS-6.1.2-cancel: the real server's timers fire the escalation on a real process: the
    interrupt, SIGINT, then SIGTERM (which it obeys), in that order; the turn ends ``cancelled``
    with no error, and the next prompt runs a new turn in the agent started again with
    ``--resume`` and its session id."""
    base = builtin_profiles()["claude-code"]
    profile = replace(base, name="stubborn", command=(sys.executable, STUBBORN), env={})
    client = await start_gateway(make_config(tmp_path, agents={"stubborn": profile}))
    try:
        master = await Master.open(client, "stubborn")
        live = client.server.app[SESSIONS][master.session_id]
        live.machine.config = replace(
            live.machine.config, cancel_sigint_sec=0.2, cancel_stop_sec=0.8
        )
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
