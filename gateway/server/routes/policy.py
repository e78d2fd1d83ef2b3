"""Permission policies on the server's side (docs/policies.md): ``GET /v1/policy/decide``, which
explains what the rules in force decide for a tool call without running anything (admin only);
the rules and owner role each session's machine is given (``apply_policy``); and SIGHUP's
``reload_policy``, which keeps the rules in force when the file's new ones cannot be used."""

from __future__ import annotations

import logging
from typing import Any, Final

import msgspec
from aiohttp import web

from gateway.api_error import ApiError
from gateway.config.checks import ConfigError
from gateway.config.policy import read_policy
from gateway.protocol.policy import decide
from gateway.server.keys import AUTH, CONFIG, POLICY, SESSIONS
from gateway.server.middleware import require
from gateway.session import LiveSession
from gateway.session.tool_paths import where_paths
from gateway.team import roles
from parsers.json_depth import MAX_JSON_DEPTH, too_deep

__all__ = ["apply_policy", "decide_policy", "owner_role", "reload_policy"]

log = logging.getLogger("rawp_gateway.server")

MAX_INPUT_BYTES: Final = 64 * 1024  # of ?input=, a tool call's input as JSON
MAX_TOOL_CHARS: Final = 256  # of ?tool= and ?agent=


def owner_role(app: web.Application, owner: str, known: str | None = None) -> str | None:
    """The gateway role of a session's owner: the users file's (read again on SIGHUP), else the
    role they had when they made it (``known``: a token holder, an OIDC user)."""
    identity = app[AUTH].users().get(owner)
    if identity is not None:
        return identity.role
    if owner in (roles.LOCAL.user, roles.ADMIN.user) and known is None:
        return "admin"
    return known


def apply_policy(app: web.Application, session: LiveSession, role: str | None = None) -> None:
    """Give the session's machine the rules in force and its owner's role."""
    known = role if role is not None else session.machine.owner_role
    session.machine.set_policy(app[POLICY].rules, owner_role(app, session.owner, known))


def reload_policy(app: web.Application) -> None:
    """SIGHUP: read ``[[policy.rules]]`` of the config file again. A rule set that cannot be used
    is refused whole, and the one in force stays (the log line says the file, rule and reason)."""
    path = app[CONFIG].config_file
    if path is not None:
        try:
            rules = read_policy(path)
        except ConfigError as err:
            log.error(
                "policy rules not reloaded, the %d rules before stay: %s",
                len(app[POLICY].rules),
                err,
            )
            return
        app[POLICY].rules = rules
        log.info("policy rules reloaded", extra={"rules": len(rules)})
    for session in app[SESSIONS].values():
        if isinstance(session, LiveSession):
            apply_policy(app, session)


async def decide_policy(request: web.Request) -> web.Response:
    """``GET /v1/policy/decide?agent=NAME&tool=NAME&input=JSON[&session=ID]``: what the rules in
    force decide, as ``{"decision", "rule"}`` (both null when no rule matches)."""
    require(request, "admin", "policy.decide")
    query = request.query
    agent = query.get("agent", "")
    tool = query.get("tool", "")
    for key, value in (("agent", agent), ("tool", tool)):
        if not value or len(value) > MAX_TOOL_CHARS:
            raise ApiError(
                400,
                "INVALID_POLICY_QUERY",
                f"{key} must be given, at most {MAX_TOOL_CHARS} characters",
            )
    if agent not in request.app[CONFIG].agents:
        raise ApiError(404, "AGENT_NOT_FOUND", f"no agent profile {agent}")
    tool_input = _input(query.get("input", "{}"))
    workspace, role, paths = "", "admin", None
    session_id = query.get("session")
    if session_id is not None:
        session = request.app[SESSIONS].get(session_id)
        if not isinstance(session, LiveSession):
            raise ApiError(404, "SESSION_NOT_FOUND", f"no live session {session_id}")
        workspace, role = str(session.workspace), session.machine.owner_role or ""
        # Paths judged where they lead in that workspace, as a permission question's are.
        paths = where_paths(tool_input, [], workspace)
    found = decide(
        request.app[POLICY].rules,
        tool=tool,
        tool_input=tool_input,
        agent=agent,
        role=role or None,
        workspace=workspace,
        # What an ACP agent says of its call, when the input spells it out.
        title=_text(tool_input.get("title")),
        kind=_text(tool_input.get("kind")),
        paths=paths,
    )
    if found is None:
        return web.json_response({"decision": None, "rule": None})
    return web.json_response({"decision": found.decision, "rule": found.name})


def _input(text: str) -> dict[str, Any]:
    data = text.encode()
    if len(data) > MAX_INPUT_BYTES:
        raise ApiError(400, "INVALID_POLICY_QUERY", f"input is at most {MAX_INPUT_BYTES} bytes")
    if too_deep(data):
        raise ApiError(400, "INVALID_JSON", f"input nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError as err:
        raise ApiError(400, "INVALID_JSON", f"input is not JSON: {err}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "INVALID_POLICY_QUERY", "input must be a JSON object")
    return value


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
