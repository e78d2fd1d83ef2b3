"""Connection limits before a request is trusted (docs/limits.md, "Connections"): slow headers and
unauthenticated connections, which cost a file descriptor each and nothing to the client.

Theory of operation
-------------------
* **Headers in bounded time.** aiohttp arms its keep-alive timer when a connection opens and again
  after each response, and closes a connection that is still waiting for a complete request when
  it fires; bytes of an incomplete request do not re-arm it. ``handler_args`` sets that timer to
  ``[server] header_timeout_sec``: the headers of every request must be complete that long after
  the connection opened or its previous response ended, or the connection is closed (an idle
  keep-alive connection too, after as long). A request being handled (a body streaming in, a
  WebSocket) is not affected.
* **Unauthenticated connections are bounded.** ``GatewayRunner`` wraps each accepted connection's
  aiohttp protocol in ``_Counted``, which counts it as pending until a request on it passes
  authentication (``ConnectionGuard.authenticated``, called by the server's auth middleware) or it
  closes. A connection accepted while ``[server] max_pending_connections`` are pending is closed at
  once. Requests to the public paths (``/healthz``, the console's page) do not make a connection
  authenticated.
* **WebSockets per session.** ``ConnectionGuard.upgrade`` holds a place for an upgrade from the
  check to the attach, so concurrent upgrades cannot together pass
  ``[server] max_connections_per_session``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, cast

from aiohttp import web

from gateway.server.refusals import JsonErrorRunner

__all__ = ["ConnectionGuard", "GatewayRunner", "handler_args"]

log = logging.getLogger("rawp_gateway.connections")


def handler_args(header_timeout_sec: float) -> dict[str, Any]:
    """aiohttp's per-connection settings that bound slow headers (see the module docstring)."""
    return {"keepalive_timeout": header_timeout_sec}


class ConnectionGuard:
    """Pending (not yet authenticated) connections and WebSocket upgrades in progress."""

    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self._pending: set[asyncio.BaseProtocol] = set()
        self.refused = 0  # connections closed at once: too many pending
        self._upgrading: Counter[str] = Counter()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def admit(self, protocol: asyncio.BaseProtocol) -> bool:
        if len(self._pending) >= self.max_pending:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning(
                    "connection refused: too many connections not yet authenticated",
                    extra={"pending": len(self._pending), "refused": self.refused},
                )
            return False
        self._pending.add(protocol)
        return True

    def authenticated(self, protocol: asyncio.BaseProtocol | None) -> None:
        """A request on this connection passed authentication: it is no longer pending."""
        self._pending.discard(protocol)  # type: ignore[arg-type]

    def lost(self, protocol: asyncio.BaseProtocol) -> None:
        self._pending.discard(protocol)

    @contextlib.contextmanager
    def upgrade(self, session_id: str, attached: int, limit: int) -> Iterator[bool]:
        """A place for one more WebSocket of ``session_id`` (``attached`` are open), held until
        the block ends (the upgrade attached or failed); yields False when there is none."""
        if attached + self._upgrading[session_id] >= limit:
            yield False
            return
        self._upgrading[session_id] += 1
        try:
            yield True
        finally:
            self._upgrading[session_id] -= 1
            if not self._upgrading[session_id]:
                del self._upgrading[session_id]


class _Counted(asyncio.Protocol):
    """An aiohttp connection, counted as pending from accept to authentication or close."""

    __slots__ = ("_guard", "_inner")

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self._inner = inner
        self._guard = guard

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._guard.admit(self._inner):
            # The inner protocol never saw it: nothing of aiohttp to undo. A listening socket gives
            # its protocols stream transports, which have abort() (a cast, not isinstance: uvloop's
            # do not derive from asyncio.Transport).
            cast(asyncio.Transport, transport).abort()
            self._inner = None  # type: ignore[assignment]
            return
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is not None:
            self._guard.lost(self._inner)
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


class GatewayRunner(JsonErrorRunner):
    """aiohttp's ``AppRunner`` whose sites count connections with ``guard`` (``_Counted``) and
    answer the HTTP layer's refusals in JSON (``JsonErrorRunner``)."""

    def __init__(self, app: web.Application, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._guard = guard

    @property
    def server(self) -> Callable[[], asyncio.Protocol] | None:  # type: ignore[override]
        # What a site hands to loop.create_server as its protocol factory; the runner's own
        # shutdown uses the aiohttp server itself (self._server).
        server = super().server
        if server is None:
            return None
        guard = self._guard
        return lambda: _Counted(server(), guard)
