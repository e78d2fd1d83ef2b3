"""Readable ``agent.error`` codes for model API failures, shared by the agents' parsers.

An HTTP status is turned into one code per kind of failure, so a master can tell "fix the key"
(``API_UNAUTHORIZED``) from "wait and retry" (``API_RATE_LIMITED``) without parsing messages, the
same way whichever agent met the error.
"""

from __future__ import annotations

from typing import Final

__all__ = ["HTTP_ERROR_CODES", "http_error_code"]

HTTP_ERROR_CODES: Final[dict[int, str]] = {
    400: "API_BAD_REQUEST",
    401: "API_UNAUTHORIZED",
    403: "API_FORBIDDEN",
    404: "API_NOT_FOUND",
    408: "API_TIMEOUT",
    409: "API_CONFLICT",
    413: "API_REQUEST_TOO_LARGE",
    429: "API_RATE_LIMITED",
    500: "API_SERVER_ERROR",
    501: "API_SERVER_ERROR",
    502: "API_UNAVAILABLE",
    503: "API_UNAVAILABLE",
    504: "API_TIMEOUT",
    529: "API_OVERLOADED",
}


def http_error_code(status: int | None) -> str:
    """The code for an HTTP status of the model API (``API_ERROR`` when unknown or None)."""
    if status is None:
        return "API_ERROR"
    code = HTTP_ERROR_CODES.get(status)
    if code is not None:
        return code
    if 500 <= status < 600:
        return "API_SERVER_ERROR"
    return "API_ERROR"
