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
from collections.abc import Awaitable, Callable

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
from gateway.server.middleware import caller, is_loopback
from gateway.server.routes.sessions import check_taking, still_live, visible_session
from gateway.session.fanout import CLOSE_TIMEOUT_SEC, WebSocketConnection
from gateway.team import roles


def check_upgrade_origin(request: web.Request) -> None:
    """403 ``ORIGIN_FORBIDDEN`` for an upgrade from a page of an origin not allowed (every
    WebSocket of the gateway: this one, ``/acp``)."""
    try:
        check_origin(request, request.app[CONFIG].server.allowed_origins)
    except OriginForbidden as exc:
        raise ApiError(
            403,
            "ORIGIN_FORBIDDEN",
            f"WebSocket upgrades from origin {exc} are not allowed (see [server] allowed_origins)",
        ) from None


async def websocket(request: web.Request) -> web.StreamResponse:
    config = request.app[CONFIG]
    check_upgrade_origin(request)
    session = visible_session(request)
    check_taking(request.app, new_session=False)
    offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
    if SUBPROTOCOL not in offered:
        raise ApiError(
            400,
            "SUBPROTOCOL_REQUIRED",
            f"offer the WebSocket subprotocol {SUBPROTOCOL} (RAWP-1.0-Legacy is not supported)",
        )
    session = still_live(session)
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
        max_msg_size=config.server.max_frame_size,
        heartbeat=request.app[HEARTBEAT],
        compress=False,
    )
    limit = config.server.max_connections_per_session
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
            sender=roles.Sender(caller(request), request.remote),
        )

    async def take(data: str | None) -> None:
        # A binary message is answered as INVALID_FRAME.
        session.receive(conn_id, data if data is not None else b"\x00binary")

    try:
        await read_socket(ws, conn, take)
    finally:
        session.detach(conn_id)
        if not conn.closed.is_set():
            await conn.aclose()
    return ws


async def read_socket(
    ws: web.WebSocketResponse,
    conn: WebSocketConnection,
    take: Callable[[str | None], Awaitable[None]],
) -> None:
    """Hand ``take`` each text message the peer sends (None for a binary one) until the peer
    closes or the connection's writer asks for the close (``close_ready``): this task owns the
    socket's reading, so it then does the close handshake (and waits for the peer's close frame)."""
    close_ready = asyncio.ensure_future(conn.close_ready.wait())
    try:
        while True:
            receiving = asyncio.ensure_future(ws.receive())
            await asyncio.wait((receiving, close_ready), return_when=asyncio.FIRST_COMPLETED)
            if not receiving.done():
                receiving.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await receiving
                code, reason = conn.close_args
                await _close(ws, code, reason, conn)
                break
            msg = receiving.result()
            if msg.type == WSMsgType.TEXT:
                await take(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await take(None)
            else:  # CLOSE, CLOSING, CLOSED, ERROR (a message over max_frame_size: 1009)
                break
    finally:
        close_ready.cancel()


async def _close(
    ws: web.WebSocketResponse, code: int, reason: bytes, conn: WebSocketConnection
) -> None:
    """The close handshake, for at most ``CLOSE_TIMEOUT_SEC``: aiohttp would wait 10 s for the
    peer's close frame, and without limit for a full socket to take ours. A peer that reads
    nothing loses its socket instead (a master reattaches with its last message id)."""
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT_SEC):
            await ws.close(code=code, message=reason)
    except TimeoutError:
        conn.abort()
