"""``/acp`` over Streamable HTTP: the other transport of ACP's remote-transport RFD, beside the
WebSocket (acp.py), for clients such as the official TypeScript SDK's ``createHttpStream``
(docs/acp-masters.md#streamable-http).

* ``POST /acp`` with ``initialize`` and no ``Acp-Connection-Id`` opens a connection: the answer is
  the JSON-RPC response itself, with the connection's ``Acp-Connection-Id`` header.
* Every later ``POST`` carries that header and one JSON-RPC message (a request, a notification or
  the client's answer to a request of ours), and is answered ``202`` with no body once the message
  was handled; what it makes (its answer, the sessions' ``session/update``\\ s, permission
  questions) goes out on the connection's ``GET /acp`` stream of server-sent events.
* ``GET /acp`` with ``Accept: text/event-stream`` and the header is that stream (one receiver at a
  time); with ``Acp-Session-Id`` too it is a session's stream, which the SDK opens before it sends
  a session's requests: while it is open, that session's messages go on it (acp_streams.py says
  which are), the others on the connection's, all written one at a time in the one order the
  WebSocket has too.
* ``DELETE /acp`` with the header closes the connection.

The messages are handled by the WebSocket's own ``AcpHandler`` (acp.py), one at a time in the
order they came, with the same roles, limits, audit and replay; only the writer differs
(``SseWriter``): what it has not written yet is bounded by ``send_queue_bytes`` as the
WebSocket's is. A connection counts toward ``MAX_ACP_CONNECTIONS`` with the WebSockets, and one
with no connection stream for ``IDLE_SEC`` is closed: an ``initialize`` alone never holds
anything for long. A credential of a later request must be the same user's as ``initialize``'s
(or the same one-time ticket: it opened this connection), else the connection is unknown (404).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections import deque
from typing import Final

from aiohttp import WSCloseCode, web

from gateway.api_error import ApiError
from gateway.protocol import acp_rpc
from gateway.protocol.acp_streams import SessionRoutes
from gateway.server.acp import (
    ACP_OPEN,
    MAX_ACP_CONNECTIONS,
    AcpHandler,
    acp_websocket,
    opening,
)
from gateway.server.keys import CONFIG, TICKET, TICKETS
from gateway.server.middleware import caller
from gateway.session.acp_client import MAX_ATTACHED, AcpClient
from gateway.team import roles

__all__ = ["SseWriter", "acp_endpoint", "close_http_connections", "ticket_holder"]

log = logging.getLogger("rawp_gateway.acp")

CONNECTION_HEADER: Final = "Acp-Connection-Id"
SESSION_HEADER: Final = "Acp-Session-Id"
IDLE_SEC: Final = 60.0  # an HTTP connection with no connection stream is closed after this
KEEPALIVE_SEC: Final = 15.0  # a comment on every idle stream, so proxies keep it open
MAX_SESSION_HEADER: Final = 256  # the length of an Acp-Session-Id (session ids are UUIDs)
POD_COOKIE: Final = "rawp_acp_pod"  # the gateway a connection lives on, for the fleet's router
_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # as the router takes one


class HttpConnection:
    """One Streamable HTTP ``/acp`` connection: its client, handler, writer and streams."""

    def __init__(
        self,
        app: web.Application,
        writer: SseWriter,
        handler: AcpHandler,
        ticket: str | None,
    ):
        self.app = app
        self.client = handler.client
        self.handler = handler
        self.writer = writer  # the client's writer
        self.ticket = ticket  # the one-time ticket that opened it, if one did
        self.lock = asyncio.Lock()  # one message at a time, in the order they came
        self.streaming = False  # a connection stream is open
        self.session_streams: set[str] = set()
        self.ended = asyncio.Event()
        self._idle: asyncio.TimerHandle | None = None
        self._ending: asyncio.Task[None] | None = None
        self.idle()

    def idle(self) -> None:
        """No connection stream: closed unless one opens within ``IDLE_SEC``."""
        self._idle = asyncio.get_running_loop().call_later(IDLE_SEC, self._expire)

    def busy(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _expire(self) -> None:
        log.info("ACP HTTP connection closed: no event stream", extra={"conn_id": self.client.id})
        self._ending = asyncio.get_running_loop().create_task(self.end())

    async def end(self) -> None:
        """Close the connection: its sessions let it go, its streams end, its id is forgotten."""
        if self.ended.is_set():
            return
        self.ended.set()
        self.busy()
        self.app[ACP_HTTP].pop(self.client.id, None)
        self.app[ACP_OPEN].discard(self.client)
        if self.handler.peers is not None:
            await self.handler.peers.close()
        self.client.close()
        self.writer.close_after_flush(WSCloseCode.GOING_AWAY, "the connection was closed")


ACP_HTTP: Final = web.AppKey("acp_http", dict)  # Acp-Connection-Id -> its HttpConnection


class SseWriter:
    """The ``AcpWriter`` of a Streamable HTTP connection: messages wait here, in order, until
    the connection stream (``pump``) writes them as server-sent events, each on its session's
    stream when one is open, else on the connection's (``SessionRoutes`` says which)."""

    def __init__(self, conn_id: str, max_queue_bytes: int) -> None:
        self.id = conn_id
        self.max_queue_bytes = max_queue_bytes
        self.queued_bytes = 0
        self.routes = SessionRoutes()
        # The open session streams: a session's messages go there while it is open.
        self.session_streams: dict[str, web.StreamResponse] = {}
        self._queue: deque[tuple[bytes, str | None]] = deque()
        self._wake = asyncio.Event()
        self.closing: tuple[int, str] | None = None
        self.overflowed = False
        # Set once it writes no more: its closing was written by a stream, or no stream was open
        # to write it (nobody is there to read it, and a stopping gateway must not wait for one).
        self.closed = asyncio.Event()
        self._pumping = False

    def offer(self, data: bytes, t_ns: int = 0) -> None:
        if self.closing is not None:
            return
        size = len(data)
        if self.queued_bytes and self.queued_bytes + size > self.max_queue_bytes:
            # A client that reads nothing holds nothing: it loads its sessions again after the
            # last messageId it saw, as after a WebSocket's overflow.
            self.overflowed = True
            self._queue.clear()
            self.queued_bytes = 0
            self.close_after_flush(1013, "send queue overflow; load the sessions again")
            return
        self._queue.append((data, self.routes.route(data)))
        self.queued_bytes += size
        self._wake.set()

    def take_first(self) -> bytes | None:
        """The first message waiting (``initialize``'s answer goes in the POST's response)."""
        if not self._queue:
            return None
        data, _ = self._queue.popleft()
        self.queued_bytes -= len(data)
        return data

    def close_after_flush(self, code: int = WSCloseCode.OK, reason: str = "") -> None:
        if self.closing is None:
            self.closing = (code, reason)
        self._wake.set()
        if not self._pumping:
            self.closed.set()

    def abort(self) -> None:
        self._queue.clear()
        self.queued_bytes = 0
        if self.closing is None:
            self.closing = (WSCloseCode.GOING_AWAY, "")
        self._wake.set()
        self.closed.set()

    async def pump(self, response: web.StreamResponse) -> bool:
        """Write what comes, ``response`` being the connection's stream, until the connection
        closes (True, all written) or that stream breaks (an error; what was not written stays
        queued). One message at a time in the one order, whichever stream it goes on."""
        self._pumping = True
        try:
            while True:
                while self._queue:
                    await self._write_next(response)
                if self.closing is not None:
                    return True
                self._wake.clear()
                try:
                    async with asyncio.timeout(KEEPALIVE_SEC):
                        await self._wake.wait()
                except TimeoutError:
                    await response.write(b":\n\n")
        finally:
            self._pumping = False
            if self.closing is not None:
                self.closed.set()

    async def _write_next(self, response: web.StreamResponse) -> None:
        """The next messages that go on one stream, written together."""
        route = self._queue[0][1]
        stream = self.session_streams.get(route) if route is not None else None
        batch = []
        for data, to in self._queue:
            if (self.session_streams.get(to) if to is not None else None) is not stream:
                break
            batch.append(data)
        try:
            await (stream or response).write(b"".join(map(_event, batch)))
        except (ConnectionError, RuntimeError):
            if stream is None:
                raise
            # The client left that session's stream: what it did not take goes on the
            # connection's, from this batch on.
            self.session_streams.pop(route or "", None)
            return
        for _ in batch:
            if not self._queue:
                break  # aborted while the batch was being written
            self.queued_bytes -= len(self._queue.popleft()[0])


def _event(data: bytes) -> bytes:
    """One message as a server-sent event (a line break in it would end the data line)."""
    if b"\n" in data or b"\r" in data:
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").replace(b"\n", b"\ndata: ")
    return b"data: " + data + b"\n\n"


async def acp_endpoint(request: web.Request) -> web.StreamResponse:
    """``/acp``: a WebSocket upgrade (acp.py), or a request of the Streamable HTTP transport."""
    if request.method == "GET" and request.headers.get("Upgrade", "").lower() == "websocket":
        return await acp_websocket(request)
    if request.method == "POST":
        return await _post(request)
    conn = _connection(request)
    if request.method == "DELETE":
        await conn.end()
        return web.Response(status=202)
    return await _stream(request, conn)


def ticket_holder(request: web.Request, ticket: str) -> roles.Identity | None:
    """Who opened the connection the request names with this same one-time ticket (spent by its
    ``initialize``): the SDK sends the URL it was given, ticket and all, on every request."""
    conn = request.app[ACP_HTTP].get(request.headers.get(CONNECTION_HEADER, ""))
    if conn is None or conn.ticket is None or conn.ticket != ticket:
        return None
    return conn.handler.identity


def _connection(request: web.Request) -> HttpConnection:
    conn_id = request.headers.get(CONNECTION_HEADER)
    if not conn_id:
        why = f"no {CONNECTION_HEADER}: POST initialize first, then send the id it answers with"
        raise ApiError(400, "BAD_REQUEST", why)
    conn = request.app[ACP_HTTP].get(conn_id)
    if conn is None or conn.handler.identity.user != caller(request).user:
        # Another user's connection is as unknown as a made-up one.
        why = f"unknown {CONNECTION_HEADER} (closed, expired, or never opened): initialize again"
        raise ApiError(404, "CONNECTION_NOT_FOUND", why)
    return conn


async def _body(request: web.Request) -> str:
    limit = request.app[CONFIG].server.max_frame_size
    if request.content_type != "application/json":
        raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE", "POST /acp takes application/json")
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, "MESSAGE_TOO_LARGE", f"a message is at most {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():  # a chunked body says no length first
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "MESSAGE_TOO_LARGE", f"a message is at most {limit} bytes")
        chunks.append(chunk)
    try:
        return b"".join(chunks).decode()
    except UnicodeDecodeError:
        raise ApiError(400, "BAD_REQUEST", "the body is not UTF-8") from None


async def _post(request: web.Request) -> web.StreamResponse:
    if CONNECTION_HEADER not in request.headers:
        return await _initialize(request)
    conn = _connection(request)
    data = await _body(request)
    async with conn.lock:
        if conn.writer.closing is not None:
            await conn.end()
            raise ApiError(
                404, "CONNECTION_NOT_FOUND", "the connection was closed: initialize again"
            )
        conn.handler.request = request  # this request's peer and credentials, for audit and relays
        conn.writer.routes.expect(data)  # its answer goes on its session's stream
        await conn.handler.message(data)
    return web.Response(status=202)


async def _initialize(request: web.Request) -> web.StreamResponse:
    """A new connection, if its first message is an ``initialize`` that is answered."""
    app = request.app
    agent = opening(request)
    data = await _body(request)
    got = acp_rpc.read(data)
    if isinstance(got, acp_rpc.Refused):
        raise ApiError(400, "BAD_REQUEST", _refusal(got.response))
    if got.method != "initialize" or not got.is_request:
        why = f"the first POST of a connection is initialize; others carry {CONNECTION_HEADER}"
        raise ApiError(400, "BAD_REQUEST", why)
    open_clients = app[ACP_OPEN]
    if len(open_clients) >= MAX_ACP_CONNECTIONS:
        raise ApiError(
            503, "TOO_MANY_CONNECTIONS", f"at most {MAX_ACP_CONNECTIONS} /acp connections"
        )
    conn_id = str(uuid.uuid4())
    writer = SseWriter(conn_id, app[CONFIG].server.send_queue_bytes)
    client = AcpClient(conn_id, writer, roles.Sender(caller(request), request.remote))
    handler = AcpHandler(request, client, agent)
    await handler.message(data)
    answer = writer.take_first()
    if handler.init_params == b"" or answer is None:  # not an initialize, or refused
        raise ApiError(400, "BAD_REQUEST", _refusal(answer))
    ticket = request.get(TICKET)
    if ticket is not None and not app[TICKETS].spend(ticket):
        raise ApiError(401, "UNAUTHORIZED", "the ticket was used already")
    conn = HttpConnection(app, writer, handler, ticket)
    app[ACP_HTTP][conn_id] = conn
    open_clients.add(client)
    response = web.Response(
        body=answer,
        content_type="application/json",
        headers={CONNECTION_HEADER: conn_id},
    )
    server = app[CONFIG].server
    if server.route_prefix and _DNS_LABEL.fullmatch(server.pod_name):
        # The connection lives here: a router that has sent this initialize to any gateway of
        # the fleet sends the connection's later requests after this cookie (the RFD has clients
        # keep cookies for this), deploy/k8s/router/default.conf.template.
        response.set_cookie(POD_COOKIE, server.pod_name, path="/acp", httponly=True)
    return response


def _refusal(answer: bytes | None) -> str:
    if answer is None:
        return "the first POST of a connection is an initialize request (with an id)"
    return "initialize was refused: " + answer.decode(errors="replace")[:512]


async def _stream(request: web.Request, conn: HttpConnection) -> web.StreamResponse:
    """``GET /acp``: the connection's stream of server-sent events, or a session's."""
    if "text/event-stream" not in request.headers.get("Accept", ""):
        raise ApiError(
            406, "NOT_ACCEPTABLE", "GET /acp is an event stream: Accept text/event-stream"
        )
    session_id = request.headers.get(SESSION_HEADER)
    if session_id is not None:
        return await _session_stream(request, conn, session_id)
    if conn.streaming:
        raise ApiError(409, "STREAM_OPEN", "this connection's event stream is open already")
    response = _event_stream()
    conn.streaming = True
    conn.busy()
    try:
        await response.prepare(request)
        if await conn.writer.pump(response):
            await conn.end()
    except (ConnectionError, RuntimeError):
        pass  # the client left: what was not written waits for its next stream
    finally:
        conn.streaming = False
        if not conn.ended.is_set():
            conn.idle()
    return response


async def _session_stream(
    request: web.Request, conn: HttpConnection, session_id: str
) -> web.StreamResponse:
    """A session's stream: that session's messages go on it (the connection stream's ``pump``
    writes them) until the connection closes or the client leaves; a keep-alive comment every
    ``KEEPALIVE_SEC`` tells which."""
    if not session_id or len(session_id) > MAX_SESSION_HEADER:
        raise ApiError(
            400, "BAD_REQUEST", f"{SESSION_HEADER} is 1 to {MAX_SESSION_HEADER} characters"
        )
    if session_id in conn.session_streams:
        raise ApiError(409, "STREAM_OPEN", "this session's event stream is open already")
    if len(conn.session_streams) >= MAX_ATTACHED:
        why = f"one connection has at most {MAX_ATTACHED} session streams"
        raise ApiError(409, "TOO_MANY_SESSIONS", why)
    response = _event_stream()
    conn.session_streams.add(session_id)
    streams = conn.writer.session_streams
    try:
        await response.prepare(request)
        streams[session_id] = response
        while not conn.ended.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(KEEPALIVE_SEC):
                    await conn.ended.wait()
            if not conn.ended.is_set():
                await response.write(b":\n\n")
    except (ConnectionError, RuntimeError):
        pass
    finally:
        conn.session_streams.discard(session_id)
        if streams.get(session_id) is response:
            del streams[session_id]
    return response


def _event_stream() -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # nginx (the fleet's router) passes each event at once
        }
    )
    response.enable_chunked_encoding()
    return response


async def close_http_connections(app: web.Application) -> None:
    """A stopping gateway ends every Streamable HTTP connection: their streams end after what
    they were owed, and their ids are forgotten."""
    for conn in list(app[ACP_HTTP].values()):
        await conn.end()
