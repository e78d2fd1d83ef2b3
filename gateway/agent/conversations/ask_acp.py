"""An ACP agent's saved sessions, asked of the agent itself: ``session/list`` and ``session/load``.

Theory of operation
-------------------
An ACP agent keeps its conversations where it likes; what it offers is ``session/list`` (when it
declares ``sessionCapabilities.list``) and ``session/load`` (``loadSession``), which replays a
session's conversation as ``session/update`` notifications before it answers. The questions are
``parsers.acp.StoreQuery`` (sans-IO); this module runs one per request on a short-lived agent
process of the profile (its command and env, the workspace as cwd), in its own process group:

* it is given ``timeout`` seconds in all (``[server] conversations_timeout_sec``), from the spawn to
  the answer; an agent that has not answered by then is a 504 ``CONVERSATIONS_TIMEOUT``;
* what it writes is bounded (``parsers.acp.store_query``: ``LIST_ANSWER_BYTES`` for a listing, a replay kept up
  to ``REPLAY_BYTES``, then marked partial; a line longer than ``MAX_LINE_BYTES`` is not read);
* a session's replay is what the agent sends from ``session/load`` until it falls silent for
  ``REPLAY_SETTLE_SEC`` after its answer (Gemini CLI replays after it answers);
* at most ``MAX_RUNNING`` are asked at once (503 ``CONVERSATIONS_BUSY`` beyond);
* it is ended (SIGTERM to its group, SIGKILL after ``[server] shutdown_grace_sec``) as soon as the
  answer is known, whatever it was.

A resumed session's own agent process then loads the session again (``parsers/acp/adapter.py``: the
adapter drops that second replay): the history comes from this first one, read before anything
is created, so an unknown id is a 404 and not a session that starts empty.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Final

from gateway.agent.conversations.common import ConversationError
from gateway.agent.exit import AgentProcessError, AgentStartError
from gateway.agent.process import AgentProcess
from gateway.agent.profiles import AgentProfile
from gateway.agent.sandbox import SpawnSandbox
from parsers.acp import StoreQuery
from parsers.saved import Transcript

__all__ = ["MAX_LINE_BYTES", "asks_agent", "list_sessions", "load_session"]


MAX_LINE_BYTES: Final = 16 << 20  # one line of the agent read, at most (a longer one is cut)
# Silence after the answer to session/load that ends its replay (Gemini CLI replays after it)
REPLAY_SETTLE_SEC: Final = 1.0
MAX_RUNNING: Final = 4  # agents asked at once, gateway-wide; one more is a 503
MAX_STDIN_BACKLOG: Final = 1 << 20  # answers to its requests that it has not read


def asks_agent(profile: AgentProfile) -> bool:
    """The profile's conversations are the agent's to list and load (an ACP agent)."""
    return profile.parser == "acp" and profile.conversations


async def list_sessions(
    profile: AgentProfile,
    workspace: str,
    limit: int,
    *,
    timeout: float,
    grace: float,
    sandbox: SpawnSandbox | None = None,
) -> dict[str, Any]:
    """``{"conversations": [...], "complete": bool}`` from the agent's ``session/list``
    (``sandbox``: asked in that session's sandbox, its HOME)."""
    query = await _ask(profile, StoreQuery(workspace, limit=limit), timeout, grace, sandbox)
    listed = [
        {"id": s.id, "title": s.title, "updated_at": s.updated_at, "turns": s.turns}
        for s in query.listed
    ]
    return {"conversations": listed, "complete": query.complete}


async def load_session(
    profile: AgentProfile,
    workspace: str,
    session_id: str,
    *,
    timeout: float,
    grace: float,
    sandbox: SpawnSandbox | None = None,
) -> Transcript:
    """The conversation of ``session_id`` as the agent replays it on ``session/load``."""
    query = await _ask(profile, StoreQuery(workspace, load=session_id), timeout, grace, sandbox)
    assert query.transcript is not None
    return query.transcript


_running = 0  # agents being asked now (one event loop per gateway)


async def _ask(
    profile: AgentProfile,
    query: StoreQuery,
    timeout: float,
    grace: float,
    sandbox: SpawnSandbox | None,
) -> StoreQuery:
    global _running
    if _running >= MAX_RUNNING:
        raise ConversationError(
            503,
            "CONVERSATIONS_BUSY",
            f"{MAX_RUNNING} agents are being asked for their sessions already; try again shortly",
        )
    _running += 1
    try:
        return await _asked(profile, query, timeout, grace, sandbox)
    finally:
        _running -= 1


async def _asked(
    profile: AgentProfile,
    query: StoreQuery,
    timeout: float,
    grace: float,
    sandbox: SpawnSandbox | None,
) -> StoreQuery:
    try:
        proc = await AgentProcess.start(
            profile.command,
            env=profile.env,
            session_id=f"conversations-{uuid.uuid4()}",
            workspace=query.workspace,
            max_line_bytes=MAX_LINE_BYTES,
            grace=grace,
            sandbox=sandbox,
        )
    except (AgentStartError, OSError, ValueError) as err:
        raise ConversationError(
            502, "AGENT_START_FAILED", f"the {profile.name} agent could not start: {err}"
        ) from None
    try:
        async with asyncio.timeout(timeout):
            await _converse(proc, query)
    except TimeoutError:
        raise ConversationError(
            504,
            "CONVERSATIONS_TIMEOUT",
            f"the {profile.name} agent did not answer {query.method} within {timeout:g} s "
            "(conversations_timeout_sec)",
        ) from None
    finally:
        await proc.terminate(grace)
    if not query.done:
        status = proc.exit_status
        raise ConversationError(
            502,
            "CONVERSATIONS_AGENT_ERROR",
            f"the {profile.name} agent ended before it answered {query.method}"
            + (f" ({status.describe()})" if status is not None else ""),
        )
    if query.failure is not None:
        kind, message = query.failure
        if kind == "unsupported":
            raise ConversationError(
                501,
                "CONVERSATIONS_NOT_SUPPORTED",
                f"agent {profile.name!r} cannot {query.method[8:]} its sessions: {message}",
            )
        if kind == "not_found":
            raise ConversationError(
                404,
                "CONVERSATION_NOT_FOUND",
                f"agent {profile.name!r} has no session {query.load_id!r}: {message}",
            )
        raise ConversationError(502, "CONVERSATIONS_AGENT_ERROR", message)
    return query


async def _converse(proc: AgentProcess, query: StoreQuery) -> None:
    try:
        proc.write(query.opening())
        while not query.done:
            if query.settling:  # a replay may follow the answer: until the agent is silent
                try:
                    item = await asyncio.wait_for(proc.readline(), REPLAY_SETTLE_SEC)
                except TimeoutError:
                    item = None
            else:
                item = await proc.readline()
            if item is None:
                query.finish()
                return
            data = query.cut(item.cut) if item.cut else query.feed(item.line)
            if data:
                proc.write(data, limit=MAX_STDIN_BACKLOG)
    except AgentProcessError:
        return  # its stdin is gone (it ended), or it reads nothing of what it is asked
