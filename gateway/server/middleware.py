"""What every request passes through before its handler (docs/http-api.md, Conventions).

``errors_middleware`` makes every error the API's ``{"error_code", "message"}`` JSON (never a stack
trace; once a WebSocket is open, a close with 1011 instead). ``browser_guard_middleware`` keeps web
pages in the user's browser from driving a gateway they can reach. ``auth_middleware`` makes the
``Authorization: Bearer`` credential, or a WebSocket upgrade's one-time ticket
(``gateway/console/tickets.py``), an identity on the request (``gateway/team/auth.py``), or refuses
the request. ``require`` and ``forbidden`` check the caller's own role and audit a refusal, for
the handlers.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import WSCloseCode, web

from gateway.api_error import ApiError
from gateway.config import Config
from gateway.console.origin import OriginForbidden, check_origin
from gateway.server.keys import AUDIT, AUTH, CONFIG, GUARD, IDENTITY, STREAMING, TICKET, TICKETS
from gateway.team import auth, fleet, roles

log = logging.getLogger("rawp_gateway.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# /acp's handler, what its tickets are issued for, and who holds the connection a ticket opened
AcpRoute = tuple[Handler, str, Callable[[web.Request, str], "roles.Identity | None"]]


def _error_for(exc: web.HTTPException) -> web.Response:
    codes = {
        400: "BAD_REQUEST",
        401: "UNAUTHORIZED",
        404: "NOT_FOUND",
        405: "METHOD_NOT_ALLOWED",
        413: "REQUEST_TOO_LARGE",
    }
    code = codes.get(exc.status, "HTTP_ERROR")
    message = exc.reason or exc.text or "error"
    if exc.status == 413:
        message = "request body too large"
    return web.json_response({"error_code": code, "message": message}, status=exc.status)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Exception as exc:
        streaming = request.get(STREAMING)
        if streaming is None:
            return _error_response(request, exc)
        # The HTTP response was sent already (an upgraded WebSocket): a JSON error written now
        # would land inside the stream and corrupt it. End the stream its own way instead.
        log.error("error after the response began", exc_info=exc, extra={"path": request.path})
        if isinstance(streaming, web.WebSocketResponse) and not streaming.closed:
            await streaming.close(code=WSCloseCode.INTERNAL_ERROR, message=b"internal error")
        return streaming


def _error_response(request: web.Request, exc: Exception) -> web.StreamResponse:
    if isinstance(exc, ApiError):
        return exc.response()
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        return _error_for(exc)
    log.error("unhandled error", exc_info=exc, extra={"path": request.path})
    return web.json_response(
        {"error_code": "INTERNAL_ERROR", "message": "internal error; see the gateway log"},
        status=500,
    )


def _public(path: str) -> bool:
    """Served without the token: liveness, readiness and the console's page (it holds no data)."""
    return path in ("/healthz", "/readyz", "/", "/ui") or path.startswith("/ui/")


def _ticket_identity(
    request: web.Request, upgrade: Handler, acp: AcpRoute | None = None
) -> roles.Identity | None:
    """Whoever asked for the valid one-time ticket on this upgrade of the session it was issued
    for (browser console), or on an ``/acp`` upgrade for a ticket issued for ``/acp``; the upgrade
    spends it once it succeeds (``upgrade``)."""
    ticket = request.query.get("ticket")
    if not ticket:
        return None
    handler = request.match_info.handler  # also under route_prefix
    if acp is not None and handler is acp[0]:
        session_id = acp[1]
    elif handler is upgrade:
        session_id = request.match_info["session_id"]
    else:
        return None
    identity = request.app[TICKETS].valid(ticket, session_id, time.monotonic())
    if identity is not None:
        request[TICKET] = ticket
    elif acp is not None and handler is acp[0]:
        # A Streamable HTTP client sends its URL, spent ticket and all, with every request of
        # the connection that ticket opened: the ticket and that connection's id name its user.
        identity = acp[2](request, ticket)
    return identity


def auth_middleware(upgrade: Handler, acp: AcpRoute | None = None):
    """Every request but the public ones gets its ``IDENTITY`` (gateway/team/roles.py), or is refused:
    401 ``UNAUTHORIZED`` for no or a wrong credential, 403 ``FORBIDDEN`` for a user with no role.
    ``upgrade`` is the WebSocket handler, the one route a ticket opens (with ``acp``: the ``/acp``
    handler, what its tickets are issued for, and who holds the connection a spent ticket opened):
    they are handed in because they use this
    module's helpers, so this module cannot import them."""

    @web.middleware
    async def middleware(request: web.Request, handler):
        if _public(fleet.strip_prefix(request.path, request.app[CONFIG].server.route_prefix)):
            return await handler(request)
        authenticator = request.app[AUTH]
        credential = _bearer(request)
        found: roles.Identity | auth.AuthFailure
        if not credential and "ticket" in request.query:
            found = _ticket_identity(request, upgrade, acp) or auth.AuthFailure(
                "unknown or spent ticket"
            )
        else:
            found = await authenticator.authenticate(credential)
        if isinstance(found, auth.AuthFailure):
            audit(request, "auth.failed", None, result="refused", detail={"reason": found.reason})
            return ApiError(401, "UNAUTHORIZED", "missing or invalid credentials").response()
        if found.role is None:
            audit(request, "auth.failed", None, found, "refused", {"reason": "no known role"})
            return ApiError(
                403, "FORBIDDEN", f"user {found.user} has no role on this gateway"
            ).response()
        request[IDENTITY] = found
        request.app[GUARD].authenticated(request.protocol)
        return await handler(request)

    return middleware


def audit(
    request: web.Request,
    action: str,
    session_id: str | None,
    identity: roles.Identity | None = None,
    result: str = "ok",
    detail: dict[str, Any] | None = None,
) -> None:
    request.app[AUDIT].record(
        action,
        identity or request.get(IDENTITY),
        peer=request.remote,
        session_id=session_id,
        result=result,
        detail=detail,
    )


def caller(request: web.Request) -> roles.Identity:
    return request.get(IDENTITY) or roles.LOCAL


def require(request: web.Request, role: str, action: str, session_id: str | None = None) -> None:
    """403 ``FORBIDDEN`` (audited) unless the caller's own role is at least ``role``."""
    identity = caller(request)
    if not roles.at_least(identity.role, role):
        forbidden(request, action, session_id, role, identity.role)


def forbidden(
    request: web.Request, action: str, session_id: str | None, needed: str, has: str | None
) -> None:
    audit(request, action, session_id, result="refused", detail={"needs": needed, "has": has})
    raise ApiError(403, "FORBIDDEN", f"this needs role {needed}; {caller(request).user} has {has}")


def browser_guard_middleware(config: Config):
    """What a web page in the user's browser must not do to a gateway it can reach. Browsers send
    simple cross-site POSTs without asking first, and a DNS-rebound page on a loopback gateway
    looks same-origin; neither carries the token, and a made token guards loopback alone:

    * a request that changes something (any method but GET and HEAD) from a page of another origin
      is refused (403 ``ORIGIN_FORBIDDEN``) unless ``[server] allowed_origins`` lists it, as
      WebSocket upgrades are; requests without ``Origin`` (non-browser masters) are unaffected;
    * with no token configured (a made one), the gateway answers only requests addressed to a
      loopback host (``Host``
      127.0.0.0/8, ``localhost`` or ``[::1]``): anything else is 403 ``HOST_FORBIDDEN``.
    """
    allowed = config.server.allowed_origins
    tokenless = config.loopback_only

    @web.middleware
    async def middleware(request: web.Request, handler):
        if tokenless and not _loopback_host(request.host):
            return ApiError(
                403,
                "HOST_FORBIDDEN",
                "without a token this gateway answers only requests to 127.0.0.1, localhost or "
                "[::1]",
            ).response()
        if request.method not in ("GET", "HEAD"):
            try:
                check_origin(request, allowed)
            except OriginForbidden as exc:
                return ApiError(
                    403,
                    "ORIGIN_FORBIDDEN",
                    f"requests from origin {exc} are not allowed (see [server] allowed_origins)",
                ).response()
        return await handler(request)

    return middleware


def _loopback_host(host: str) -> bool:
    """Whether a ``Host`` header names this machine's loopback (with or without a port)."""
    name = host.rpartition("]")[0].lstrip("[") if host.startswith("[") else host.partition(":")[0]
    name = name.lower().rstrip(".")
    return name == "localhost" or name.endswith(".localhost") or is_loopback(name)


def _bearer(request: web.Request) -> bytes:
    """The credentials of ``Authorization: Bearer <token>``; the scheme is case-insensitive (RFC
    7235). Header bytes that are not UTF-8 reach us as surrogate escapes: they are given back as
    the bytes they were (never an error), so they simply do not match."""
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return b""
    return credentials.strip(" ").encode("utf-8", "surrogateescape")


def is_loopback(address: str | None) -> bool:
    """The peer is this machine: 127.0.0.0/8, ::1, or 127.x mapped into IPv6."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback
