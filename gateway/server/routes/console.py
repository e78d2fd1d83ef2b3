"""The browser console's routes (docs/browser-console.md): ``/`` and ``/ui`` serve its page and
``/ui/{name}`` the files beside it (gateway/console/static.py), without the token;
``POST /v1/session/{id}/ws-ticket`` gives a page that holds the token a one-time ticket for a
WebSocket upgrade (gateway/console/tickets.py)."""

from __future__ import annotations

import time

from aiohttp import web

from gateway.api_error import ApiError
from gateway.console.static import static_response
from gateway.console.tickets import TICKET_TTL_SEC
from gateway.server.keys import STATIC, TICKETS
from gateway.server.middleware import caller
from gateway.server.routes.sessions import still_live, visible_session


def ticket_owner(request: web.Request) -> str:
    """Whose tickets a ``ws-ticket`` request counts against (``MAX_TICKETS_PER_OWNER``): the
    user it was authenticated as (gateway/team/auth.py), whichever credential they used."""
    return caller(request).user


async def ws_ticket(request: web.Request) -> web.Response:
    session = visible_session(request)
    session = still_live(session)
    ticket = request.app[TICKETS].issue(
        session.id, time.monotonic(), ticket_owner(request), caller(request)
    )
    if ticket is None:
        raise ApiError(429, "TOO_MANY_TICKETS", "too many unused WebSocket tickets; retry shortly")
    return web.json_response({"ticket": ticket, "expires_in": TICKET_TTL_SEC})


async def console_page(request: web.Request) -> web.Response:
    return static_response(request.app[STATIC]["index.html"])


async def console_file(request: web.Request) -> web.Response:
    file = request.app[STATIC].get(request.match_info["name"])
    if file is None:
        raise ApiError(404, "NOT_FOUND", "no such console file")
    return static_response(file)


async def console_redirect(request: web.Request) -> web.Response:
    raise web.HTTPFound(request.path.removesuffix("/") + "/ui")  # under route_prefix too
