"""Fan-out (§2.4): one WebSocket connection of a session, with a bounded send queue of its own.

Theory of operation
-------------------
A session encodes each frame once and ``offer``s the same bytes to every ``Connection``. Offering
never waits: the bytes join the connection's queue and its own writer task sends them in order
(DPS-2.3-order). A connection whose queue passes ``max_queue_bytes`` (a stuck or slow master) is
closed with code 1013 ("try again later") and a reason saying to reattach with ``last_message_id``,
so it can never delay the agent or the other connections, and loses nothing it cannot get back from
the session's history. ``close_after_flush`` sends what is queued, then sets ``close_ready`` for the
task that reads the socket to close it: the session-end frames always reach a healthy master before
its WebSocket closes (DPS-7.5.3), with a complete close handshake.

Each queued item carries the ``perf_counter_ns`` at which the agent line it came from was read (0
for frames not made from a line), so the writer can observe the line-to-socket latency.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import Final

from aiohttp import WSCloseCode, WSMsgType, web

from .protocol.capabilities import ConnectionFilter

__all__ = ["Connection"]

OVERFLOW_CODE: Final = WSCloseCode.TRY_AGAIN_LATER


class Connection:
    """A WebSocket bound to a session; ``offer()`` bytes, they are written in order."""

    def __init__(
        self,
        conn_id: str,
        ws: web.WebSocketResponse,
        *,
        role: str = "master",
        max_queue_bytes: int = 16 * 1024 * 1024,
        observe_latency_ns: Callable[[int], None] | None = None,
        clock_ns: Callable[[], int] | None = None,
        abort: Callable[[], None] | None = None,
        close_timeout: float = 2.0,
    ) -> None:
        self.id = conn_id
        self.ws = ws
        self.role = role
        self.filter = ConnectionFilter()
        self.max_queue_bytes = max_queue_bytes
        self._queue: deque[tuple[bytes, int]] = deque()
        self.queued_bytes = 0
        self._wakeup = asyncio.Event()
        self._closing: tuple[int, str] | None = None
        self.closed = asyncio.Event()  # the writer is done: everything queued was sent (or lost)
        self.close_ready = asyncio.Event()  # ...and the connection should now be closed
        self.overflowed = False
        self.frames_sent = 0
        self._observe = observe_latency_ns
        self._clock_ns = clock_ns
        self._abort = abort
        self._close_timeout = close_timeout
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._writer = loop.create_task(self._write_loop())

    def offer(self, data: bytes, t_ns: int = 0) -> None:
        if self._closing is not None:
            return
        # One frame always fits, however large: the bound is on what piles up behind it.
        if self._queue and self.queued_bytes + len(data) > self.max_queue_bytes:
            self.overflowed = True
            self._queue.clear()
            self.queued_bytes = 0
            self._closing = (
                OVERFLOW_CODE,
                "send queue overflow: this connection fell too far behind; "
                "reattach with last_message_id",
            )
            # A peer that stopped reading also blocks the close frame: drop it if it cannot be
            # closed politely in time, so it holds no buffers.
            self._loop.call_later(self._close_timeout, self._abort_if_open)
        else:
            self._queue.append((data, t_ns))
            self.queued_bytes += len(data)
        self._wakeup.set()

    def close_after_flush(self, code: int = WSCloseCode.OK, reason: str = "") -> None:
        if self._closing is None:
            self._closing = (code, reason)
        self._wakeup.set()

    async def _write_loop(self) -> None:
        ws = self.ws
        try:
            while True:
                while self._queue:
                    data, t_ns = self._queue.popleft()
                    self.queued_bytes -= len(data)
                    await ws.send_frame(data, WSMsgType.TEXT)
                    self.frames_sent += 1
                    if t_ns and self._observe is not None and self._clock_ns is not None:
                        self._observe(self._clock_ns() - t_ns)
                if self._closing is not None:
                    # Everything is sent. The close handshake is done by the task that reads the
                    # socket (``close_ready``): closing from this task would make aiohttp drop the
                    # connection without waiting for the peer's close frame.
                    self.close_ready.set()
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
        except (ConnectionError, RuntimeError, asyncio.CancelledError):
            # The peer went away (or we are shutting down): nothing more to send.
            pass
        finally:
            self._queue.clear()
            self.queued_bytes = 0
            self.closed.set()

    @property
    def close_args(self) -> tuple[int, bytes]:
        """Code and reason for the close frame (reasons are limited to 123 bytes, RFC 6455)."""
        code, reason = self._closing or (WSCloseCode.OK, "")
        return code, reason.encode()[:123]

    def _abort_if_open(self) -> None:
        if self.closed.is_set():
            return
        self._writer.cancel()
        if self._abort is not None:
            self._abort()

    async def aclose(self) -> None:
        """Stop writing now (the peer is gone)."""
        self._writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._writer
