"""An ACP client's WebSocket as masters of sessions (docs/acp-masters.md): ``AcpClient`` is one
``/acp`` connection, ``AcpAttachment`` its place among a session's connections.

An attachment is a ``MasterConnection`` (gateway/session/connection.py), the ACP one: the session
treats it as it treats a DPS master's socket (``Masters.attach_connection``): it hands it the same
``Outgoing`` frames it hands every connection (``send``), replies to it alone, and closes it
(``close_after_flush``). The attachment gives each typed frame to its ``AcpView``
(gateway/protocol/acp_master.py, sans-IO), and what the view makes goes out on the client's one
writer (an ``AcpWriter``): a ``WebSocketConnection`` of the WebSocket itself
(gateway/session/fanout.py), or the server-sent events of a Streamable HTTP connection
(gateway/server/acp_http.py). Either way the ACP messages of every session of the connection and
the responses to its requests leave in order, without a task per message, bounded by
``send_queue_bytes`` (past it the connection is closed, and the client loads its sessions again
after the last ``messageId`` it saw).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final, Protocol

from aiohttp import WSCloseCode

from gateway.protocol import frames as F
from gateway.protocol.acp_master import AcpView
from gateway.protocol.capabilities import ConnectionFilter, agreed_features
from gateway.session.connection import Outgoing
from gateway.team import roles

if TYPE_CHECKING:
    from gateway.session.live import LiveSession

__all__ = ["MAX_ATTACHED", "AcpAttachment", "AcpClient", "AcpWriter"]

MAX_ATTACHED: Final = 64  # sessions one ACP connection is attached to at once
# What an ACP client takes of the frames that features gate: everything ACP can show.
_WANTED: Final = F.Features(thinking_stream=True, tool_streaming=True, plan_mode=True)
# A session closes its connections with this when the connection itself must go (the gateway
# restarts): the whole ACP socket closes, not one session's view. The other closes (the session
# ended, or is no longer shared with this user: 1008) let go of that session alone.
_WHOLE_SOCKET: Final = (WSCloseCode.SERVICE_RESTART,)


class AcpWriter(Protocol):
    """Where the messages of one ACP connection go, in order, whatever its transport."""

    max_queue_bytes: int
    queued_bytes: int

    def offer(self, data: bytes, t_ns: int = 0) -> None: ...

    def close_after_flush(self, code: int = WSCloseCode.OK, reason: str = "") -> None: ...

    @property
    def closed(self) -> asyncio.Event:
        """Set once it writes no more (a stopping gateway waits for it, for a while)."""
        ...

    def abort(self) -> None:
        """Drop what it holds and close now: a client that does not read its last messages."""
        ...


class AcpAttachment:
    """One session's connection that is an ACP client's view (see the module docstring)."""

    def __init__(self, conn_id: str, client: AcpClient, session: LiveSession, view: AcpView):
        self.id = conn_id
        self.role = "master"
        self.client = client
        self.session = session
        self.view = view
        self.filter = ConnectionFilter(agreed_features(_WANTED, session.machine.config.features))
        self.closed = asyncio.Event()
        self.close_ready = asyncio.Event()
        # Messages kept back until ``release``: a new session's greeting must follow the answer
        # that tells the client the session's id.
        self.held: list[bytes] | None = None

    @property
    def max_queue_bytes(self) -> int:
        # What a load may replay is what this takes in the session's frames; their ACP messages
        # are bigger (a delta's messageId, the envelope): half the writer's room leaves room for
        # them, so a load of a long history is cut (oldest first, said in lostFrames) rather than
        # closing the socket it is written to.
        return self.client.out.max_queue_bytes // 2

    @property
    def queued_bytes(self) -> int:
        return self.client.out.queued_bytes

    def send(self, out: Outgoing) -> None:
        """A frame as every connection gets it: the view reads the typed frame."""
        if self.closed.is_set():
            return
        messages = self.view.take(out.frame)
        if self.held is not None:
            self.held += messages
            return
        writer = self.client.out
        t_ns = out.t_ns
        for message in messages:
            writer.offer(message, t_ns)
            t_ns = 0

    def release(self) -> None:
        """Send what was held back, and from now on everything as it comes."""
        held, self.held = self.held or [], None
        for message in held:
            self.client.out.offer(message)

    def close_after_flush(self, code: int = WSCloseCode.OK, reason: str = "") -> None:
        """The session lets go of this view (it ended, or this user may no longer see it)."""
        if self.closed.is_set():
            return
        self.client.let_go(self, code, reason)

    async def aclose(self) -> None:
        self.closed.set()
        self.close_ready.set()


class AcpClient:
    """One ``/acp`` connection: its writer, who is on it, and the sessions it is attached to."""

    def __init__(self, conn_id: str, out: AcpWriter, sender: roles.Sender) -> None:
        self.id = conn_id
        self.out = out
        self.sender = sender
        self.turn_events = False  # _rawp/turn notifications (initialize's _meta asks for them)
        self.attached: dict[str, AcpAttachment] = {}  # session id -> its view
        self._count = 0

    def attach(
        self,
        session: LiveSession,
        *,
        last_message_id: str | None = None,
        history: bool = False,
        hold: bool = False,
    ) -> AcpAttachment:
        """Attach to ``session`` (again: the earlier view leaves first); with ``history`` its
        buffered history (after ``last_message_id`` when given) is replayed first; with ``hold``
        what the session says is kept back until ``release``."""
        old = self.attached.get(session.id)
        if old is not None:
            self.detach(old)
        self._count += 1
        view = AcpView(session.id, session.machine.factory, turn_events=self.turn_events)
        # A load after a lastMessageId may replay no turn start while a turn runs: the view takes
        # the running turn from the machine (replayed starts and ends keep it right afterwards),
        # so the load says its turnId and a session/cancel on this connection reaches it.
        running = session.machine.turn
        view.turn_id = running.turn_id if running is not None else None
        att = AcpAttachment(f"{self.id}/{self._count}", self, session, view)
        if hold:
            att.held = []
        self.attached[session.id] = att
        view.greeting = True
        try:
            session.attach_connection(
                att,
                last_message_id=last_message_id,
                full_history=history and last_message_id is None,
                sender=self.sender,
            )
        finally:
            view.greeting = False
        return att

    def asker(self, rpc_id: str) -> AcpAttachment | None:
        """The view that asked the question our request ``rpc_id`` is."""
        return next((a for a in self.attached.values() if rpc_id in a.view.asked), None)

    def detach(self, att: AcpAttachment, code: str = "DETACHED", why: str = "") -> None:
        """This view leaves its session; requests it still waits for are answered."""
        if self.attached.get(att.session.id) is att:
            del self.attached[att.session.id]
        for message in att.view.ended(code, why or "the connection left the session"):
            self.out.offer(message)
        if not att.closed.is_set():
            att.closed.set()
            att.close_ready.set()
            att.session.detach(att.id)

    def let_go(self, att: AcpAttachment, code: int, reason: str) -> None:
        # Called from inside the session (while it closes its connections): leave it once that
        # call is over.
        att.closed.set()
        asyncio.get_running_loop().call_soon(self._let_go, att, code, reason)

    def _let_go(self, att: AcpAttachment, code: int, reason: str) -> None:
        if self.attached.get(att.session.id) is att:
            del self.attached[att.session.id]
        code_name = "FORBIDDEN" if code == WSCloseCode.POLICY_VIOLATION else "SESSION_TERMINATED"
        for message in att.view.ended(code_name, reason or "the session ended"):
            self.out.offer(message)
        att.close_ready.set()
        att.session.detach(att.id)
        if code in _WHOLE_SOCKET:
            self.out.close_after_flush(code, reason)

    def close(self) -> None:
        """The socket is gone: every view leaves its session."""
        for att in list(self.attached.values()):
            self.detach(att)
