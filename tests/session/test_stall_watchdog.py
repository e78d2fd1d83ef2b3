"""The stall watchdog: an agent that goes silent mid-turn is reported, then its turn ends and it is
restarted. Session machine (sans-IO, timers fired by hand) and the real server with a hostile
agent (``tests/support/hostile/goes_silent.py``)."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from gateway.config import ConfigError, builtin_profiles, load_config
from gateway.protocol import actions as act
from gateway.protocol.actions import Log
from tests.support.gateway_peer import Master, make_config, start_gateway
from tests.support.paths import HOSTILE
from tests.support.scenario import (
    CLAUDE,
    STALL,
    Placeholder,
    Scenario,
    Timer,
    delete,
    deleted,
    emit,
    exited,
    fire,
    line,
    prompt,
    rejected,
    relayed,
    spawn,
    start,
    turn_end,
    turn_start,
)

SILENT = str(HOSTILE / "goes_silent.py")


TURN, AGAIN, ASK = Placeholder("TURN"), Placeholder("AGAIN"), Placeholder("ASK")
TICK = 0.25  # a quarter of the shorter limit


def ticks(n: int) -> list[object]:
    """``n`` ticks of the watchdog that find nothing to say: each only starts the next."""
    return [fire(STALL), STALL.started(TICK)] * n


def stalled(severity: str) -> Any:
    """DPS-4.4-error: ``agent.error`` AGENT_STALLED, recoverable, in the turn."""
    return emit(
        "agent.error",
        error_code="AGENT_STALLED",
        severity=severity,
        recoverable=True,
        turn_id=TURN,
    )


def stopped_for_silence(silent_sec: float) -> list[object]:
    return [
        stalled("error"),
        Log("warning", "agent stalled; restarting it", {"silent_sec": silent_sec}),
        act.Terminate(),
    ]


def test_the_watchdog_ticks_only_during_a_turn_and_only_when_on():
    assert (
        Scenario(stall_warning_sec=1.0, stall_timeout_sec=4.0)
        >> CLAUDE.started()
        >> CLAUDE.prompted("hi", TURN, stall_tick=TICK)
        >> line(CLAUDE.result)
        << STALL.cancelled()
        << turn_end(TURN, settles=None)
        >> fire(STALL)  # between turns: nothing to watch
    )
    assert Scenario() >> CLAUDE.started() >> CLAUDE.prompted("hi", TURN)  # off: no timer at all


def test_silence_warns_once_then_stops_the_agent_and_restarts_it_resumed():
    """DPS-4.4-error: after stall_warning_sec of silence, agent.error AGENT_STALLED, severity warning,
    recoverable; after stall_timeout_sec: severity error and Terminate; the exit that follows ends
    the turn with error and starts the agent again with its session id (not a fatal error), idle
    with a live process: the next prompt is written to it."""
    assert (
        Scenario(logs=True, stall_warning_sec=1.0, stall_timeout_sec=2.0)
        >> CLAUDE.started()
        >> CLAUDE.prompted("hi", TURN, stall_tick=TICK)
        >> CLAUDE.introduced("agent-7", TURN)
        # The first tick sees the init line; silence is counted from there, a tick at a time.
        >> ticks(4)
        >> fire(STALL)
        << STALL.started(TICK)
        << stalled("warning")
        >> ticks(3)  # warned once
        >> fire(STALL)
        << stopped_for_silence(2.0)
        >> [fire(STALL)] * 4  # stopped ticking
        >> exited("signal", -15, 15)
        << turn_end(TURN, "error", settles=None)
        << spawn(resume_id="agent-7")
        >> CLAUDE.prompted("again", AGAIN, 1, stall_tick=TICK)
    )


def test_output_and_pending_questions_are_not_silence():
    init = {"type": "system", "subtype": "init", "session_id": "a"}
    request = {
        "type": "control_request",
        "request_id": "r1",
        "request": {"subtype": "can_use_tool", "tool_name": "Bash", "input": {"command": "ls"}},
    }
    sc = (
        Scenario(stall_warning_sec=1.0, stall_timeout_sec=2.0)
        >> CLAUDE.started()
        >> CLAUDE.prompted("hi", TURN, stall_tick=TICK)
        >> ticks(3)
        >> CLAUDE.introduced("a", TURN)
    )
    for _ in range(19):
        sc >> ticks(3) >> line(init)
    # A permission question waits for a master: the silence is theirs.
    assert (
        sc
        >> ticks(3)
        >> line(request)
        << emit("agent.interaction.request", interaction_id=ASK, turn_id=TURN)
        << emit("agent.state.changed", current_state="awaiting_input")
        << Timer.interaction(ASK).started(60.0)
        >> ticks(40)
    )


def test_a_single_turn_agent_stopped_for_silence_is_started_by_the_next_prompt():
    assert (
        Scenario(logs=True, stall_timeout_sec=1.0, single_turn_process=True)
        >> start()
        >> prompt("hi")
        << relayed("control.prompt.request")
        << turn_start(TURN)
        << STALL.started(TICK)
        << spawn(prompt="hi")
        >> ticks(3)
        >> fire(STALL)
        << stopped_for_silence(1.0)
        >> exited("signal", -15, 15)
        << turn_end(TURN, "error", settles=None)  # and no process until the next prompt
        >> prompt("again")
        << relayed("control.prompt.request")
        << turn_start(AGAIN, 1)
        << STALL.started(TICK)
        << spawn(prompt="again")
    )


def test_delete_while_restarting_ends_the_session():
    assert (
        Scenario(stall_timeout_sec=1.0)
        >> CLAUDE.started()
        >> CLAUDE.prompted("hi", TURN, stall_tick=TICK)
        >> ticks(3)
        >> fire(STALL)
        << stalled("error")
        << act.Terminate()
        >> delete()
        << act.Terminate()
        >> exited("signal", -15, 15)
        << turn_end(TURN, "error", settles=None)
        << deleted()
        >> rejected(prompt("again"), "SESSION_TERMINATED")
    )


def test_config_keys_are_per_profile_and_checked(tmp_path):
    assert builtin_profiles()["claude-code"].stall_warning_sec == 300
    assert builtin_profiles()["claude-code"].stall_timeout_sec == 1800
    path = tmp_path / "c.toml"
    path.write_text("[agents.codex]\nstall_warning_sec = 0\nstall_timeout_sec = 60\n")
    codex = load_config(path, environ={}).agents["codex"]
    assert (codex.stall_warning_sec, codex.stall_timeout_sec) == (0, 60)
    path.write_text("[agents.codex]\nstall_timeout_sec = -1\n")
    with pytest.raises(ConfigError, match="stall_timeout_sec"):
        load_config(path, environ={})
    path.write_text('[agents.codex]\nstall_warning_sec = "soon"\n')
    with pytest.raises(ConfigError, match="stall_warning_sec"):
        load_config(path, environ={})


async def test_a_silent_agent_is_warned_about_then_restarted_and_the_session_goes_on(tmp_path):
    """DPS-4.4-error, DPS-17.3.2-one-prompt: the hostile agent answers "hang" with a first message
    and then nothing: masters get the warning (a prompt meanwhile is refused: the turn still runs),
    then the error; the turn ends with error; the agent is started again with --resume and its
    session id; the next prompt is answered."""
    base = builtin_profiles()["claude-code"]
    profile = type(base)(
        name="silent",
        parser="claude-code",
        command=(sys.executable, SILENT),
        resume_flag="--resume {session_id}",
        features=base.features,
        stall_warning_sec=0.4,
        stall_timeout_sec=2.0,
    )
    client = await start_gateway(
        make_config(tmp_path, agents={"silent": profile}, shutdown_grace_sec=1.0)
    )
    try:
        master = await Master.open(client, "silent")
        await master.send("control.prompt.request", {"prompt_text": "please hang"})
        warning = await master.until("agent.error", timeout=10, severity="warning")
        # The stalled turn is still the running one until it ends.
        await master.send("control.prompt.request", {"prompt_text": "too early"})
        end = await master.until("session.turn.end", timeout=10)
        later = master.frames[master.frames.index(warning) + 1 :]
        (busy,) = [f for f in later if f["type"] == "session.error"]
        assert busy["payload"]["error_code"] == "PROMPT_IN_PROGRESS"
        (error,) = [f for f in later if f["type"] == "agent.error"]
        assert error["payload"]["severity"] == "error"
        assert warning["payload"]["error_code"] == error["payload"]["error_code"] == "AGENT_STALLED"
        assert warning["payload"]["recoverable"] and error["payload"]["recoverable"]
        assert end["payload"]["stop_reason"] == "error"
        start = len(master.frames)
        await master.send("control.prompt.request", {"prompt_text": "something else"})
        end = await master.until("session.turn.end", timeout=10)
        assert end["payload"]["stop_reason"] == "end_turn"
        frames = master.frames[start:]
        assert not [f for f in frames if f["type"] in ("session.error", "agent.error")]
        starts = [json.loads(line) for line in (tmp_path / "starts.jsonl").read_text().splitlines()]
        assert starts[0] == [] and starts[1] == ["--resume", "silent-1"]
        info = await (await client.get(f"/v1/session/{master.session_id}")).json()
        assert info["state"] == "IDLE"
    finally:
        await client.close()
