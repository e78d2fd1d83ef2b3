"""The HTTP layer's own refusals as the API's JSON errors (docs/http-api.md, "Conventions").

aiohttp answers a request it cannot parse (a malformed request line or header) before any route
or middleware sees it, from ``RequestHandler.handle_error``, with a ``text/plain`` body. The API
promises ``{"error_code", "message"}`` for every error, so ``JsonErrorRunner`` gives each
connection a request handler whose ``handle_error`` answers JSON: 400 ``BAD_REQUEST``, 500
``INTERNAL_ERROR``, any other status ``HTTP_ERROR``. Everything else (logging, closing the
connection, refusing once a response has begun) stays aiohttp's.

aiohttp has no public hook for this: the runner's ``server`` (the protocol factory its sites hand
to ``loop.create_server``) builds the handler as ``web.Server.__call__`` does, with the server's
own arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

CODES = {400: "BAD_REQUEST", 500: "INTERNAL_ERROR"}


class JsonErrorRequestHandler(RequestHandler):
    __slots__ = ()

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; raises if a response began
        reason = getattr(exc, "message", None) or message or ""
        # aiohttp's reason may quote the offending bytes on later lines: its first line only.
        reason = str(reason).split("\n", 1)[0].rstrip(": ") or HTTPStatus(status).phrase
        if status == 500:
            reason = "internal error; see the gateway log"
        resp = web.json_response(
            {"error_code": CODES.get(status, "HTTP_ERROR"), "message": reason}, status=status
        )
        resp.force_close()
        return resp


def json_error_protocols(server: web.Server) -> Callable[[], RequestHandler]:
    """A protocol factory like ``server`` itself, whose handlers answer errors in JSON."""
    return lambda: JsonErrorRequestHandler(server, loop=server._loop, **server._kwargs)


class JsonErrorRunner(web.AppRunner):
    """aiohttp's ``AppRunner`` whose sites answer the HTTP layer's refusals in JSON."""

    @property
    def server(self) -> Callable[[], RequestHandler] | None:  # type: ignore[override]
        # What a site hands to loop.create_server; the runner's own shutdown uses self._server.
        return None if self._server is None else json_error_protocols(self._server)
