"""The session machine (gateway/protocol/machine.py) on its own, each rule told as its scenario:
agent events and master frames in, the exact actions out (``tests/support/scenario.py``)."""

from __future__ import annotations

import msgspec
import pytest

from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.actions import Settled
from parsers import events as ev
from tests.support.scenario import (
    CLAUDE,
    Partial,
    Placeholder,
    Scenario,
    Timer,
    attach,
    cancel,
    emit,
    escalation_ends,
    events,
    master_frame,
    prompt,
    raw,
    refused,
    rejected,
    relayed,
    restore,
    spawn,
    start,
    stdin,
    turn_end,
    turn_start,
)

FEATURES = F.Features(subagent=True, subagent_context=True, plan_mode=True)
TURN, ASK, INIT = Placeholder("TURN"), Placeholder("ASK"), Placeholder("INIT")
AGENT, BASH, WRITE = Placeholder("AGENT"), Placeholder("BASH"), Placeholder("WRITE")


def scenario(**config: object) -> Scenario:
    return Scenario(features=FEATURES, **config)


def interrupted(turn: Placeholder) -> list[object]:
    """A master cancels the running turn: relayed, then the escalation's first step."""
    return [cancel(turn), relayed("control.prompt.cancel"), *CLAUDE.escalation()]


def test_DPS_10_2_context_on_a_subagents_permission_request():
    """DPS-10.2-context: the PERMISSION asked from inside a subagent carries its subagent_context
    and the invocation it asks about."""
    inside = F.SubagentContext(parent_invocation_id=AGENT, depth=1, agent_type="Explore")  # type: ignore[arg-type]
    assert (
        scenario()
        >> events(
            ev.ToolCall(
                call_id="toolu_A", name="Agent", input={}, subagent_type="Explore", group="msg_1"
            ),
            ev.ToolCall(call_id="toolu_B", name="Bash", input={"command": "ls"}, parent="toolu_A"),
        )
        << turn_start(TURN)
        << emit("agent.state.changed", current_state="tool_calling", turn_id=TURN)
        << emit("tool.invoke.request", invocation_id=AGENT, tool_name="Agent", turn_id=TURN)
        << emit("agent.subagent.started", parent_invocation_id=AGENT, depth=1, turn_id=TURN)
        << emit(
            "tool.invoke.request",
            invocation_id=BASH,
            tool_name="Bash",
            metadata={"agent_call_id": "toolu_B", "subagent_context": inside},
        )
        >> events(
            ev.PermissionRequest(
                request_id="r1",
                tool_name="Bash",
                input={"command": "ls"},
                call_id="toolu_B",
                parent="toolu_A",
            )
        )
        << emit(
            "agent.interaction.request",
            interaction_id=ASK,
            interaction_type="PERMISSION",
            turn_id=TURN,
            metadata={"invocation_id": BASH, "subagent_context": inside},
        )
        << emit("agent.state.changed", current_state="awaiting_input", reason="permission_request")
        << Timer.interaction(ASK).started(60.0)
    )


def test_agent_session_id_is_announced_in_capabilities_extensions():
    """§18.3: the agent's session id is kept and announced as extensions.agent_session_id, to
    every master when it is learnt and in the greeting after; the same id again says nothing."""
    session_started = events(ev.SessionStarted(agent_session_id="abc", tools=["Bash"]))
    known = {"agent_session_id": "abc"}
    assert (
        scenario()
        >> attach("c1")
        << emit("session.capabilities", to="c1", extensions=None)
        >> session_started
        << emit("session.capabilities", extensions=known, turn_id=None)
        << emit("tool.catalog.publish", tools=[Partial(name="Bash")], turn_id=None)
        << emit("agent.commands.publish", commands=[], turn_id=None)
        >> attach("c2")
        << emit("session.capabilities", to="c2", extensions=known)
        << emit("tool.catalog.publish", to="c2")
        << emit("agent.commands.publish", to="c2")
        >> session_started
    )


def test_DPS_17_3_2_one_prompt_the_refused_prompt_is_not_written():
    """DPS-17.3.2-one-prompt: the second prompt gives PROMPT_IN_PROGRESS and nothing on stdin."""
    assert (
        scenario()
        >> CLAUDE.started()
        >> CLAUDE.prompted("one", TURN)
        >> rejected(prompt("two"), "PROMPT_IN_PROGRESS")
    )


def test_DPS_6_1_2_cancel_blocks_open_at_cancel_end_cancelled():
    """DPS-6.1.2-cancel: every text and thinking block open when the cancel arrives ends with
    is_cancelled, even when the agent then closes it as complete (Claude Code does, for a thinking
    block it was streaming); a block begun after the cancel ends as the agent says."""
    assert (
        scenario()
        >> CLAUDE.started()
        >> CLAUDE.prompted("tell a story", TURN)
        >> events(
            ev.ThinkingDelta(block="m:0", text="Let me "), ev.TextDelta(block="m:1", text="Once ")
        )
        << emit("agent.state.changed", current_state="thinking", turn_id=TURN)
        << emit("agent.thinking.delta", content_index=0, text="Let me ")
        << emit("agent.text.delta", content_index=1, text="Once ")
        >> interrupted(TURN)
        >> events(
            ev.ThinkingEnd(block="m:0"),
            ev.TextDelta(block="m:1", text="upon"),
            ev.TextEnd(block="m:1"),
            ev.TextDelta(block="m:2", text="[late]"),
            ev.TextEnd(block="m:2"),
            ev.TurnEnded(stop_reason="end_turn"),
        )
        << emit(F.ThinkingDone(content_index=0, is_cancelled=True), turn_id=TURN)
        << emit("agent.text.delta", content_index=1, text="upon")
        << emit(F.TextDone(content_index=1, full_text="Once upon", is_cancelled=True))
        << emit("agent.text.delta", content_index=2, text="[late]")
        << emit(F.TextDone(content_index=2, full_text="[late]"))  # opened after the cancel
        << escalation_ends()
        << turn_end(TURN, "cancelled")
    )


def test_DPS_6_1_2_cancel_after_a_block_ended_leaves_that_block_complete():
    """DPS-6.1.2-cancel: a block the agent ended before the cancel arrived was not cut: its done
    says no is_cancelled, although a master may send the cancel on seeing its first delta (the
    done is then already on its way: a fast model streams a short block at once). Only the blocks
    still open when the cancel is taken end cancelled (docs/protocol-notes.md)."""
    assert (
        scenario()
        >> CLAUDE.started()
        >> CLAUDE.prompted("tell a story", TURN)
        >> events(
            ev.TextDelta(block="m:0", text="Once upon a time."),
            ev.TextEnd(block="m:0"),
            ev.TextDelta(block="m:1", text="Then "),
        )
        << emit("agent.state.changed", current_state="thinking", turn_id=TURN)
        << emit("agent.text.delta", content_index=0, text="Once upon a time.")
        << emit(F.TextDone(content_index=0, full_text="Once upon a time."))
        << emit("agent.text.delta", content_index=1, text="Then ")
        >> interrupted(TURN)
        >> events(ev.TextEnd(block="m:1"), ev.TurnEnded(stop_reason="end_turn"))
        << emit(F.TextDone(content_index=1, full_text="Then ", is_cancelled=True))
        << escalation_ends()
        << turn_end(TURN, "cancelled")
    )


@pytest.mark.parametrize(
    "output", ["The user doesn't want to proceed", "[Request interrupted]"], ids=["refused", "cut"]
)
def test_DPS_6_1_2_cancel_while_a_permission_is_pending_cancels_the_call(output):
    """DPS-6.1.2-cancel with DPS-6.2-interaction: the cancel denies the pending permission and
    interrupts; the call's result is cancelled whether the agent reports it refused (it read the
    denial first) or interrupted, and a call the cancel did not concern keeps its error."""
    assert (
        scenario()
        >> CLAUDE.started()
        >> CLAUDE.prompted("write never.txt", TURN)
        >> events(
            ev.ToolCall(call_id="toolu_W", name="Write", input={"file_path": "never.txt"}),
            ev.ToolCall(call_id="toolu_L", name="Bash", input={"command": "ls"}),
            ev.PermissionRequest(request_id="r1", tool_name="Write", input={}, call_id="toolu_W"),
        )
        << emit("agent.state.changed", current_state="tool_calling")
        << emit("tool.invoke.request", invocation_id=WRITE, tool_name="Write")
        << emit("tool.invoke.request", invocation_id=BASH, tool_name="Bash")
        << emit("agent.interaction.request", interaction_id=ASK, metadata={"invocation_id": WRITE})
        << emit("agent.state.changed", current_state="awaiting_input")
        << Timer.interaction(ASK).started(60.0)
        >> cancel(TURN)
        << relayed("control.prompt.cancel")
        << Timer.interaction(ASK).cancelled()
        << Settled("PERMISSION", "cancelled")
        << stdin(CLAUDE.answer("deny", message="Denied: the turn was cancelled."))
        << emit("agent.state.changed", current_state="tool_calling", reason="permission_answered")
        << CLAUDE.escalation()
        >> events(
            ev.ToolResult(call_id="toolu_W", is_error=True, output=output),
            ev.ToolResult(call_id="toolu_L", is_error=True, output="ls: failed"),
        )
        << emit("tool.invoke.result", invocation_id=WRITE, status="cancelled", output=output)
        << emit("tool.invoke.result", invocation_id=BASH, status="error", output="ls: failed")
        << emit("agent.state.changed", current_state="thinking", reason="tool_result")
    )


def test_DPS_6_1_2_cancel_blocks_still_open_at_turn_end_end_cancelled():
    """DPS-6.1.2-cancel: a block the agent never closes is closed at the turn's end, cancelled."""
    assert (
        scenario()
        >> CLAUDE.started()
        >> CLAUDE.prompted("tell a story", TURN)
        >> events(ev.TextDelta(block="m:0", text="Once "))
        << emit("agent.state.changed", current_state="thinking")
        << emit("agent.text.delta", content_index=0, text="Once ")
        >> interrupted(TURN)
        >> events(ev.TurnEnded(stop_reason="cancelled"))
        << escalation_ends()
        << emit(F.TextDone(content_index=0, full_text="Once ", is_cancelled=True), turn_id=TURN)
        << turn_end(TURN, "cancelled")
    )


def test_catalog_and_commands_before_any_prompt():
    """DPS-5.4-catalog, DPS-12.1-commands (docs/http-api.md: right after session.capabilities):
    the profile's expected tools make the greeting's catalog; a long-lived agent is asked to
    initialize at spawn, and the commands it lists are published without opening a turn."""
    listed = ev.CommandsListed(commands=[ev.SlashCommand(name="compact", description="Compact")])
    compact = [F.Command(name="compact", description="Compact")]
    assert (
        scenario(tools=("Bash", "Read"))
        >> attach("c1")
        << emit("session.capabilities", to="c1")
        << emit("tool.catalog.publish", to="c1", tools=[Partial(name="Bash"), Partial(name="Read")])
        >> start()
        << spawn()
        << stdin(type="control_request", request_id=INIT, request={"subtype": "initialize"})
        >> events(ev.ControlAck(request_id=INIT, ok=True), listed)  # type: ignore[arg-type]
        << emit(F.CommandsPublish(commands=compact), turn_id=None)
        >> attach("c2")
        << emit("session.capabilities", to="c2")
        << emit("tool.catalog.publish", to="c2")
        << emit("agent.commands.publish", to="c2")
        # the agent's own init with the same tools and commands publishes nothing again
        >> events(ev.SessionStarted(tools=["Bash", "Read"], commands=listed.commands))
    )


def test_a_restored_session_without_a_saved_catalog_greets_with_the_expected_one():
    assert (
        scenario(tools=("Bash",))
        >> restore(turn_count=1)
        >> attach("c1")
        << emit("session.capabilities", to="c1")
        << emit("tool.catalog.publish", to="c1", tools=[Partial(name="Bash")])
    )


def test_a_single_turn_agent_is_not_asked_to_initialize():
    assert (
        scenario(single_turn_process=True)
        >> start()
        >> attach("c1")
        << emit("session.capabilities", to="c1")
    )


def test_DPS_2_4_relay_never_sends_a_frame_over_max_frame_size():
    """DPS-2.4-relay, within the announced size: a control frame within max_frame_size can grow
    when re-encoded (``1e9`` is written ``1000000000.0``): then it is not relayed, and the prompt
    itself still runs."""
    schema = {"n": msgspec.Raw(b"[" + b",".join([b"1e9"] * 900) + b"]")}
    payload = {"prompt_text": "go", "config_overrides": {"json_schema": schema}}
    data = master_frame("control.prompt.request", payload)
    assert len(data) <= 4096
    assert (
        scenario(max_frame_size=4096)
        >> CLAUDE.started()
        >> raw(data)
        << turn_start(TURN)
        << stdin(CLAUDE.prompt("go"))
        >> prompt("next", conn="c2")  # refused (a turn runs) but relayed: it fits
        << relayed("control.prompt.request", "c2")
        << refused("PROMPT_IN_PROGRESS", to="c2")
    )


def fits_4096(frame: F.Frame) -> bool:
    return len(codec.encode(frame)) <= 4096


@pytest.mark.parametrize(
    ("key", "value"), [("session_id", "s" * 100_000), ("v", ["\u0001" * 100_000])]
)
def test_error_replies_quoting_a_master_stay_small(key, value):
    """A session.error may quote what the master sent (its session_id, its v): never whole."""
    bad = msgspec.json.decode(master_frame("control.prompt.request", {"prompt_text": "go"}))
    bad[key] = value
    assert (
        scenario(max_frame_size=4096)
        >> raw(msgspec.json.encode(bad))
        << emit("session.error", to="c1", fatal=False, where=fits_4096)
    )
