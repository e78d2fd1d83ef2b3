"""The agents' own saved conversations: listed for a workspace, loaded to resume.

Theory of operation
-------------------
What an agent's store looks like is its parser's business (``ParserSpec.saved``, a
``parsers.saved.SavedFormat``): a store of files is read by on_disk.py, bounded and without
following links. ACP agents are not file stores: the agent itself is asked (``session/list``,
``session/load``: ask_acp.py), for the same listing and ``Transcript``. This module checks the
request and sends it to the one that answers for the profile.

A profile whose parser has no store, or that says ``conversations = false``, answers 501
``CONVERSATIONS_NOT_SUPPORTED``.
"""

from __future__ import annotations

from typing import Any, Final

from gateway.agent.conversations import ask_acp, on_disk
from gateway.agent.conversations.common import (
    DEFAULT_LIST_LIMIT,
    MAX_CONVERSATION_ID_CHARS,
    MAX_LIST_LIMIT,
    ConversationError,
)
from gateway.agent.profiles import AgentProfile
from parsers.saved import Transcript

__all__ = [
    "DEFAULT_LIST_LIMIT",
    "MAX_CONVERSATION_ID_CHARS",
    "MAX_LIST_LIMIT",
    "ConversationError",
    "list_conversations",
    "load_conversation",
]

DEFAULT_AGENT_TIMEOUT_SEC: Final = (
    60.0  # an ACP agent asked (``[server] conversations_timeout_sec``)
)


async def list_conversations(
    profile: AgentProfile,
    workspace: str,
    limit: int = DEFAULT_LIST_LIMIT,
    *,
    timeout: float = DEFAULT_AGENT_TIMEOUT_SEC,
    grace: float = 5.0,
) -> dict[str, Any]:
    """``{"conversations": [...], "complete": bool}``, newest first (docs/http-api.md).
    ``timeout``, ``grace``: for an ACP agent, asked in a process of its own."""
    if ask_acp.asks_agent(profile):
        return await ask_acp.list_sessions(profile, workspace, limit, timeout=timeout, grace=grace)
    return await on_disk.list_saved(profile, workspace, limit)


async def load_conversation(
    profile: AgentProfile,
    workspace: str,
    conversation_id: Any,
    *,
    timeout: float = DEFAULT_AGENT_TIMEOUT_SEC,
    grace: float = 5.0,
) -> Transcript:
    """The conversation ``conversation_id`` of the workspace, translated; 404
    ``CONVERSATION_NOT_FOUND`` when the agent saved none of that id for this workspace."""
    if (
        not isinstance(conversation_id, str)
        or not conversation_id
        or len(conversation_id) > MAX_CONVERSATION_ID_CHARS
        or not conversation_id.isprintable()
    ):
        raise ConversationError(
            400,
            "INVALID_REQUEST",
            f"resume_conversation must be a conversation id of at most "
            f"{MAX_CONVERSATION_ID_CHARS} printable characters",
        )
    if ask_acp.asks_agent(profile):
        return await ask_acp.load_session(
            profile, workspace, conversation_id, timeout=timeout, grace=grace
        )
    return await on_disk.load_saved(profile, workspace, conversation_id)
