"""What the session machine asks its shell to do: the actions ``SessionMachine`` returns.

Each input the machine is fed (an agent line, a master's frame, a timer, an exit) is answered with
an ordered list of these; the asyncio shell (``gateway/session/``) carries them out in that order.
They are plain records: the machine decides, the shell performs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from gateway.protocol import frames as F
from gateway.protocol.states import TimerKey
from parsers import events as ev

__all__ = [
    "Action",
    "CancelTimer",
    "CloseAll",
    "Emit",
    "Log",
    "PlaceFile",
    "PolicyDecided",
    "ReadMcpReasons",
    "SetFeatures",
    "Settled",
    "Signal",
    "Spawn",
    "StartTimer",
    "Terminate",
    "WritePrompt",
    "WriteStdin",
]


class Emit(msgspec.Struct):
    """Send a frame. ``to``: only that connection (not buffered); ``exclude``: all but that one.
    (A Struct, not a dataclass: one is made per frame, and a Struct's ``__init__`` is C.)"""

    frame: F.Frame
    to: str | None = None
    exclude: str | None = None


@dataclass(slots=True)
class WriteStdin:
    data: bytes


@dataclass(slots=True)
class WritePrompt:
    """Write a prompt that carries images on the agent's stdin: the shell encodes it with the
    agent's input, reading the images' bytes from its file store."""

    text: str
    images: list[ev.StoredFile]


@dataclass(slots=True)
class PlaceFile:
    """Copy the stored file ``transfer_id`` into the workspace as ``prompts.UPLOADS_DIR/name``."""

    transfer_id: str
    name: str


@dataclass(slots=True)
class Spawn:
    """Start the agent. ``prompt`` for single-turn agents (``{prompt}`` in argv), ``resume_id`` to
    fill ``resume_flag``, ``mode`` for the agent's own permission mode, ``overrides`` per turn,
    ``images`` attached to the prompt (``image_flag`` or the stdin prompt)."""

    prompt: str | None = None
    resume_id: str | None = None
    mode: str = "default"
    overrides: F.ConfigOverrides | None = None
    images: list[ev.StoredFile] = field(default_factory=list)


@dataclass(slots=True)
class Signal:
    signum: int


@dataclass(slots=True)
class Terminate:
    """SIGTERM, then SIGKILL after the grace period (DPS-17.2.3); ``agent_exited`` follows."""


@dataclass(slots=True)
class StartTimer:
    """(Re)start the timer ``key``: ``timer_fired(key)`` after ``seconds`` unless cancelled."""

    key: TimerKey
    seconds: float


@dataclass(slots=True)
class CancelTimer:
    key: TimerKey


@dataclass(slots=True)
class SetFeatures:
    conn_id: str
    features: F.Features


@dataclass(slots=True)
class CloseAll:
    reason: str


@dataclass(slots=True)
class Log:
    level: Literal["debug", "info", "warning", "error"]
    message: str
    fields: dict[str, Any] = field(default_factory=dict)
    # An exception whose traceback the log gets (a plugin's bug): for the operator, never a frame.
    exc: BaseException | None = None


@dataclass(slots=True)
class Settled:
    """An interaction asked of masters was resolved (for metrics): allowed, denied, timed_out,
    cancelled."""

    interaction_type: str
    outcome: str


@dataclass(frozen=True, slots=True)
class PolicyDecided:
    """A permission rule decided (the metrics; the audit log for an answer): the rule's name, allow
    or deny (the agent answered, no master asked) or ask (a master is asked), and the tool."""

    rule: str
    decision: str
    tool_name: str
    input: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ReadMcpReasons:
    """MCP servers the agent says failed without saying why: the shell looks where the agent
    writes why (Claude Code's MCP logs) and tells ``SessionMachine.mcp_reasons``."""

    names: tuple[str, ...]


Action = (
    Emit | WriteStdin | Spawn | Signal | Terminate | StartTimer | CancelTimer | SetFeatures
) | (CloseAll | Log | Settled | WritePrompt | PlaceFile | PolicyDecided | ReadMcpReasons)
