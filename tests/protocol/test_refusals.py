"""What the session machine refuses, and the controls beside each refusal, as scenarios: answers to
no pending interaction, a mode switch or a compaction at the wrong time or for an agent that has
none, renames, and a delete with or without a process. The same rules through a real server and
the demo agent are in tests/server/test_server.py; here each is the exact exchange."""

from __future__ import annotations

import pytest

from gateway.protocol import actions as act
from gateway.protocol import frames as F
from gateway.protocol import machine as sm
from parsers import events as ev
from tests.support.scenario import (
    CLAUDE,
    SESSION,
    Placeholder,
    Scenario,
    Timer,
    cancel,
    compact,
    delete,
    deleted,
    emit,
    events,
    exited,
    fire,
    line,
    master,
    prompt,
    refused,
    rejected,
    relayed,
    rename,
    start,
    stdin,
    turn_end,
    turn_start,
)

TURN, NEXT, ASK, CALL = (Placeholder(n) for n in ("TURN", "NEXT", "ASK", "CALL"))
ALL_CONTROLS = F.Features(plan_mode=True, context_compaction=True)
LS = {"command": "ls"}


def asked(features: F.Features = ALL_CONTROLS) -> Scenario:
    """A running turn whose agent asks a master's permission for ``ls`` (interaction ``ASK``)."""
    request = {"subtype": "can_use_tool", "tool_name": "Bash", "input": LS}
    return (
        Scenario(features=features)
        >> CLAUDE.started()
        >> CLAUDE.prompted("list", TURN)
        >> line({"type": "control_request", "request_id": "r1", "request": request})
        << emit("agent.interaction.request", interaction_id=ASK, turn_id=TURN)
        << emit("agent.state.changed", current_state="awaiting_input")
        << Timer.interaction(ASK).started(60.0)
    )


def answer(interaction: object, value: str = "allow", **more: object) -> object:
    payload = {"interaction_id": interaction, "selected_value": value}
    return master("control.interaction.response", payload, **more)


def answered_again() -> list[object]:
    """An answer to ``ASK`` once it is settled: INTERACTION_NOT_FOUND, to its sender alone."""
    return rejected(answer(ASK), "INTERACTION_NOT_FOUND")


def settled(outcome: str, answer_sent: object, **metadata: object) -> list[object]:
    """The interaction resolved: its timer stopped, counted, the agent answered, the state back."""
    back = emit(
        "agent.state.changed",
        current_state="tool_calling",
        reason="permission_answered",
        turn_id=TURN,
        metadata=metadata or None,
    )
    return [
        Timer.interaction(ASK).cancelled(),
        act.Settled("PERMISSION", outcome),
        stdin(answer_sent),
        back,
    ]


def test_DPS_6_2_interaction_an_answer_to_no_pending_interaction_is_refused():
    """INTERACTION_NOT_FOUND to the sender alone, for a response or a timeout naming no pending
    interaction; the one pending is untouched and its own answer settles it, once: the same
    answer again is not found either."""
    assert (
        asked()
        >> answer("nope", mid="m-1")
        << relayed("control.interaction.response")
        << refused(
            "INTERACTION_NOT_FOUND", parent_id="m-1", message="no pending interaction 'nope'"
        )
        >> rejected(
            master("control.interaction.timeout", {"interaction_id": "nope"}),
            "INTERACTION_NOT_FOUND",
        )
        >> answer(ASK, user="ann")
        << relayed("control.interaction.response", metadata={"rawp_user": "ann"})
        << settled(
            "allowed",
            CLAUDE.answer("allow", updatedInput=LS),
            rawp_user="ann",
            interaction_id=ASK,
        )
        >> answered_again()
    )


def test_DPS_6_2_interaction_timeout_sec_passing_denies_and_a_late_answer_is_not_found():
    assert (
        asked()
        >> fire(Timer.interaction(ASK))
        << act.Settled("PERMISSION", "timed_out")
        << stdin(CLAUDE.answer("deny", message="The permission request timed out."))
        << emit("agent.state.changed", current_state="tool_calling", reason="permission_answered")
        >> answered_again()
    )


def test_DPS_6_2_interaction_a_master_timeout_denies():
    assert (
        asked()
        >> master("control.interaction.timeout", {"interaction_id": ASK})
        << relayed("control.interaction.timeout")
        << settled("timed_out", CLAUDE.answer("deny", message="The permission request timed out."))
    )


def test_DPS_6_3_2_mode_not_supported_by_the_agent():
    assert (
        Scenario()
        >> CLAUDE.started()
        >> rejected(master("control.mode.switch", {"mode": "plan"}), "MODE_NOT_SUPPORTED")
    )


def test_DPS_6_3_2_mode_switch_during_a_turn_is_refused_and_between_turns_carried():
    """During a turn: MODE_SWITCH_DURING_TURN, fatal false, the mode unchanged (the next turn
    opens in it). Outside a turn: the agent is told, agent.state.changed reason mode_switch, and
    the next session.turn.start carries the mode."""
    assert (
        Scenario(features=ALL_CONTROLS)
        >> CLAUDE.started()
        >> CLAUDE.prompted("one", TURN)
        >> rejected(master("control.mode.switch", {"mode": "plan"}), "MODE_SWITCH_DURING_TURN")
        >> line(CLAUDE.result)
        << turn_end(TURN, settles=None)
        >> master("control.mode.switch", {"mode": "plan"})
        << relayed("control.mode.switch")
        << stdin(CLAUDE.set_mode("plan"))
        << emit(
            F.StateChanged(previous_state="idle", current_state="idle", reason="mode_switch"),
            metadata={"mode": "plan", "previous_mode": "default"},
            turn_id=None,
        )
        >> prompt("two")
        << relayed("control.prompt.request")
        << turn_start(NEXT, 1, mode="plan")
        << stdin(CLAUDE.prompt("two"))
    )


def test_DPS_6_3_1_compact_not_supported_by_the_agent():
    assert Scenario() >> CLAUDE.started() >> rejected(compact(), "COMPACTION_NOT_SUPPORTED")


def test_DPS_6_3_1_compact_waits_for_the_turn_and_refuses_a_nul():
    assert (
        Scenario(features=ALL_CONTROLS)
        >> CLAUDE.started()
        >> CLAUDE.prompted("one", TURN)
        >> rejected(compact(), "PROMPT_IN_PROGRESS")
        >> line(CLAUDE.result)
        << turn_end(TURN, settles=None)
        >> rejected(compact("keep\0 it"), "INVALID_FRAME")
    )


def test_DPS_6_3_1_compact_is_a_turn_whose_compaction_is_requested():
    """The agent's own compaction in a turn a master asked for is reported ``requested``."""
    assert (
        Scenario(features=ALL_CONTROLS)
        >> CLAUDE.started()
        >> compact("keep the names")
        << relayed("control.session.compact")
        << turn_start(TURN)
        << stdin(CLAUDE.prompt("/compact keep the names"))
        >> events(ev.Compacted(trigger="manual", summary="names", pre_tokens=900, post_tokens=90))
        << emit("session.compacted", trigger="requested", summary="names", turn_id=TURN)
    )


def test_DPS_7_6_renamed_to_every_connection():
    """From the control plane (PATCH /v1/session) and from a master's frame alike: a broadcast
    with the name it had before."""
    renamed = {"session_id": SESSION, "name": "bob's", "renamed_by": "master"}
    assert (
        Scenario()
        >> rename("old")
        << emit(F.Renamed(session_id=SESSION, name="old", renamed_by="master"))
        >> rename("new", by="system")
        << emit(F.Renamed(session_id=SESSION, name="new", renamed_by="system", previous_name="old"))
        >> master("session.renamed", renamed)
        << emit(F.Renamed(**renamed, previous_name="new"), to=None, exclude=None)
    )


def test_DPS_18_respawn_delete_while_idle_with_no_process_ends_at_once():
    """No process to stop: session.deleted and the close at once (DPS-7.7-deleted); the session
    takes nothing after, a second delete does nothing, and a late exit report neither."""
    assert (
        Scenario(single_turn_process=True)
        >> start()
        >> delete()
        << deleted()
        >> delete()
        >> rejected(prompt("too late"), "SESSION_TERMINATED")
        >> exited()
    )


@pytest.mark.parametrize(("reason", "by"), [("timeout", "system"), ("master_request", "master")])
def test_DPS_7_7_deleted_says_why_and_by_whom(reason, by):
    assert Scenario() >> delete(reason, by) << deleted(reason, by)


def test_DPS_7_5_3_cleanup_delete_during_a_turn_denies_stops_then_cleans_up():
    """The pending permission is denied and the agent stopped; when it has exited, the open call
    gets a cancelled result, the turn ends with error, then session.deleted, then the close."""
    assert (
        asked()
        >> events(ev.ToolCall(call_id="toolu_1", name="Bash", input=LS))
        << emit("agent.state.changed", current_state="tool_calling")
        << emit("tool.invoke.request", invocation_id=CALL, tool_name="Bash")
        >> delete()
        << Timer.interaction(ASK).cancelled()
        << act.Settled("PERMISSION", "cancelled")
        << stdin(CLAUDE.answer("deny", message="Denied: the session is ending."))
        << act.Terminate()
        >> rejected(cancel(TURN), "SESSION_TERMINATED")
        >> exited("signal", -15, 15)
        << emit("tool.invoke.result", invocation_id=CALL, status="cancelled", turn_id=TURN)
        << turn_end(TURN, "error", tools=1, settles="tool_calling")
        << deleted()
    )


@pytest.mark.parametrize("shutdown", [False, True])
def test_DPS_7_5_3_cleanup_a_turn_the_agent_ends_while_its_session_is_deleted_ends_with_error(
    shutdown,
):
    """The agent answers the denial the delete sent with its turn's end before the stop reaches
    it (the demo agent does at once): the turn still ends error with its session, after a
    shutdown's GATEWAY_STOPPED, and the exit adds only the session's end. (It ended end_turn,
    and a relay's waiting prompt at a shutdown was answered end_turn, not TURN_FAILED.)"""
    reason, by = ("error", "client") if shutdown else ("master_request", "master")
    said = [emit(sm.SHUTDOWN_ERROR, turn_id=TURN)] if shutdown else []
    close = sm.SHUTDOWN_CLOSE if shutdown else f"session deleted ({reason})"
    assert (
        asked()
        >> delete(reason, by, shutdown=shutdown)
        << Timer.interaction(ASK).cancelled()
        << act.Settled("PERMISSION", "cancelled")
        << stdin(CLAUDE.answer("deny", message="Denied: the session is ending."))
        << emit("agent.state.changed", current_state="tool_calling")
        << act.Terminate()
        >> line(CLAUDE.result)
        << said
        << turn_end(TURN, "error", settles="tool_calling")
        >> exited("signal", -15, 15)
        << emit(F.Deleted(session_id=SESSION, reason=reason, deleted_by=by))
        << act.CloseAll(close)
    )


@pytest.mark.parametrize(
    ("type_", "payload", "code"),
    [
        ("control.prompt.cancel", {"target_turn_id": "not-running"}, "TURN_NOT_FOUND"),
        ("control.file.search", {"query": "mach"}, "FILE_SEARCH_NOT_SUPPORTED"),
        (
            "session.capabilities",
            {"protocol_version": "rawp-1.0", "supported_namespaces": [], "features": {}},
            "UNSUPPORTED_PROTOCOL",
        ),
    ],
)
def test_controls_the_gateway_cannot_act_on_are_refused_to_their_sender(type_, payload, code):
    """TURN_NOT_FOUND, FILE_SEARCH_NOT_SUPPORTED, UNSUPPORTED_PROTOCOL (DPS-1.3-legacy): the
    sender is told, fatal false; a control frame is still relayed, a capabilities frame is not."""
    relay = [relayed(type_)] if type_.startswith("control.") else []
    assert (
        Scenario()
        >> CLAUDE.started()
        >> master(type_, payload, mid="m-1")
        << relay
        << refused(code, parent_id="m-1")
    )
