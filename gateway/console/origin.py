"""The Origin check of the browser console (docs/browser-console.md).

Any web page can open a WebSocket to a loopback gateway, so an upgrade whose ``Origin`` header
names another origin than the gateway's own is refused (403 ``ORIGIN_FORBIDDEN``) unless
``[server] allowed_origins`` lists it; the server applies the same rule to every request that
changes something. Non-browser masters send no ``Origin`` and are unaffected.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web

from gateway.config import normalize_origin

__all__ = ["OriginForbidden", "check_origin"]


class OriginForbidden(Exception):
    """An upgrade from a page of another origin."""


def check_origin(request: web.Request, allowed: Iterable[str]) -> None:
    """Raise ``OriginForbidden`` if the request carries an ``Origin`` that is neither the
    gateway's own (same scheme and ``Host``) nor one of ``allowed`` (normalised)."""
    origin = request.headers.get("Origin")
    if origin is None:
        return
    given = normalize_origin(origin)
    own = normalize_origin(f"{request.scheme}://{request.host}")
    if given == own or given in allowed:
        return
    raise OriginForbidden(given)
