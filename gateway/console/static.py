"""The static files of the browser console (docs/browser-console.md).

The console is a single page of plain JavaScript modules in ``gateway/console/ui/``, shipped as
package data and read once when the application is built; ``GET /ui`` serves ``index.html`` and
``GET /ui/{name}`` the files beside it (a fixed set: no path from a request reaches the file
system). The page holds no data, so it is served without the token, with a Content-Security-Policy
that allows nothing but the gateway itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Final

from aiohttp import web

__all__ = ["CSP", "MAX_STATIC_BYTES", "StaticFile", "load_static", "static_response"]

MAX_STATIC_BYTES: Final = 2 * 1024 * 1024  # the console's files, all together

# Everything the page loads or calls is the gateway itself; images from tool results are fetched
# with the token and shown as blob: URLs.
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}


@dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes
    content_type: str


def load_static() -> dict[str, StaticFile]:
    """The console's files by name (``index.html``, ``app.js``, ...), read from the package."""
    files: dict[str, StaticFile] = {}
    total = 0
    for entry in resources.files("gateway.console").joinpath("ui").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if not entry.is_file() or suffix not in _TYPES:
            continue
        body = entry.read_bytes()
        total += len(body)
        if total > MAX_STATIC_BYTES:
            raise RuntimeError("the console's static files exceed their size limit")
        files[entry.name] = StaticFile(body, _TYPES[suffix])
    if "index.html" not in files:
        raise RuntimeError(
            "the console's index.html is missing from the package (gateway/console/ui)"
        )
    return files


def static_response(file: StaticFile) -> web.Response:
    response = web.Response(body=file.body)
    response.headers["Content-Type"] = file.content_type
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Cache-Control"] = "no-cache"
    return response
