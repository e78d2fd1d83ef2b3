"""What the stdio relay (``acp_relay.py``) remembers between messages: a record per request it
sent, per session it holds, per prompt waiting for its turn, per question the editor holds and
per WebSocket (link). Plain records; every decision about them is ``Relay``'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.client.acp_messages import Id, Log

__all__ = ["Link", "Prompt", "Question", "Sent", "Session"]


@dataclass
class Sent:
    """A request on a socket under a relay id: the editor's (``editor_id``) or the relay's own."""

    method: str
    link: str
    editor_id: Id = None
    from_editor: bool = True
    message: dict[str, Any] | None = None  # the editor's message, to send again if retry-safe
    session_id: str = ""
    attach: tuple[str | None, Any] = (None, None)  # cwd, mcpServers of an attaching request


@dataclass
class Session:
    cwd: str | None
    mcp_servers: Any
    link: str  # where it is attached: PRIMARY, or the pod that holds it


@dataclass
class Prompt:
    """The editor's ``session/prompt`` on a session, until answered."""

    editor_id: Id
    relay_id: int = 0  # its id on the socket it went out on
    turn_id: str | None = None  # the turn it opened, once the gateway said so
    orphan: bool = False  # its connection is gone: the relay answers it from the turn's end
    # The last update passed on before that turn's start (None: the start came first), once
    # seen: a reload replays from there, so that the gateway sees the turn start again.
    before_start: str | None = None
    start_seen: bool = False
    start_id: str | None = None  # the messageId of that start


@dataclass
class Question:
    """A request of the gateway's that the editor holds under the relay's id."""

    link: str
    epoch: int
    gateway_id: Id
    key: str | None  # the gateway's interaction id (or session and tool call)
    session: str = ""
    answer: dict[str, Any] | None = None  # the editor's answer, kept while the socket was down


@dataclass
class Link:
    """One WebSocket: at ``--url`` (PRIMARY) or at one pod of a fleet."""

    name: str
    epoch: int = 0  # connections so far; a gateway request id means something only in its epoch
    phase: str = "connecting"  # connecting | reloading | live
    failures: int = 0  # failed connection attempts since the last success
    reloads_left: int = 0
    queue: list[tuple[dict[str, Any], int]] = field(default_factory=list)  # message, its size

    def says(self, text: str) -> Log:
        return Log(f"pod {self.name}: {text}" if self.name else text)
