"""The masters' side of a live session: a connection attached (its greeting, and on reattach the
history it missed) and detached, a frame received from it, who may send what
(``_permitted``: the rule is ``gateway/team/roles.py``'s, checked here against the sender's role on
this session; the machine settles what is answered), the audit of control frames, and which
connections a broadcast frame type goes to (``_route``).

``Masters`` is a part of ``LiveSession`` (``gateway/session/live.py``), not an object of its own:
``attach``, ``receive`` and ``detach`` are the session's methods the WebSocket handler calls. A
connection of another master protocol (an ACP client's view) is made by its own side and attached
with ``attach_connection``: the session knows every connection as a ``MasterConnection``
(``gateway/session/connection.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

import msgspec

from gateway.protocol import actions as act
from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol import machine as sm
from gateway.protocol.buffer import Backlog, FrameBuffer
from gateway.protocol.history_frames import history_frames
from gateway.session.connection import MasterConnection, Outgoing
from gateway.session.fanout import Flusher, WebSocketConnection
from gateway.team import roles
from gateway.team.audit import cut_input as audit_input

if TYPE_CHECKING:
    from gateway import config as cfg
    from gateway.metrics import GatewayMetrics
    from gateway.storage.state_dir import SavedSession

__all__ = ["Masters", "Route"]

# A frame type's connections: all that admit it, those that keep ``subagent_context``, those that
# need it stripped.
Route = tuple[
    tuple[MasterConnection, ...], tuple[MasterConnection, ...], tuple[MasterConnection, ...]
]
Conn = TypeVar("Conn", bound=MasterConnection)


class Masters:
    """The masters' side of ``LiveSession`` (see the module's docstring)."""

    if TYPE_CHECKING:
        # The session's, set in LiveSession.__init__ (gateway/session/live.py).
        id: str
        config: cfg.Config
        metrics: GatewayMetrics
        machine: sm.SessionMachine
        buffer: FrameBuffer
        saved: SavedSession | None
        owner: str
        members: dict[str, str]
        senders: dict[str, roles.Sender]
        audit: Any
        connections: dict[str, MasterConnection]
        _routes: dict[str, Route]
        _flusher: Flusher
        _line_t_ns: int
        _suspended: bool

        def perform(self, actions: list[act.Action]) -> None: ...
        def _track_state(self) -> None: ...
        def _save_record(self, *, clean: bool = False) -> None: ...
        def _act_other(self, action: act.Action) -> None: ...
        def _stdin_full(self, size: int) -> bool: ...
        def _stdin_full_error(self, parent_id: str | None, to: str | None = None) -> None: ...

    def share(self, members: dict[str, str]) -> None:
        """Replace who the session is shared with; a connection whose user may no longer see it
        is closed (1008, policy violation)."""
        self.members = dict(members)
        self._save_record()
        gone = {
            sender.identity.user
            for sender in self.senders.values()
            if roles.session_role(sender.identity, self.owner, self.members) is None
        }
        self.close_users(gone, "the session is no longer shared with you")

    def close_users(self, users: set[str], reason: str) -> None:
        """Close (1008, policy violation) every connection of these users."""
        for conn_id, sender in list(self.senders.items()):
            conn = self.connections.get(conn_id)
            if sender.identity.user in users and conn is not None:
                conn.close_after_flush(1008, reason)

    # --- connections ----------------------------------------------------------------------------

    def attach(
        self,
        conn_id: str,
        ws: Any,
        *,
        role: str,
        last_message_id: str | None,
        full_history: bool = False,
        transport: asyncio.WriteTransport,
        drain: Callable[[], Awaitable[None]],
        abort: Callable[[], None] | None = None,
        sender: roles.Sender | None = None,
    ) -> WebSocketConnection:
        """A new DPS master's WebSocket; with ``last_message_id`` a reattach, with
        ``full_history`` a master that has nothing yet and asks for everything buffered
        (``?history=all``). ``sender``: who is on it, whose role on the session decides what it
        may send (None: no checks)."""
        conn = WebSocketConnection(
            conn_id,
            ws,
            transport=transport,
            drain=drain,
            role=role,
            max_queue_bytes=self.config.server.send_queue_bytes,
            observe_latency_ns=self.metrics.observe_latency_ns,
            clock_ns=time.perf_counter_ns,
            abort=abort,
            flusher=self._flusher,
        )
        return self.attach_connection(
            conn, last_message_id=last_message_id, full_history=full_history, sender=sender
        )

    def attach_connection(
        self,
        conn: Conn,
        *,
        last_message_id: str | None = None,
        full_history: bool = False,
        sender: roles.Sender | None = None,
    ) -> Conn:
        """``attach`` of a connection of any master protocol, made by its side (an ACP client's
        view of the session, gateway/session/acp_client.py): it takes the frames a DPS master's
        socket takes, as ``Outgoing``."""
        conn_id = conn.id
        self.connections[conn_id] = conn
        if sender is not None:
            self.senders[conn_id] = sender
        self._routes.clear()
        self.metrics.ws_connected(conn.role)
        # The greeting (Emits to this connection alone), each frame encoded once: capabilities
        # first, then (on reattach) the history in the room the rest leaves in the send queue, then
        # catalog/commands/interactions. The rest (the reattach window closing) is done at once.
        greeting: list[Outgoing] = []
        for a in self.machine.attached(conn_id):
            if type(a) is act.Emit:
                greeting.append(Outgoing.of(a.frame, codec.encode(a.frame)))
            else:
                self._act_other(a)
        first, rest = greeting[0], greeting[1:]
        self._send_to(conn, first)
        if last_message_id is not None or full_history:
            after = sum(len(out.framed) for out in rest)
            if last_message_id is not None:
                backlog = self.buffer.since(last_message_id)
                lost = self._send_history(conn, backlog, last_message_id, after)
                self.metrics.reattached(lost_frames=lost)
            else:
                # An empty history is still in sync with the capabilities just sent (they are
                # marked in the buffer): a later reattach after that id is exact.
                greeting_id = first.frame.message_id
                self._send_history(conn, self.buffer.everything(), greeting_id, after)
        for out in rest:
            self._send_to(conn, out)
        self._track_state()
        return conn

    def _send_to(self, conn: MasterConnection, out: Outgoing) -> None:
        """A frame for one connection alone: sent to it and marked in the history, so that a
        reattach naming it replays what came after it."""
        conn.send(out)
        message_id = out.frame.message_id
        if self.buffer.mark(message_id) and self.saved is not None:
            self.saved.append(self.buffer.last_seq, message_id, None)

    def _send_history(
        self, conn: MasterConnection, backlog: Backlog, since: str, reserve: int
    ) -> int:
        """``session.history`` in frames that fit ``max_frame_size``
        (``protocol/history_frames.py``), no more in all than the connection's send queue takes
        beside the ``reserve`` still to come. ``since`` is the id the history is in sync with when
        the session has produced nothing. Returns the frames lost (1 when some are and their number
        is unknown)."""
        frames, unsent = history_frames(
            self.machine.factory,
            backlog.frames,
            truncated=backlog.truncated,
            lost_frame_count=backlog.lost_frame_count,
            last_message_id=backlog.last_message_id or since,
            last_sync_timestamp=backlog.last_timestamp or self.machine.factory.clock(),
            buffer_policy=self.buffer.buffer_policy,
            buffer_high_watermark=self.buffer.high_watermark,
            max_frame_size=self.config.server.max_frame_size,
            max_total_bytes=conn.max_queue_bytes - conn.queued_bytes - reserve,
        )
        for frame, data in frames:
            conn.send(Outgoing.of(frame, data))
        lost = (backlog.lost_frame_count or 0) + unsent
        return lost or (1 if backlog.truncated else 0)

    def detach(self, conn_id: str) -> None:
        conn = self.connections.pop(conn_id, None)
        self.senders.pop(conn_id, None)
        if conn is None:
            return
        self._routes.clear()
        self.metrics.ws_disconnected(conn.role)
        if not self._suspended:  # stopping: the session lives on on disk, with no window
            self.perform(self.machine.detached(conn_id))
        self._track_state()

    def receive(self, conn_id: str, data: str | bytes) -> None:
        """A frame from a master. One its sender's role on this session forbids is answered with
        ``session.error`` ``FORBIDDEN`` on its connection alone and changes nothing."""
        sender = self.senders.get(conn_id)
        if self._suspended:
            return  # the gateway is stopping; the master reattaches and sends it again
        peek = _peek_frame(data)
        self.metrics.frame_in(peek.type, len(data))
        self._line_t_ns = 0
        if sender is not None and not self._permitted(conn_id, peek, sender):
            return
        if peek.type == "control.prompt.request" and self._stdin_full(len(data)):
            # Refused before the machine opens a turn for it (the frame's size bounds what the
            # prompt becomes on stdin): nothing is started that the agent could not be told.
            mid = peek.message_id if isinstance(peek.message_id, str) else None
            self._stdin_full_error(mid, to=conn_id)
            return
        if sender is None:
            self.perform(self.machine.receive(conn_id, data))
            return
        audited = self.audit is not None and peek.type in roles.AUDITED
        asked = self._permission_asked(data) if audited else None
        self.perform(self.machine.receive(conn_id, data, user=sender.identity.user))
        if audited:
            self._audit_control(peek.type, sender, asked)

    def _permitted(self, conn_id: str, peek: _Peek, sender: roles.Sender) -> bool:
        role = roles.session_role(sender.identity, self.owner, self.members)
        if roles.may_send(role, peek.type):
            return True
        mid = peek.message_id if isinstance(peek.message_id, str) else None
        payload = F.SessionError(
            error_code="FORBIDDEN",
            message=f"{peek.type} needs role {roles.needed(peek.type)} on this session; "
            f"{sender.identity.user} has {role or 'none'}",
            fatal=False,
        )
        self.perform([act.Emit(self.machine.factory.frame(payload, parent_id=mid), to=conn_id)])
        if self.audit is not None:
            self.audit.record(
                roles.AUDITED.get(peek.type, peek.type),
                sender.identity,
                peer=sender.peer,
                session_id=self.id,
                result="refused",
                detail={"frame": peek.type[:64], "session_role": role},
            )
        return False

    def _permission_asked(self, data: str | bytes) -> tuple[str, Any] | None:
        """The interaction a ``control.interaction.*`` frame answers, before the machine settles
        it: (its id, what it asked) for the audit record."""
        interaction_id = _peek_answer(data)
        if interaction_id is None:
            return None
        return interaction_id, self.machine.interactions.get(interaction_id)

    def _audit_control(
        self, type_: str, sender: roles.Sender, asked: tuple[str, Any] | None
    ) -> None:
        detail: dict[str, Any] = {}
        if asked is not None:
            interaction_id, pending = asked
            detail["interaction_id"] = interaction_id
            if pending is not None and interaction_id not in self.machine.interactions:
                detail["tool_name"] = pending.tool_name
                detail["decision"] = self.machine.last_decision
                detail["input"] = audit_input(pending.input)
        self.audit.record(
            roles.AUDITED[type_],
            sender.identity,
            peer=sender.peer,
            session_id=self.id,
            detail=detail,
        )

    def _audit_policy(self, decided: act.PolicyDecided) -> None:
        """A rule decided a permission: counted; an answer it gave (not an ask, which a master
        answers) is recorded as a master's answer is, by no user."""
        self.metrics.decisions.policy(decided.rule, decided.decision)
        if self.audit is None or decided.decision == "ask":
            return
        self.audit.record(
            roles.AUDITED["control.interaction.response"],
            None,
            peer=None,
            session_id=self.id,
            detail={
                "tool_name": decided.tool_name,
                "decision": decided.decision,
                "input": audit_input(decided.input),
                "decided_by": f"policy:{decided.rule}",
            },
        )

    def _route(self, type_: str) -> Route:
        """The connections that admit a frame type: all, those that keep ``subagent_context`` and
        those that need it stripped; cached until a connection comes, goes or announces features."""
        admitted = tuple(c for c in self.connections.values() if c.filter.admits(type_))
        keepers = tuple(c for c in admitted if c.filter.keeps_subagent_context)
        strip = tuple(c for c in admitted if not c.filter.keeps_subagent_context)
        self._routes[type_] = route = (admitted, keepers, strip)
        return route


class _Peek(msgspec.Struct):
    type: str = "other"
    message_id: Any = None  # a wrong kind is the machine's to refuse, not a reason to miscount


_peek = msgspec.json.Decoder(_Peek)


class _AnswerPayload(msgspec.Struct):
    interaction_id: str


class _Answer(msgspec.Struct):
    payload: _AnswerPayload


_peek_answer_decoder = msgspec.json.Decoder(_Answer)


def _peek_answer(data: str | bytes) -> str | None:
    """The ``interaction_id`` a ``control.interaction.*`` frame names, if it is well formed."""
    try:
        return _peek_answer_decoder.decode(data).payload.interaction_id
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeEncodeError):
        return None


_NOTHING: Final = _Peek()


def _peek_frame(data: str | bytes) -> _Peek:
    """The type (for metrics, bounded by the metrics module) and id of a received frame, without
    validating it (the machine does)."""
    try:
        return _peek.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeEncodeError):
        # Deep nesting and lone surrogates are the codec's to refuse (INVALID_FRAME).
        return _NOTHING
