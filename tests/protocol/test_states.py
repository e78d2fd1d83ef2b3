"""The session machine's charts (gateway/protocol/states.py): every state has its row, a step the
table does not hold raises, and the reattach window is the machine's (DPS-7.7-deleted)."""

from __future__ import annotations

import pytest

from gateway.protocol import actions as act
from gateway.protocol import machine as sm
from gateway.protocol.states import (
    ATTACHMENT,
    LIFECYCLE,
    PROCESS,
    Attachment,
    IllegalTransition,
    Lifecycle,
    LifecycleStep,
    ProcessState,
    move,
)
from parsers.base import get as get_parser


@pytest.mark.parametrize(
    ("table", "states"),
    [(LIFECYCLE, Lifecycle), (ATTACHMENT, Attachment), (PROCESS, ProcessState)],
)
def test_every_state_has_a_row_and_leads_only_to_states(table, states):
    assert set(table) == set(states)
    assert {target for row in table.values() for target in row.values()} <= set(states)


def test_a_step_the_table_does_not_hold_raises_and_says_which():
    with pytest.raises(
        IllegalTransition, match="lifecycle: no transition for 'turn opened' in state 'terminated'"
    ):
        move("lifecycle", LIFECYCLE, Lifecycle.TERMINATED, LifecycleStep.TURN_OPENED)


def machine(**config: object) -> sm.SessionMachine:
    spec = get_parser("claude-code")
    return sm.SessionMachine("s-1", spec.parser(), spec.input(), sm.SessionConfig(**config))


def window(seconds: float) -> act.StartTimer:
    return act.StartTimer(sm.REATTACH_WINDOW_TIMER, seconds)


def test_DPS_7_7_deleted_the_window_runs_while_no_master_is_attached_then_deletes():
    m = machine(reattach_window_sec=5.0)
    assert m.start()[-1] == window(5.0)  # no master yet
    assert m.attached("c1")[0] == act.CancelTimer(sm.REATTACH_WINDOW_TIMER)
    assert act.CancelTimer(sm.REATTACH_WINDOW_TIMER) not in m.attached("c2")
    assert m.attachment is Attachment.ATTACHED
    assert m.detached("c1") == [] and m.detached("c1") == []
    assert m.detached("c2") == [window(5.0)] and m.attachment is Attachment.DETACHED
    ended = m.timer_fired(sm.REATTACH_WINDOW_TIMER)
    assert ended == [act.Terminate()] and m.lifecycle is Lifecycle.TERMINATING
    deleted = m.agent_exited("signal", -15, 15)
    (frame,) = [a.frame for a in deleted if isinstance(a, act.Emit)]
    assert (frame.payload.reason, frame.payload.deleted_by) == ("timeout", "system")
    assert m.lifecycle is Lifecycle.TERMINATED and m.process is ProcessState.NONE


def test_a_window_that_fires_after_a_master_came_back_does_nothing():
    m = machine(reattach_window_sec=5.0, single_turn_process=True)
    m.start()
    m.attached("c1")
    assert m.timer_fired(sm.REATTACH_WINDOW_TIMER) == [] and m.lifecycle is Lifecycle.IDLE


def test_a_restored_session_starts_no_agent_but_opens_its_window():
    m = machine(reattach_window_sec=2.0)
    m.restore(name=None, mode="default", turn_count=3, agent_session_id="agent-7")
    assert m.start() == [window(2.0)] and m.process is ProcessState.NONE
