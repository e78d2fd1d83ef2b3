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

In the sandbox (``[isolation] mode = "sandbox"``, docs/isolation.md) an agent saves its
conversations in its session's own HOME, and nowhere else: the caller names the ``sandboxes`` of
their own sessions (of this agent and workspace, the newest ``MAX_HOMES``), and only those HOMEs
are read, each one as that session's agent would see it; another user's never is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from gateway.agent.conversations import ask_acp, on_disk
from gateway.agent.conversations.common import (
    DEFAULT_LIST_LIMIT,
    MAX_CONVERSATION_ID_CHARS,
    MAX_LIST_LIMIT,
    ConversationError,
    saved_format,
)
from gateway.agent.profiles import AgentProfile
from gateway.agent.sandbox import SpawnSandbox
from parsers.saved import Transcript

__all__ = [
    "DEFAULT_LIST_LIMIT",
    "MAX_CONVERSATION_ID_CHARS",
    "MAX_HOMES",
    "MAX_LIST_LIMIT",
    "ConversationError",
    "find_conversation",
    "list_conversations",
    "load_conversation",
]

DEFAULT_AGENT_TIMEOUT_SEC: Final = (
    60.0  # an ACP agent asked (``[server] conversations_timeout_sec``)
)
MAX_HOMES: Final = 8  # sandboxed sessions' HOMEs looked in for one listing or resume, newest first


async def list_conversations(
    profile: AgentProfile,
    workspace: str,
    limit: int = DEFAULT_LIST_LIMIT,
    *,
    timeout: float = DEFAULT_AGENT_TIMEOUT_SEC,
    grace: float = 5.0,
    sandboxes: Sequence[SpawnSandbox] | None = None,
) -> dict[str, Any]:
    """``{"conversations": [...], "complete": bool}``, newest first (docs/http-api.md).
    ``timeout``, ``grace``: for an ACP agent, asked in a process of its own. ``sandboxes``: in
    sandbox mode, the caller's own sessions' sandboxes, whose HOMEs alone are read."""
    if sandboxes is not None:
        return await _list_in_homes(profile, workspace, limit, sandboxes, timeout, grace)
    if ask_acp.asks_agent(profile):
        return await ask_acp.list_sessions(profile, workspace, limit, timeout=timeout, grace=grace)
    return await on_disk.list_saved(profile, workspace, limit)


def _check_id(conversation_id: Any) -> str:
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
    return conversation_id


async def _list_in_homes(
    profile: AgentProfile,
    workspace: str,
    limit: int,
    sandboxes: Sequence[SpawnSandbox],
    timeout: float,
    grace: float,
) -> dict[str, Any]:
    asks = ask_acp.asks_agent(profile)
    if not asks:
        saved_format(profile)  # 501 when the gateway cannot read this agent's store
    newest: dict[str, dict[str, Any]] = {}
    complete = len(sandboxes) <= MAX_HOMES
    for box in sandboxes[:MAX_HOMES]:
        if asks:
            got = await ask_acp.list_sessions(
                profile, workspace, limit, timeout=timeout, grace=grace, sandbox=box
            )
        else:
            got = await on_disk.list_saved(profile, workspace, limit, home=box.home)
        complete = complete and got["complete"]
        for item in got["conversations"]:
            known = newest.get(item["id"])
            if known is None or (item["updated_at"] or "") > (known["updated_at"] or ""):
                newest[item["id"]] = item
    ordered = sorted(newest.values(), key=lambda c: c["updated_at"] or "", reverse=True)
    return {"conversations": ordered[:limit], "complete": complete and len(ordered) <= limit}


async def find_conversation(
    profile: AgentProfile,
    workspace: str,
    conversation_id: Any,
    sandboxes: Sequence[SpawnSandbox],
    *,
    timeout: float = DEFAULT_AGENT_TIMEOUT_SEC,
    grace: float = 5.0,
) -> tuple[Transcript, SpawnSandbox]:
    """In sandbox mode: the conversation ``conversation_id`` of the workspace, looked for in the
    HOMEs of ``sandboxes`` (the caller's own sessions'), and the sandbox whose HOME holds it; 404
    ``CONVERSATION_NOT_FOUND`` when none does."""
    conversation_id = _check_id(conversation_id)
    for box in sandboxes[:MAX_HOMES]:
        try:
            if ask_acp.asks_agent(profile):
                transcript = await ask_acp.load_session(
                    profile, workspace, conversation_id, timeout=timeout, grace=grace, sandbox=box
                )
            else:
                transcript = await on_disk.load_saved(
                    profile, workspace, conversation_id, home=box.home
                )
        except ConversationError as err:
            if err.status == 404:
                continue
            raise
        return transcript, box
    if not ask_acp.asks_agent(profile):
        saved_format(profile)  # 501 rather than 404 for an agent whose store is not read
    raise ConversationError(
        404,
        "CONVERSATION_NOT_FOUND",
        f"none of your sessions of agent {profile.name!r} in this workspace saved a "
        f"conversation {conversation_id!r}",
    )


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
    conversation_id = _check_id(conversation_id)
    if ask_acp.asks_agent(profile):
        return await ask_acp.load_session(
            profile, workspace, conversation_id, timeout=timeout, grace=grace
        )
    return await on_disk.load_saved(profile, workspace, conversation_id)
