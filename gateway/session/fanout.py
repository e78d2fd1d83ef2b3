"""Fan-out (§2.4): one WebSocket connection of a session, written to without a task per frame.

Theory of operation
-------------------
``WebSocketConnection`` is the DPS master's ``MasterConnection`` (gateway/session/connection.py).
A session encodes each frame once and frames it once (``Outgoing.framed``: the WebSocket header and
the JSON, RFC 6455, unmasked, uncompressed), then hands the same ``Outgoing`` to every admitted
connection (``send``): each DPS connection writes the same bytes. ``offer`` writes JSON that is not
a session's frame (the ACP socket's messages, gateway/session/acp_client.py). Sending never waits
and never awaits:

* While the connection's transport is under its high-water mark, the bytes join a list that is
  written with one ``transport.write`` when the session's ``Flusher`` runs: at the end of a
  batch of agent lines, or else once at the end of the loop iteration (one ``call_soon`` for all the
  session's connections). Every frame made in the same batch leaves in one write per connection,
  each still its own WebSocket message, in order (DPS-2.3-order).
* Once a write leaves the transport over its mark (a slow master), the connection holds what comes
  next and one drain task waits for the transport (``drain``), then writes what it holds. What a
  connection has not yet written (pending and held, ``queued_bytes``) is bounded by
  ``max_queue_bytes``; past it the connection is cut off: what it holds is
  dropped and it is closed with code 1013 ("try again later") and a reason saying to reattach with
  ``last_message_id``, so it can never delay the agent or the other connections, and loses nothing
  it cannot get back from the session's history. One frame always fits, however large: the bound is
  on what piles up behind it.

``close_after_flush`` writes what is pending, then sets ``close_ready`` for the task that reads the
socket to close it: the session-end frames always reach a healthy master before its WebSocket closes
(DPS-7.5.3), with a complete close handshake. aiohttp's own writes on the same transport (pings,
pongs, the close frame) only ever come between whole messages.

Each frame carries the ``perf_counter_ns`` at which the agent line it came from was read (0 for
frames not made from a line), so the line-to-socket latency is observed when it is written.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import WSCloseCode

from gateway.protocol.capabilities import ConnectionFilter
from gateway.session.connection import Outgoing, text_frame

__all__ = ["CLOSE_TIMEOUT_SEC", "Flusher", "WebSocketConnection"]

OVERFLOW_CODE: Final = WSCloseCode.TRY_AGAIN_LATER
# How long a connection the gateway closes gets, first for its last frames and then for the close
# handshake, before its socket is dropped: a master that stopped reading must not hold up a
# deletion or a stop (container engines SIGKILL 10 s after SIGTERM). docs/limits.md.
CLOSE_TIMEOUT_SEC: Final = 2.0


class Flusher:
    """Writes what the connections of a session have pending: ``flush()`` now, or by itself once
    at the end of the loop iteration; ``hold()`` defers that to the ``flush()`` the caller does."""

    __slots__ = ("_dirty", "_held", "_scheduled", "_spare")

    def __init__(self) -> None:
        self._dirty: list[WebSocketConnection] = []
        self._spare: list[WebSocketConnection] = []
        self._scheduled = False
        self._held = False

    def mark(self, conn: WebSocketConnection) -> None:
        self._dirty.append(conn)
        if not self._scheduled and not self._held:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_flush)

    def hold(self) -> None:
        self._held = True

    def flush(self) -> None:
        self._held = False
        dirty = self._dirty
        if dirty:
            # The same two lists in turn, not a new one per flush: a list made per line lives
            # until the next line, so the garbage collector's youngest generation always held
            # one per session (and per connection, below).
            self._dirty, self._spare = self._spare, dirty
            for conn in dirty:
                conn._flush()
            dirty.clear()

    def _scheduled_flush(self) -> None:
        self._scheduled = False
        if not self._held:
            self.flush()


class WebSocketConnection:
    """A WebSocket bound to a session (a DPS master's ``MasterConnection``), or the one ACP
    socket of an ACP client; what it is given is written in order."""

    def __init__(
        self,
        conn_id: str,
        ws: object,
        *,
        transport: asyncio.WriteTransport,
        drain: Callable[[], Awaitable[None]],
        role: str = "master",
        max_queue_bytes: int = 16 * 1024 * 1024,
        observe_latency_ns: Callable[[int], None] | None = None,
        clock_ns: Callable[[], int] | None = None,
        abort: Callable[[], None] | None = None,
        close_timeout: float = CLOSE_TIMEOUT_SEC,
        flusher: Flusher | None = None,
    ) -> None:
        self.id = conn_id
        self.ws = ws  # the socket's owner (the server's handler) reads and closes it
        self.role = role
        self.filter = ConnectionFilter()
        self.max_queue_bytes = max_queue_bytes
        self._transport = transport
        self._high_water = _high_water(transport)
        self._drain = drain
        self._pending: list[bytes] = []  # framed, for the end of this loop iteration
        self._times: list[int] = []  # line read times of the pending frames that have one
        self._spare_pending: list[bytes] = []  # the two above, next time (see Flusher.flush)
        self._spare_times: list[int] = []
        self._dirty = False  # marked in the flusher
        self._held: list[bytes] = []  # framed, behind a transport over its high-water mark
        self._held_times: list[int] = []
        self.queued_bytes = 0  # pending and held: what this connection has not written yet
        self._pending_bytes = 0
        self._drainer: asyncio.Task[None] | None = None
        self._closing: tuple[int, str] | None = None
        self.closed = asyncio.Event()  # the writing is done: everything was written (or lost)
        self.close_ready = asyncio.Event()  # ...and the connection should now be closed
        self.overflowed = False
        self.frames_sent = 0
        self._observe = observe_latency_ns
        self._clock_ns = clock_ns
        self._abort = abort
        self._close_timeout = close_timeout
        self._loop = asyncio.get_running_loop()
        self._flusher = flusher if flusher is not None else Flusher()

    def send(self, out: Outgoing) -> None:
        """One frame of the session's: its WebSocket message, framed once for every connection."""
        # The step of every frame's fan-out to each connection: the usual case (nothing held,
        # room in the queue) is ``write_framed``'s written out here, a call less per connection.
        framed = out.framed
        size = len(framed)
        queued = self.queued_bytes
        if (
            self._drainer is not None
            or self._closing is not None
            or (queued and queued + size > self.max_queue_bytes)
        ):
            self.write_framed(framed, out.t_ns)
            return
        self.queued_bytes = queued + size
        self._pending.append(framed)
        self._pending_bytes += size
        t_ns = out.t_ns
        if t_ns:
            self._times.append(t_ns)
        if not self._dirty:
            self._dirty = True
            self._flusher.mark(self)

    def offer(self, data: bytes, t_ns: int = 0) -> None:
        """Send one JSON message (framed here) to this connection alone."""
        self.write_framed(text_frame(data), t_ns)

    def write_framed(self, framed: bytes, t_ns: int = 0) -> None:
        """Send one WebSocket message made by ``text_frame``."""
        if self._closing is not None:
            return
        size = len(framed)
        if self.queued_bytes and self.queued_bytes + size > self.max_queue_bytes:
            self._overflow()
            return
        self.queued_bytes += size
        if self._drainer is not None:
            self._held.append(framed)
            if t_ns:
                self._held_times.append(t_ns)
            return
        self._pending.append(framed)
        self._pending_bytes += size
        if t_ns:
            self._times.append(t_ns)
        if not self._dirty:
            self._dirty = True
            self._flusher.mark(self)

    def _flush(self) -> None:
        self._dirty = False
        pending, times = self._pending, self._times
        if not pending:
            return
        self._pending, self._spare_pending = self._spare_pending, pending
        self._times, self._spare_times = self._spare_times, times
        self.queued_bytes -= self._pending_bytes
        self._pending_bytes = 0
        self._write(pending, times)
        pending.clear()
        times.clear()
        if self._closing is not None and self._drainer is None:
            self._finish()

    def _write(self, buffers: list[bytes], times: list[int]) -> None:
        transport = self._transport
        if transport.is_closing():
            # The peer went away: nothing more to send (the reading task sees the close).
            self._lost()
            return
        if len(buffers) == 1:
            transport.write(buffers[0])
        else:
            transport.write(b"".join(buffers))
        self.frames_sent += len(buffers)
        if times and self._observe is not None and self._clock_ns is not None:
            now = self._clock_ns()
            observe = self._observe
            for t_ns in times:
                observe(now - t_ns)
        if self._drainer is None and transport.get_write_buffer_size() > self._high_water:
            self._drainer = self._loop.create_task(self._drain_held())

    async def _drain_held(self) -> None:
        try:
            while True:
                await self._drain()
                held, times = self._held, self._held_times
                if not held:
                    break
                self._held, self._held_times = [], []
                self.queued_bytes = self._pending_bytes  # (nothing is pending while held)
                self._write(held, times)
                if self._transport.is_closing():
                    return
        except (ConnectionError, RuntimeError):
            self._lost()
            return
        self._drainer = None
        if self._closing is not None:
            self._finish()

    def _overflow(self) -> None:
        self.overflowed = True
        self._closing = (
            OVERFLOW_CODE,
            "send queue overflow: this connection fell too far behind; "
            "reattach with last_message_id",
        )
        self._drop()
        # A peer that stopped reading also blocks the close frame: drop it if it cannot be closed
        # politely in time, so it holds no buffers.
        self._loop.call_later(self._close_timeout, self._abort_if_open)
        self._finish()

    def close_after_flush(self, code: int = WSCloseCode.OK, reason: str = "") -> None:
        if self._closing is None:
            self._closing = (code, reason)
        if self._drainer is None and not self._dirty:
            self._finish()

    def _finish(self) -> None:
        self.close_ready.set()
        self.closed.set()

    def _drop(self) -> None:
        self._pending, self._times = [], []
        self._held, self._held_times = [], []
        self.queued_bytes = self._pending_bytes = 0
        drainer, self._drainer = self._drainer, None
        if drainer is not None and drainer is not asyncio.current_task():
            drainer.cancel()

    def _lost(self) -> None:
        if self._closing is None:
            self._closing = (WSCloseCode.GOING_AWAY, "")
        self._drop()
        self.closed.set()

    @property
    def close_args(self) -> tuple[int, bytes]:
        """Code and reason for the close frame (reasons are limited to 123 bytes, RFC 6455)."""
        code, reason = self._closing or (WSCloseCode.OK, "")
        return code, reason.encode()[:123]

    def abort(self) -> None:
        """Drop the socket now, with no close handshake (a peer that does not answer one)."""
        if self._abort is not None:
            self._abort()

    def _abort_if_open(self) -> None:
        if not self._transport.is_closing() and self._abort is not None:
            self._abort()

    async def aclose(self) -> None:
        """Stop writing now (the peer is gone)."""
        drainer = self._drainer
        self._lost()
        if drainer is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await drainer


def _high_water(transport: asyncio.WriteTransport) -> int:
    try:
        return transport.get_write_buffer_limits()[1]
    except (AttributeError, NotImplementedError):  # pragma: no cover - every loop's TCP has it
        return 64 * 1024
