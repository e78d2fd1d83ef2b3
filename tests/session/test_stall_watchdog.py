"""The stall watchdog: an agent that goes silent mid-turn is reported, then its turn ends and it is
restarted. Session machine (sans-IO, timers fired by hand) and the real server with a hostile
agent (``tests/support/hostile/goes_silent.py``)."""

from __future__ import annotations

import json
import sys

import pytest

from gateway.config import ConfigError, builtin_profiles, load_config
from gateway.protocol import actions as act
from gateway.protocol import frames as F
from gateway.protocol import machine as sm
from gateway.protocol.states import Lifecycle, ProcessState
from parsers.base import get as get_parser
from tests.support.gateway_peer import Master, create_session, envelope, make_config, start_gateway
from tests.support.paths import HOSTILE

SILENT = str(HOSTILE / "goes_silent.py")


def machine(warning: float, timeout: float, *, single_turn: bool = False) -> sm.SessionMachine:
    spec = get_parser("claude-code")
    config = sm.SessionConfig(
        stall_warning_sec=warning, stall_timeout_sec=timeout, single_turn_process=single_turn
    )
    m = sm.SessionMachine("s-1", spec.parser(), spec.input(), config)
    m.start()
    m.attached("c1")
    return m


def prompt(m: sm.SessionMachine, text: str = "hi") -> list[act.Action]:
    frame = envelope("s-1", "control.prompt.request", {"prompt_text": text})
    return m.receive("c1", json.dumps(frame))


def errors(actions: list[act.Action]) -> list[F.AgentError]:
    return [
        a.frame.payload  # type: ignore[attr-defined]
        for a in actions
        if isinstance(a, act.Emit) and isinstance(a.frame.payload, F.AgentError)  # type: ignore[attr-defined]
    ]


def ticks(m: sm.SessionMachine, n: int) -> list[act.Action]:
    out: list[act.Action] = []
    for _ in range(n):
        out += m.timer_fired(sm.STALL_TIMER)
    return out


def test_the_watchdog_ticks_only_during_a_turn_and_only_when_on():
    m = machine(1.0, 4.0)
    assert m.config.stall_tick_sec == 0.25
    actions = prompt(m)
    assert act.StartTimer(sm.STALL_TIMER, 0.25) in actions
    off = machine(0, 0)
    assert off.config.stall_tick_sec == 0
    assert not [a for a in prompt(off) if isinstance(a, act.StartTimer)]


def test_silence_warns_once_then_stops_the_agent_and_restarts_it_resumed():
    """DPS-4.4-error: after stall_warning_sec of silence, agent.error AGENT_STALLED, severity warning,
    recoverable; after stall_timeout_sec: severity error and Terminate; the exit that follows ends
    the turn with error and starts the agent again with its session id (not a fatal error)."""
    m = machine(1.0, 2.0)
    prompt(m)
    m.agent_line(b'{"type": "system", "subtype": "init", "session_id": "agent-7"}')
    # The first tick sees the init line; silence is counted from there, a tick (0.25 s) at a time.
    assert errors(ticks(m, 4)) == []
    (warning,) = errors(ticks(m, 1))
    assert (warning.error_code, warning.severity, warning.recoverable) == (
        "AGENT_STALLED",
        "warning",
        True,
    )
    assert errors(ticks(m, 3)) == []  # warned once
    last = ticks(m, 1)
    (error,) = errors(last)
    assert (error.error_code, error.severity, error.recoverable) == ("AGENT_STALLED", "error", True)
    assert any(isinstance(a, act.Terminate) for a in last)
    assert ticks(m, 4) == []  # stopped ticking
    after = m.agent_exited("signal", -15, 15)
    assert not [e for e in errors(after) if e.severity == "fatal"]
    ends = [
        a.frame.payload  # type: ignore[attr-defined]
        for a in after
        if isinstance(a, act.Emit) and isinstance(a.frame.payload, F.TurnEnd)  # type: ignore[attr-defined]
    ]
    assert [e.stop_reason for e in ends] == ["error"]
    assert act.Spawn(resume_id="agent-7", mode="default") in after
    assert (m.lifecycle, m.process) == (Lifecycle.IDLE, ProcessState.ALIVE)
    assert not [a for a in after if isinstance(a, act.CloseAll)]


def test_output_and_pending_questions_are_not_silence():
    m = machine(1.0, 2.0)
    prompt(m)
    for _ in range(20):
        ticks(m, 3)
        m.agent_line(b'{"type": "system", "subtype": "init", "session_id": "a"}')
    assert errors(ticks(m, 3)) == []
    # A permission question waits for a master: the silence is theirs.
    request = {
        "type": "control_request",
        "request_id": "r1",
        "request": {"subtype": "can_use_tool", "tool_name": "Bash", "input": {"command": "ls"}},
    }
    m.agent_line(json.dumps(request).encode())
    assert m.interactions
    assert errors(ticks(m, 40)) == []


def test_a_single_turn_agent_stopped_for_silence_is_started_by_the_next_prompt():
    m = machine(0, 1.0, single_turn=True)
    prompt(m)
    assert any(isinstance(a, act.Terminate) for a in ticks(m, 4))
    after = m.agent_exited("signal", -15, 15)
    assert not [a for a in after if isinstance(a, act.Spawn)]
    assert (m.lifecycle, m.process) == (Lifecycle.IDLE, ProcessState.NONE)
    assert any(isinstance(a, act.Spawn) for a in prompt(m, "again"))


def test_delete_while_restarting_ends_the_session(tmp_path):
    m = machine(0, 1.0)
    prompt(m)
    ticks(m, 4)
    m.delete()
    after = m.agent_exited("signal", -15, 15)
    assert not [a for a in after if isinstance(a, act.Spawn)]
    assert m.lifecycle is Lifecycle.TERMINATED


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
        session = await create_session(client, "silent")
        master = await Master.attach(client, session["session_id"])
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
        info = await (await client.get(f"/v1/session/{session['session_id']}")).json()
        assert info["state"] == "IDLE"
    finally:
        await client.close()
