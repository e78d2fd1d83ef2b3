"""The session machine (gateway/protocol/machine.py) on its own: events and frames in, actions out."""

from __future__ import annotations

import msgspec

from gateway.protocol import actions as act
from gateway.protocol import frames as F
from gateway.protocol import machine as sm
from parsers import events as ev
from parsers.claude_code import ClaudeCodeInput, ClaudeCodeParser

SESSION = "0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a"


def machine(**config) -> sm.SessionMachine:
    features = F.Features(subagent=True, subagent_context=True, plan_mode=True)
    return sm.SessionMachine(
        SESSION,
        ClaudeCodeParser(),
        ClaudeCodeInput(),
        sm.SessionConfig(features=features, **config),
    )


def emitted(actions: list[act.Action]) -> list[F.Frame]:
    return [a.frame for a in actions if isinstance(a, act.Emit)]


def test_DPS_10_2_context_on_a_subagents_permission_request():
    """DPS-10.2-context: the PERMISSION asked from inside a subagent carries its subagent_context."""
    m = machine()
    m.agent_events(
        [
            ev.ToolCall(
                call_id="toolu_A", name="Agent", input={}, subagent_type="Explore", group="msg_1"
            ),
            ev.ToolCall(call_id="toolu_B", name="Bash", input={"command": "ls"}, parent="toolu_A"),
        ]
    )
    frames = emitted(
        m.agent_events(
            [
                ev.PermissionRequest(
                    request_id="r1",
                    tool_name="Bash",
                    input={"command": "ls"},
                    call_id="toolu_B",
                    parent="toolu_A",
                )
            ]
        )
    )
    ask = next(f for f in frames if f.TYPE == "agent.interaction.request")
    context = ask.metadata["subagent_context"]
    assert (context.parent_invocation_id, context.depth, context.agent_type) == (
        m.mapper.invocation_id("toolu_A"), 1, "Explore",
    )  # fmt: skip
    assert ask.metadata["invocation_id"] == m.mapper.invocation_id("toolu_B")


def test_agent_session_id_is_announced_in_capabilities_extensions():
    """§18.3: the agent's session id is kept and announced as extensions.agent_session_id."""
    m = machine()
    assert m.capabilities_frame.payload.extensions is None
    frames = emitted(m.agent_events([ev.SessionStarted(agent_session_id="abc", tools=["Bash"])]))
    assert frames[0].TYPE == "session.capabilities"
    assert frames[0].payload.extensions == {"agent_session_id": "abc"}
    assert m.greeting()[0].payload.extensions == {"agent_session_id": "abc"}
    again = emitted(m.agent_events([ev.SessionStarted(agent_session_id="abc", tools=["Bash"])]))
    assert not [f for f in again if f.TYPE == "session.capabilities"]  # only when it changes


def test_DPS_17_3_2_one_prompt_the_refused_prompt_is_not_written():
    """DPS-17.3.2-one-prompt: the second prompt gives PROMPT_IN_PROGRESS and nothing on stdin."""
    m = machine()
    m.start()
    first = m.receive("c1", _prompt("one"))
    assert any(isinstance(a, act.WriteStdin) for a in first)
    second = m.receive("c1", _prompt("two"))
    assert not any(isinstance(a, act.WriteStdin) for a in second)
    errors = [f for f in emitted(second) if f.TYPE == "session.error"]
    assert [e.payload.error_code for e in errors] == ["PROMPT_IN_PROGRESS"]


def test_DPS_6_1_2_cancel_blocks_open_at_cancel_end_cancelled():
    """DPS-6.1.2-cancel: every text and thinking block open when the cancel arrives ends with
    is_cancelled, even when the agent then closes it as complete (Claude Code does, for a thinking
    block it was streaming); a block begun after the cancel ends as the agent says."""
    m = machine()
    m.start()
    m.receive("c1", _prompt("tell a story"))
    m.agent_events(
        [ev.ThinkingDelta(block="m:0", text="Let me "), ev.TextDelta(block="m:1", text="Once ")]
    )
    cancel = m.receive("c1", _frame("control.prompt.cancel", {"target_turn_id": m.turn.turn_id}))
    assert any(isinstance(a, act.WriteStdin) for a in cancel)  # the interrupt
    frames = emitted(
        m.agent_events(
            [
                ev.ThinkingEnd(block="m:0"),
                ev.TextDelta(block="m:1", text="upon"),
                ev.TextEnd(block="m:1"),
                ev.TextDelta(block="m:2", text="[late]"),
                ev.TextEnd(block="m:2"),
                ev.TurnEnded(stop_reason="end_turn"),
            ]
        )
    )
    done = {f.payload.content_index: f.payload for f in frames if f.TYPE.endswith(".done")}
    assert done[0].is_cancelled is True and done[1].is_cancelled is True
    assert done[1].full_text == "Once upon"
    assert done[2].is_cancelled is None  # opened after the cancel, closed complete
    end = next(f for f in frames if f.TYPE == "session.turn.end")
    assert end.payload.stop_reason == "cancelled"


def test_DPS_6_1_2_cancel_while_a_permission_is_pending_cancels_the_call():
    """DPS-6.1.2-cancel with DPS-6.2-interaction: the cancel denies the pending permission and
    interrupts; the call's result is cancelled whether the agent reports it refused (it read the
    denial first) or interrupted, and a call the cancel did not concern keeps its error."""
    for refused in (True, False):
        m = machine()
        m.start()
        m.receive("c1", _prompt("write never.txt"))
        m.agent_events(
            [
                ev.ToolCall(call_id="toolu_W", name="Write", input={"file_path": "never.txt"}),
                ev.ToolCall(call_id="toolu_L", name="Bash", input={"command": "ls"}),
                ev.PermissionRequest(
                    request_id="r1", tool_name="Write", input={}, call_id="toolu_W"
                ),
            ]
        )
        cancel = m.receive(
            "c1", _frame("control.prompt.cancel", {"target_turn_id": m.turn.turn_id})
        )
        answers = [a.data for a in cancel if isinstance(a, act.WriteStdin)]
        assert any(b'"behavior":"deny"' in a for a in answers)  # the denial, then the interrupt
        output = "The user doesn't want to proceed" if refused else "[Request interrupted]"
        frames = emitted(
            m.agent_events(
                [
                    ev.ToolResult(call_id="toolu_W", is_error=True, output=output),
                    ev.ToolResult(call_id="toolu_L", is_error=True, output="ls: failed"),
                ]
            )
        )
        results = {
            f.payload.tool_name: f.payload.status for f in frames if f.TYPE == "tool.invoke.result"
        }
        assert results == {"Write": "cancelled", "Bash": "error"}


def test_DPS_6_1_2_cancel_blocks_still_open_at_turn_end_end_cancelled():
    """DPS-6.1.2-cancel: a block the agent never closes is closed at the turn's end, cancelled."""
    m = machine()
    m.start()
    m.receive("c1", _prompt("tell a story"))
    m.agent_events([ev.TextDelta(block="m:0", text="Once ")])
    m.receive("c1", _frame("control.prompt.cancel", {"target_turn_id": m.turn.turn_id}))
    frames = emitted(m.agent_events([ev.TurnEnded(stop_reason="cancelled")]))
    assert [f.TYPE for f in frames][:2] == ["agent.text.done", "session.turn.end"]
    assert frames[0].payload.is_cancelled is True


def test_catalog_and_commands_before_any_prompt():
    """DPS-5.4-catalog, DPS-12.1-commands (docs/http-api.md: right after session.capabilities):
    the profile's expected tools make the greeting's catalog; a long-lived agent is asked to
    initialize at spawn, and the commands it lists are published without opening a turn."""
    m = machine(tools=("Bash", "Read"))
    greeting = m.greeting()
    assert [f.TYPE for f in greeting] == ["session.capabilities", "tool.catalog.publish"]
    assert [t.name for t in greeting[1].payload.tools] == ["Bash", "Read"]
    actions = m.start()
    assert isinstance(actions[0], act.Spawn)
    (write,) = [a for a in actions if isinstance(a, act.WriteStdin)]
    request = msgspec.json.decode(write.data)
    assert request["request"] == {"subtype": "initialize"}
    listed = ev.CommandsListed(commands=[ev.SlashCommand(name="compact", description="Compact")])
    frames = emitted(
        m.agent_events([ev.ControlAck(request_id=request["request_id"], ok=True), listed])
    )
    assert [f.TYPE for f in frames] == ["agent.commands.publish"]
    assert m.turn is None
    assert [f.TYPE for f in m.greeting()][1:] == ["tool.catalog.publish", "agent.commands.publish"]
    # the agent's own init with the same tools and commands publishes nothing again
    init = ev.SessionStarted(tools=["Bash", "Read"], commands=listed.commands)
    assert not [f for f in emitted(m.agent_events([init])) if f.TYPE != "session.capabilities"]


def test_a_restored_session_without_a_saved_catalog_greets_with_the_expected_one():
    m = machine(tools=("Bash",))
    m.restore(name=None, mode="default", turn_count=1, agent_session_id=None)
    assert [f.TYPE for f in m.greeting()] == ["session.capabilities", "tool.catalog.publish"]


def test_a_single_turn_agent_is_not_asked_to_initialize():
    m = machine(single_turn_process=True)
    assert m.start() == []
    assert [f.TYPE for f in m.greeting()] == ["session.capabilities"]


def _prompt(text: str) -> bytes:
    return _frame("control.prompt.request", {"prompt_text": text})


def _frame(type_: str, payload: dict) -> bytes:
    import uuid

    import msgspec

    return msgspec.json.encode(
        {
            "v": 1,
            "type": type_,
            "message_id": str(uuid.uuid4()),
            "timestamp": "2026-11-29T00:00:00.000Z",
            "session_id": SESSION,
            "payload": payload,
        }
    )


def test_DPS_2_4_relay_never_sends_a_frame_over_max_frame_size():
    """DPS-2.4-relay, within the announced size: a control frame within max_frame_size can grow
    when re-encoded (``1e9`` is written ``1000000000.0``): then it is not relayed, and the prompt
    itself still runs."""
    import msgspec

    m = machine(max_frame_size=4096)
    m.start()
    frame = msgspec.json.decode(_prompt("go"))
    frame["payload"]["config_overrides"] = {
        "json_schema": {"n": msgspec.Raw(b"[" + b",".join([b"1e9"] * 900) + b"]")}
    }
    data = msgspec.json.encode(frame)
    assert len(data) <= 4096
    actions = m.receive("c1", data)
    relayed = [a for a in actions if isinstance(a, act.Emit) and a.exclude == "c1"]
    assert relayed == []
    assert any(isinstance(a, act.WriteStdin) for a in actions)
    small = m.receive("c2", _prompt("next"))  # refused (a turn runs) but relayed: it fits
    assert [a.frame.TYPE for a in small if isinstance(a, act.Emit) and a.exclude == "c2"] == [
        "control.prompt.request"
    ]


def test_error_replies_quoting_a_master_stay_small():
    """A session.error may quote what the master sent (its session_id, its v): never whole."""
    import msgspec

    from gateway.protocol import codec

    m = machine(max_frame_size=4096)
    frame = msgspec.json.decode(_prompt("go"))
    for key, value in (("session_id", "s" * 100_000), ("v", ["\u0001" * 100_000])):
        bad = dict(frame, **{key: value})
        errors = emitted(m.receive("c1", msgspec.json.encode(bad)))
        assert [f.TYPE for f in errors] == ["session.error"]
        assert len(codec.encode(errors[0])) <= 4096
