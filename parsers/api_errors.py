"""Readable ``agent.error`` codes for model API failures, shared by the agents' parsers.

An HTTP status is turned into one code per kind of failure, so a master can tell "fix the key"
(``API_UNAUTHORIZED``) from "wait and retry" (``API_RATE_LIMITED``) without parsing messages, the
same way whichever agent met the error.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "CREDENTIAL_CODES",
    "HTTP_ERROR_CODES",
    "about_credentials",
    "credentials_hint",
    "http_error_code",
]

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


# Codes that always mean missing or refused credentials (Gemini's exit 41 is AUTH_ERROR).
CREDENTIAL_CODES: Final = frozenset({"API_UNAUTHORIZED", "AUTH_ERROR"})
# The agents' own words for it: Claude Code's "Not logged in · Please run /login", Codex's
# "Missing environment variable: `OPENAI_API_KEY`", Gemini's "you must specify the GEMINI_API_KEY
# environment variable", an API's 401 "invalid x-api-key".
_CREDENTIAL_WORDS: Final = re.compile(
    r"not logged in|/login\b|\blog ?in\b|api[ _-]?key|unauthori[sz]ed|authenticat|credential"
    r"|auth method",
    re.IGNORECASE,
)


def about_credentials(code: str, *texts: str | None) -> bool:
    """Whether an error (its code, message, stderr) is about the agent's credentials."""
    return code in CREDENTIAL_CODES or any(
        text and _CREDENTIAL_WORDS.search(text) for text in texts
    )


def credentials_hint(where: str) -> str:
    """What a user can do about it: where the agent (``ParserSpec.credentials``) looks."""
    return (
        "this is about the agent's credentials: the gateway passes its environment, and the "
        f"profile's env, on to the agent, which reads {where}"
    )
