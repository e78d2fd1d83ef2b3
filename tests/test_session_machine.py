"""The session machine (gateway/protocol/session.py) on its own: events and frames in, actions out."""

from __future__ import annotations

from gateway.protocol import frames as F
from gateway.protocol import session as sm
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


def emitted(actions: list[sm.Action]) -> list[F.Frame]:
    return [a.frame for a in actions if isinstance(a, sm.Emit)]


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
    assert any(isinstance(a, sm.WriteStdin) for a in first)
    second = m.receive("c1", _prompt("two"))
    assert not any(isinstance(a, sm.WriteStdin) for a in second)
    errors = [f for f in emitted(second) if f.TYPE == "session.error"]
    assert [e.payload.error_code for e in errors] == ["PROMPT_IN_PROGRESS"]


def _prompt(text: str) -> bytes:
    import uuid

    import msgspec

    return msgspec.json.encode(
        {
            "v": 1,
            "type": "control.prompt.request",
            "message_id": str(uuid.uuid4()),
            "timestamp": "2026-11-29T00:00:00.000Z",
            "session_id": SESSION,
            "payload": {"prompt_text": text},
        }
    )
