"""The agents resource: ``GET /v1/agents`` (the profiles this gateway runs) and
``GET /v1/agents/{agent}/conversations`` (an agent's saved conversations in a workspace,
gateway/agent/conversations/), docs/http-api.md."""

from __future__ import annotations

from aiohttp import web

from gateway.agent import conversations
from gateway.agent.mcp import kinds_of
from gateway.api_error import ApiError
from gateway.server.keys import CONFIG, SESSIONS
from gateway.server.middleware import require
from gateway.server.routes.sessions import own_sandboxes, resolve_workspace
from gateway.session import LiveSession


async def list_agents(request: web.Request) -> web.Response:
    config = request.app[CONFIG]
    agents = config.agents
    # An agent that says what it can do when it starts (ACP) is shown with what its newest
    # session's agent declared; before any session, with the profile's features.
    # (A session that ended is only its summary: it declares nothing any more.)
    declared = {
        s.profile.name: s.machine.config.features
        for s in request.app[SESSIONS].values()
        if isinstance(s, LiveSession)
    }
    return web.json_response(
        {
            "agents": [
                {
                    **p.public(declared.get(name)),
                    "isolation": config.isolation.mode,
                    # the kinds of MCP server its sessions are given (docs/mcp.md)
                    "mcp": list(kinds_of(p)),
                }
                for name, p in agents.items()
            ]
        }
    )


async def list_conversations(request: web.Request) -> web.Response:
    """``GET /v1/agents/{agent}/conversations?workspace=PATH&limit=N`` (gateway/agent/conversations/)."""
    require(request, "operator", "conversations.list")
    config = request.app[CONFIG]
    agent = request.match_info["agent"]
    profile = config.agents.get(agent)
    if profile is None:
        raise ApiError(404, "AGENT_NOT_FOUND", f"no agent profile {agent!r}")
    workspace = resolve_workspace(config, request.query.get("workspace"))
    limit = request.query.get("limit", str(conversations.DEFAULT_LIST_LIMIT))
    if (
        not (limit.isascii() and limit.isdigit())
        or not 1 <= int(limit) <= conversations.MAX_LIST_LIMIT
    ):
        raise ApiError(
            400,
            "INVALID_REQUEST",
            f"limit must be an integer from 1 to {conversations.MAX_LIST_LIMIT}",
        )
    listing = conversations.list_conversations(
        profile,
        str(workspace),
        int(limit),
        timeout=config.server.conversations_timeout_sec,
        grace=config.server.shutdown_grace_sec,
        sandboxes=own_sandboxes(request, agent, workspace),
    )
    return web.json_response(await listing)
