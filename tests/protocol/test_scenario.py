"""The scenario harness itself (tests/support/scenario.py): it fails where the machine's answer
differs in any way, says how readably, and makes the same frames each run."""

from __future__ import annotations

import pytest

from gateway.protocol import frames as F
from gateway.protocol.actions import Log
from tests.support.scenario import (
    ANY,
    CLAUDE,
    STALL,
    Placeholder,
    Scenario,
    cancel,
    deterministic_factory,
    emit,
    line,
    prompt,
    relayed,
    stdin,
    turn_end,
    turn_start,
)

TURN, OTHER = Placeholder("TURN"), Placeholder("OTHER")


def failure(scenario: Scenario) -> str:
    with pytest.raises(AssertionError) as raised:
        assert scenario
    return str(raised.value)


def test_a_scenario_that_holds_passes_and_goes_on_where_it_stopped():
    sc = Scenario() >> CLAUDE.started() >> CLAUDE.prompted("one", TURN)
    assert sc
    assert sc[TURN]
    # The next assert feeds only what was added since, with TURN still bound.
    assert (
        sc
        >> cancel(TURN)
        << relayed("control.prompt.cancel")
        << stdin(CLAUDE.interrupt)
        << ANY
        << ANY
    )


def test_a_missing_an_extra_or_a_reordered_action_fails():
    told = [prompt("one"), relayed("control.prompt.request"), turn_start(TURN)]
    extra = Scenario() >> CLAUDE.started() >> told  # the prompt's write on stdin is not said
    assert "an action more than expected" in failure(extra)
    missing = (
        Scenario() >> CLAUDE.started() >> CLAUDE.prompted("one", TURN) << emit("agent.text.delta")
    )
    assert "an action expected, none came" in failure(missing)
    swapped = (
        Scenario()
        >> CLAUDE.started()
        >> prompt("one")
        << turn_start(TURN)
        << relayed("control.prompt.request")
        << stdin(CLAUDE.prompt("one"))
    )
    assert "session.turn.start expected, got control.prompt.request" in failure(swapped)


def test_the_failure_is_a_diff_of_the_exchange_with_bound_values_named():
    wrong = Scenario() >> CLAUDE.started() >> CLAUDE.prompted("one", TURN)
    wrong >> prompt("two") << relayed("control.prompt.request") << emit("session.error", to="c2")
    text = failure(wrong)
    assert text.startswith("scenario differs after c1 sends control.prompt.request")
    assert "action.to: 'c2' expected, got 'c1'" in text
    lines = text.splitlines()
    assert "-<< emit session.error {…} to=c2" in lines
    assert any(
        line.startswith("+<< emit session.error {error_code: 'PROMPT_IN_PROGRESS'")
        for line in lines
    )
    # lines that matched are shown once, as context; generated ids by their placeholder
    assert (
        " << emit session.turn.start {turn_id: <TURN>, turn_index: 0, mode: 'default'} turn_id=<TURN>"
        in lines
    )
    assert "bound: <TURN> = " in text


def test_a_placeholder_binds_once_and_two_never_bind_the_same_value():
    moved = (
        Scenario()
        >> CLAUDE.started()
        >> CLAUDE.prompted("one", TURN)
        >> prompt("two")
        << relayed("control.prompt.request")
        << emit("session.error", to="c1", turn_id=TURN)
    )
    assert "<TURN> is" in failure(moved)  # bound to the turn's id, the error has none
    same = Scenario() >> CLAUDE.started() >> prompt("one") << relayed("control.prompt.request")
    same << emit(F.TurnStart(turn_id=TURN, turn_index=0, mode="default"), turn_id=OTHER)  # type: ignore[arg-type]
    assert "<OTHER> would be the same value as <TURN>" in failure(same)


def test_an_input_naming_an_unbound_placeholder_is_a_mistake_in_the_test():
    assert "<TURN> is used in an input before any output bound it" in failure(
        Scenario() >> CLAUDE.started() >> cancel(TURN)
    )


def test_logs_are_left_out_unless_asked_for():
    def twice(scenario: Scenario) -> Scenario:
        sent = prompt("x", mid="same")
        return scenario >> CLAUDE.started() >> sent << ANY << ANY << ANY >> sent

    assert twice(Scenario())  # the second time: nothing at all
    ignored = Log("debug", "duplicate frame ignored", {"message_id": "same"})
    assert "an action more than expected" in failure(twice(Scenario(logs=True)))
    assert twice(Scenario(logs=True)) << ignored


def test_cancelling_a_timer_that_does_not_run_is_left_out():
    """Ending a turn cancels the cancel's timers, which never ran: the shell has nothing to do,
    and the scenario says nothing of them; a timer that runs is kept until it fires or stops."""
    ended = Scenario(stall_timeout_sec=1.0) >> CLAUDE.started()
    assert ended >> CLAUDE.prompted("x", TURN, stall_tick=0.25)
    assert ended.timers == {STALL}
    assert ended >> line(CLAUDE.result) << STALL.cancelled() << turn_end(TURN, settles=None)
    assert ended.timers == frozenset()


def test_the_factory_is_deterministic():
    one, two = deterministic_factory(), deterministic_factory()
    frames = [
        (f.message_id, f.timestamp)
        for f in (one.frame(F.TextDelta(content_index=0, text="x")) for _ in range(3))
    ]
    assert frames == [
        (f.message_id, f.timestamp)
        for f in (two.frame(F.TextDelta(content_index=0, text="x")) for _ in range(3))
    ]
    assert frames[0][1] == "2026-12-01T00:00:00.000Z" and frames[1][1] == "2026-12-01T00:00:00.001Z"
    assert len({m for m, _ in frames}) == 3
