"""The API's error: a request refused with a status, an ``error_code`` and a message, answered as
docs/http-api.md's JSON error object (``{"error_code", "message"}``).

The server raises it, and so do the modules behind its routes (``files.FileError``,
``conversations.ConversationError`` are kinds of it), so that a refusal reaches the client as
raised, without each route translating it.
"""

from __future__ import annotations

from aiohttp import web

__all__ = ["ApiError"]


class ApiError(Exception):
    """An error answered as docs/http-api.md's JSON error object."""

    def __init__(self, status: int, error_code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message

    def response(self) -> web.Response:
        body = {"error_code": self.error_code, "message": self.message}
        return web.json_response(body, status=self.status)
