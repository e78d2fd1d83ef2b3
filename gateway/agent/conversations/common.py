"""What the conversations' rooms share: ``ConversationError``, the agent's store's format, and the
bounds a request names (docs/http-api.md, docs/limits.md)."""

from __future__ import annotations

from typing import Final

from gateway.agent.profiles import AgentProfile
from gateway.api_error import ApiError
from parsers.base import get as get_parser
from parsers.saved import SavedFormat

__all__ = [
    "DEFAULT_LIST_LIMIT",
    "MAX_CONVERSATION_ID_CHARS",
    "MAX_LIST_LIMIT",
    "ConversationError",
    "saved_format",
]

DEFAULT_LIST_LIMIT: Final = 50
MAX_LIST_LIMIT: Final = 500
MAX_CONVERSATION_ID_CHARS: Final = 256


class ConversationError(ApiError):
    """A listing or a resume refused, as docs/http-api.md's error (status, error code, message)."""


def saved_format(profile: AgentProfile) -> SavedFormat:
    """The profile's conversation store, or 501 ``CONVERSATIONS_NOT_SUPPORTED``."""
    make = get_parser(profile.parser).saved if profile.conversations else None
    if make is None:
        raise ConversationError(
            501,
            "CONVERSATIONS_NOT_SUPPORTED",
            f"the gateway cannot read the saved conversations of agent {profile.name!r}",
        )
    return make()
