"""The WebSocket of a session: ``GET /v1/session/{id}/ws`` (docs/http-api.md, DPS).

The upgrade is checked whole before it is accepted (Origin, the session and the caller's role on
it, the subprotocol, the local-UI role, the reattach point, the connection bound); then the
session takes the connection (``LiveSession.attach``, gateway/session/) and this handler reads
what the master sends until either side closes. Writes to the master are the session's
(gateway/session/fanout.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

from aiohttp import WSMsgType, web

from gateway.api_error import ApiError
from gateway.console.origin import OriginForbidden, check_origin
from gateway.server.keys import (
    CONFIG,
    GUARD,
    HEARTBEAT,
    MAX_MESSAGE_ID_CHARS,
    STREAMING,
    SUBPROTOCOL,
    TICKET,
    TICKETS,
)
from gateway.server.middleware import _caller, is_loopback
from gateway.server.routes.sessions import _check_taking, _live, _session
from gateway.session.fanout import CLOSE_TIMEOUT_SEC
from gateway.team import roles


async def websocket(request: web.Request) -> web.StreamResponse:
    config = request.app[CONFIG]
    try:
        check_origin(request, config.allowed_origins)
    except OriginForbidden as exc:
        raise ApiError(
            403,
            "ORIGIN_FORBIDDEN",
            f"WebSocket upgrades from origin {exc} are not allowed (see [server] allowed_origins)",
        ) from None
    session = _session(request)
    _check_taking(request.app, new_session=False)
    offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
    if SUBPROTOCOL not in offered:
        raise ApiError(
            400,
            "SUBPROTOCOL_REQUIRED",
            f"offer the WebSocket subprotocol {SUBPROTOCOL} (RAWP-1.0-Legacy is not supported)",
        )
    session = _live(session)
    role = "local_ui" if request.query.get("role") == "local-ui" else "master"
    if role == "local_ui" and not is_loopback(request.remote):
        # A local UI runs on the gateway's own machine: the role (the only way into a local
        # session, whose frames must never reach a master) is not for a client elsewhere, token
        # or not (docs/protocol-notes.md).
        raise ApiError(
            403, "LOCAL_UI_FORBIDDEN", "?role=local-ui is accepted from a loopback address only"
        )
    if session.origin == "local" and role != "local_ui":
        # DPS-2.4-local: a local session's frames go to local UI connections only.
        raise ApiError(403, "LOCAL_SESSION", "a local session accepts only ?role=local-ui")
    last_message_id = request.query.get("last_message_id") or request.headers.get(
        "X-RAWP-Last-Message-Id"
    )
    if last_message_id is not None and (
        len(last_message_id) > MAX_MESSAGE_ID_CHARS or not last_message_id.isascii()
    ):
        # It can come back in session.history, which must fit max_frame_size (and be UTF-8: a
        # header's bytes that are not arrive as surrogates). The gateway's ids are UUIDs.
        raise ApiError(
            400,
            "INVALID_REQUEST",
            f"last_message_id must be at most {MAX_MESSAGE_ID_CHARS} ASCII characters",
        )
    # ?history=all: a master with nothing yet (a new tab) gets everything the buffer holds.
    history = request.query.get("history")
    if history is not None and history != "all":
        raise ApiError(400, "INVALID_REQUEST", "history must be 'all' (or left out)")
    if history is not None and last_message_id is not None:
        raise ApiError(
            400,
            "INVALID_REQUEST",
            "give last_message_id (a reattach) or history=all (a first attach), not both",
        )
    # No permessage-deflate: the session frames each message once and writes the same bytes to
    # every connection (gateway/session/fanout.py), which a per-connection compressor would undo.
    ws = web.WebSocketResponse(
        protocols=(SUBPROTOCOL,),
        max_msg_size=config.max_frame_size,
        heartbeat=request.app[HEARTBEAT],
        compress=False,
    )
    limit = config.max_connections_per_session
    with request.app[GUARD].upgrade(session.id, len(session.connections), limit) as place:
        if not place:
            raise ApiError(
                503,
                "TOO_MANY_CONNECTIONS",
                f"a session takes at most {limit} WebSockets (max_connections_per_session)",
            )
        if not ws.can_prepare(request).ok:
            raise ApiError(400, "BAD_REQUEST", "not a WebSocket upgrade request")
        ticket = request.get(TICKET)
        if ticket is not None and not request.app[TICKETS].spend(ticket):
            # Another upgrade with the same ticket succeeded since it was checked.
            raise ApiError(401, "UNAUTHORIZED", "the WebSocket ticket was used already")
        await ws.prepare(request)
        request[STREAMING] = ws
        conn_id = str(uuid.uuid4())
        transport = request.transport
        if transport is None:  # the peer left during the handshake
            return ws
        conn = session.attach(
            conn_id,
            ws,
            role=role,
            last_message_id=last_message_id,
            full_history=history is not None,
            transport=transport,
            drain=request.writer.drain,
            abort=transport.abort,
            sender=roles.Sender(_caller(request), request.remote),
        )
    close_ready = asyncio.ensure_future(conn.close_ready.wait())
    try:
        while True:
            receiving = asyncio.ensure_future(ws.receive())
            await asyncio.wait((receiving, close_ready), return_when=asyncio.FIRST_COMPLETED)
            if not receiving.done():
                # The session closes this connection; this task owns the socket's reading, so it
                # does the close handshake (and waits for the master's close frame).
                receiving.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await receiving
                code, reason = conn.close_args
                await _close(ws, code, reason, transport)
                break
            msg = receiving.result()
            if msg.type == WSMsgType.TEXT:
                session.receive(conn_id, msg.data)
            elif msg.type == WSMsgType.BINARY:
                session.receive(conn_id, b"\x00binary")  # answered as INVALID_FRAME
            else:  # CLOSE, CLOSING, CLOSED, ERROR
                break
    finally:
        close_ready.cancel()
        session.detach(conn_id)
        if not conn.closed.is_set():
            await conn.aclose()
    return ws


async def _close(
    ws: web.WebSocketResponse, code: int, reason: bytes, transport: asyncio.Transport
) -> None:
    """The close handshake, for at most ``CLOSE_TIMEOUT_SEC``: aiohttp would wait 10 s for the
    master's close frame, and without limit for a full socket to take ours. A master that reads
    nothing loses its socket instead (it reattaches with its last message id)."""
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT_SEC):
            await ws.close(code=code, message=reason)
    except TimeoutError:
        transport.abort()
