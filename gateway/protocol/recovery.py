"""Closing a turn the gateway lost: what was open, read back from the frames it had sent.

Theory of operation
-------------------
When the gateway stops (or dies) in the middle of a turn, the agent process goes with it, and the
turn's frames on disk end wherever they end: a text block without its ``agent.text.done``, a tool
call without its result, no ``session.turn.end``. When the session is loaded again,
``open_items(frames, turn_id)`` reads those frames back and says what was left open, and
``closing_payloads`` gives the frames that close it in the §7.5.3 order: every open block done with
``is_cancelled``, every open subagent ended and every open call given a ``cancelled`` result, then
``agent.error`` (``GATEWAY_RESTARTED``, recoverable), ``session.turn.end`` (``stop_reason: "error"``),
``session.usage`` (DPS-7.5.2-usage) and the agent back to ``idle``. Sans-IO: bytes in, payloads out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from gateway.protocol import frames as F

__all__ = ["RESTARTED", "OpenItems", "closing_payloads", "last_frames_of", "open_items"]

RESTARTED: Final = "GATEWAY_RESTARTED"
_CANCELLED_OUTPUT: Final = "The gateway restarted before the tool finished."
_UNLIMITED: Final = -1


class _Peek(msgspec.Struct):
    type: str
    payload: dict[str, Any]
    timestamp: str = ""
    turn_id: str | None = None
    metadata: dict[str, Any] | None = None


_peek = msgspec.json.Decoder(_Peek)

Meta = dict[str, Any] | None


@dataclass(slots=True)
class OpenItems:
    """What a turn had open when its frames stopped."""

    turn_id: str
    text: dict[int, Meta] = field(default_factory=dict)  # content_index → metadata
    thinking: dict[int, Meta] = field(default_factory=dict)
    calls: dict[str, tuple[str, Meta]] = field(default_factory=dict)  # invocation id → name, meta
    subagents: dict[str, Meta] = field(default_factory=dict)  # parent invocation id → metadata
    tool_invocation_count: int = 0
    agent_state: str = "idle"


def _decode(data: bytes) -> _Peek | None:
    try:
        return _peek.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def open_items(frames: Iterable[bytes], turn_id: str) -> OpenItems:
    """Replay the frames of ``turn_id`` (others are skipped) and keep what they left open."""
    items = OpenItems(turn_id)
    for data in frames:
        f = _decode(data)
        if f is None:
            continue
        if f.type == "agent.state.changed":
            items.agent_state = str(f.payload.get("current_state", items.agent_state))
        if f.turn_id != turn_id:
            continue
        p = f.payload
        match f.type:
            case "agent.text.delta":
                items.text.setdefault(p.get("content_index", 0), f.metadata)
            case "agent.text.done":
                items.text.pop(p.get("content_index", 0), None)
            case "agent.thinking.delta":
                items.thinking.setdefault(p.get("content_index", 0), f.metadata)
            case "agent.thinking.done":
                items.thinking.pop(p.get("content_index", 0), None)
            case "tool.invoke.request":
                items.calls[str(p.get("invocation_id"))] = (str(p.get("tool_name")), f.metadata)
                if not (f.metadata or {}).get("subagent_context"):
                    items.tool_invocation_count += 1
            case "tool.invoke.result":
                items.calls.pop(str(p.get("invocation_id")), None)
            case "agent.subagent.started":
                items.subagents[str(p.get("parent_invocation_id"))] = f.metadata
            case "agent.subagent.ended":
                items.subagents.pop(str(p.get("parent_invocation_id")), None)
            case "session.turn.end":
                return OpenItems(turn_id, agent_state=items.agent_state)  # it was closed after all
    return items


def last_frames_of(frames: Iterable[bytes], types: Iterable[str]) -> dict[str, bytes]:
    """The newest frame of each of ``types`` that occurs (e.g. the catalog a newly attached master
    must get), found in one pass."""
    wanted = set(types)
    found: dict[str, bytes] = {}
    for data in frames:
        f = _decode(data)
        if f is not None and f.type in wanted:
            found[f.type] = data
    return found


def timestamp_of(data: bytes) -> str | None:
    f = _decode(data)
    return f.timestamp if f is not None and f.timestamp else None


def closing_payloads(items: OpenItems) -> list[tuple[F.Payload, Meta]]:
    """The frames (payload, metadata) that close ``items``' turn, in the §7.5.3 order."""
    out: list[tuple[F.Payload, Meta]] = []
    for index, meta in items.thinking.items():
        out.append((F.ThinkingDone(content_index=index, is_cancelled=True), meta))
    for index, meta in items.text.items():
        out.append((F.TextDone(content_index=index, is_cancelled=True), meta))
    # Innermost first: a subagent's own calls end before the call that started it.
    calls = sorted(
        items.calls.items(),
        key=lambda kv: -(((kv[1][1] or {}).get("subagent_context") or {}).get("depth", 0)),
    )
    for invocation_id, (tool_name, meta) in calls:
        if invocation_id in items.subagents:
            ended = F.SubagentEnded(parent_invocation_id=invocation_id, status="cancelled")
            out.append((ended, items.subagents[invocation_id]))
        result = F.InvokeResult(
            invocation_id=invocation_id,
            tool_name=tool_name,
            status="cancelled",
            output=_CANCELLED_OUTPUT,
            output_type="text",
        )
        out.append((result, meta))
    error = F.AgentError(
        error_code=RESTARTED,
        message="the gateway restarted during this turn; the agent was stopped with it. "
        "Send the prompt again to go on: the agent resumes its conversation.",
        severity="error",
        recoverable=True,
        details=F.ErrorDetails(module="gateway"),
    )
    out.append((error, None))
    end = F.TurnEnd(
        turn_id=items.turn_id,
        stop_reason="error",
        tool_invocation_count=items.tool_invocation_count,
    )
    out.append((end, None))
    usage = F.Usage(
        turn_id=items.turn_id,
        token_usage=F.TokenUsage(input_tokens=0, output_tokens=0),
        cost_usage=F.Quota(limit=_UNLIMITED, used=0.0, unit="USD"),
        message_usage=F.Quota(limit=_UNLIMITED, used=0, unit="COUNT"),
        time_to_reset="PT0S",  # as the mapper says it: no limit applies, nothing resets
    )
    out.append((usage, None))
    if items.agent_state != "idle":
        change = F.StateChanged(
            previous_state=items.agent_state,  # type: ignore[arg-type]
            current_state="idle",
            reason="turn_end",
        )
        out.append((change, None))
    return out
