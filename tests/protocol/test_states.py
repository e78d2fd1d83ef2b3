"""The session machine's charts (gateway/protocol/states.py): every state has its row, a step the
table does not hold raises, and the reattach window is the machine's (DPS-7.7-deleted)."""

from __future__ import annotations

import pytest

from gateway.protocol import actions as act
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
from tests.support.scenario import (
    CLAUDE,
    REATTACH_WINDOW,
    Scenario,
    attach,
    deleted,
    detach,
    emit,
    exited,
    fire,
    restore,
    start,
)


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


def test_DPS_7_7_deleted_the_window_runs_while_no_master_is_attached_then_deletes():
    greeted = emit("session.capabilities", to="c2")
    assert (
        Scenario(reattach_window_sec=5.0)
        >> CLAUDE.started()
        << REATTACH_WINDOW.started(5.0)  # no master yet
        >> attach("c1")
        << REATTACH_WINDOW.cancelled()
        << emit("session.capabilities", to="c1")
        >> attach("c2")
        << greeted  # the window is closed already
        >> detach("c1")
        >> detach("c1")  # told twice: nothing more
        >> detach("c2")
        << REATTACH_WINDOW.started(5.0)  # the last one left
        >> fire(REATTACH_WINDOW)
        << act.Terminate()
        >> exited("signal", -15, 15)
        << deleted("timeout", "system")
    )


def test_a_window_that_fires_after_a_master_came_back_does_nothing():
    assert (
        Scenario(reattach_window_sec=5.0, single_turn_process=True)
        >> start()
        << REATTACH_WINDOW.started(5.0)
        >> attach("c1")
        << REATTACH_WINDOW.cancelled()
        << emit("session.capabilities", to="c1")
        >> fire(REATTACH_WINDOW)  # it was already on its way: the session goes on
        >> detach("c1")
        << REATTACH_WINDOW.started(5.0)
        >> fire(REATTACH_WINDOW)
        << deleted("timeout", "system")  # no process: at once
    )


def test_a_restored_session_starts_no_agent_but_opens_its_window():
    assert (
        Scenario(reattach_window_sec=2.0)
        >> restore(name=None, mode="default", turn_count=3, agent_session_id="agent-7")
        >> start()
        << REATTACH_WINDOW.started(2.0)  # no spawn: the next prompt resumes agent-7
    )
