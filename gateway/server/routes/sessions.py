"""The sessions resource: ``POST /v1/session``, ``GET /v1/sessions``, ``GET``, ``PATCH`` and
``DELETE /v1/session/{id}``, and ``GET /v1/whoami`` (docs/http-api.md).

Sessions live in ``app[SESSIONS]`` as ``LiveSession`` objects; the handlers only translate HTTP
into calls on them. A request is validated whole before anything is created for it; the bounds
are in docs/limits.md. A session that ended is replaced by a ``TerminatedSession``, the JSON the
API shows of it and nothing else (its process, parser, machine, buffer and connections are
freed); the newest ``KEEP_TERMINATED`` of them stay listed. The handlers check the caller's role
on the session (its owner and members) and audit what was done or refused; the helpers that find
the session of a path and check that role (``visible_session``, ``require_on``, ``still_live``)
serve the other resources of a session too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, cast

import msgspec
from aiohttp import web

from gateway.agent import conversations
from gateway.agent.environment import agent_environment
from gateway.agent.exit import missing_executable
from gateway.agent.sandbox import SpawnSandbox
from gateway.agent.sandbox import probe as sandbox_probe
from gateway.agent.sandbox import spawn as sandboxes
from gateway.api_error import ApiError
from gateway.config import AgentProfile, Config
from gateway.protocol import mcp_servers as mcp
from gateway.protocol.budget import check_limit
from gateway.protocol.buffer import BUFFER_POLICIES, FrameBuffer
from gateway.server.keys import (
    AUDIT,
    BUDGETS,
    CONFIG,
    MAX_NAME_CHARS,
    MAX_PATH_COMPONENT_BYTES,
    MAX_REATTACH_WINDOW_SEC,
    MAX_WORKSPACE_DEPTH,
    MAX_WORKSPACE_PATH_CHARS,
    METRICS,
    NOTIFIER,
    SESSIONS,
    STATE_DIR,
)
from gateway.server.middleware import audit, caller, forbidden, require
from gateway.server.routes.policy import apply_policy
from gateway.session import LiveSession
from gateway.storage.state_dir import SavedSession
from gateway.team import fleet, roles
from parsers.json_depth import MAX_JSON_DEPTH, too_deep

log = logging.getLogger("rawp_gateway.server")

KEEP_TERMINATED: Final = 100  # terminated sessions still listed (summaries only), oldest forgotten


class TerminatedSession:
    """What is kept of a session that ended: its last ``to_json()``, a few hundred bytes."""

    __slots__ = ("_summary", "id", "members", "owner")
    state: Final = "TERMINATED"

    def __init__(self, session: LiveSession) -> None:
        self.id = session.id
        self.owner = session.owner  # who may still see it (gateway/team/roles.py)
        self.members = dict(session.members)
        self._summary = {**session.to_json(), "state": "TERMINATED", "connections": 0}

    def to_json(self) -> dict[str, Any]:
        return dict(self._summary)


async def _json_body(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object. Strict JSON (no NaN or Infinity, no number beyond a double),
    nested at most ``MAX_JSON_DEPTH`` levels: anything else is 400 ``INVALID_JSON``."""
    if not request.can_read_body:
        return {}
    data = await request.read()
    if too_deep(data):
        raise ApiError(
            400, "INVALID_JSON", f"the request body nests deeper than {MAX_JSON_DEPTH} levels"
        )
    try:
        body = msgspec.json.decode(data)
    except msgspec.DecodeError as err:  # ValidationError ("Number out of range") included
        raise ApiError(400, "INVALID_JSON", f"the request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "INVALID_REQUEST", "the request body must be a JSON object")
    return body


def resolve_workspace(config: Config, requested: Any) -> Path:
    """The session's workspace directory: an existing directory inside the root, named by a
    bounded path (checked before anything is touched)."""
    root = config.server.workspace_root
    if requested is None:
        return root
    if not isinstance(requested, str) or not requested:
        raise ApiError(400, "INVALID_REQUEST", "workspace_path must be a non-empty string")
    parts = [p for p in requested.split("/") if p]
    if (
        "\0" in requested
        or len(requested) > MAX_WORKSPACE_PATH_CHARS
        or len(parts) > MAX_WORKSPACE_DEPTH
        or any(len(p.encode()) > MAX_PATH_COMPONENT_BYTES for p in parts)
    ):
        raise ApiError(
            400,
            "INVALID_REQUEST",
            f"workspace_path must be at most {MAX_WORKSPACE_PATH_CHARS} characters and "
            f"{MAX_WORKSPACE_DEPTH} levels, each name at most {MAX_PATH_COMPONENT_BYTES} bytes, "
            "no NUL",
        )
    try:
        path = (root / requested).resolve()  # an absolute requested path replaces root
        is_dir = path.is_dir()
        is_other = not is_dir and path.exists()
    except (OSError, RuntimeError) as err:  # a symlink loop, a name the filesystem refuses
        raise ApiError(400, "INVALID_REQUEST", f"workspace_path cannot be used: {err}") from None
    if path != root and root not in path.parents:
        raise ApiError(
            403, "WORKSPACE_FORBIDDEN", f"workspace_path must be inside the workspace root {root}"
        )
    if is_other:
        raise ApiError(400, "INVALID_REQUEST", "workspace_path is not a directory")
    if not is_dir:
        # Not created: a mistyped path would otherwise give the agent an empty directory to work
        # in, as `cd` into a missing directory would not.
        raise ApiError(
            404, "WORKSPACE_NOT_FOUND", f"workspace_path {requested!r} does not exist under {root}"
        )
    return path


def _check_name(name: Any, *, required: bool) -> None:
    """A session name: optional when creating (then it may also be empty), required to rename."""
    if name is None and not required:
        return
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or (required and not name):
        what = "a non-empty string" if required else "a string"
        raise ApiError(
            400, "INVALID_REQUEST", f"name must be {what} of at most {MAX_NAME_CHARS} characters"
        )


async def create_session(request: web.Request) -> web.Response:
    app = request.app
    config = app[CONFIG]
    require(request, "operator", "session.create")
    body = await _json_body(request)
    agent = body.get("agent")
    if not isinstance(agent, str) or not agent:
        raise ApiError(400, "INVALID_REQUEST", "agent is required (see GET /v1/agents)")
    profile = config.agents.get(agent)
    if profile is None:
        names = ", ".join(sorted(config.agents))
        raise ApiError(404, "AGENT_NOT_FOUND", f"no agent profile {agent!r}; known: {names}")
    name = body.get("name")
    _check_name(name, required=False)
    origin = body.get("origin", "remote")
    if origin not in ("remote", "local"):
        raise ApiError(400, "INVALID_REQUEST", "origin must be remote or local")
    window = body.get("reattach_window_sec", config.server.reattach_window_sec)
    if (
        isinstance(window, bool)
        or not isinstance(window, int | float)
        or not 0 <= window <= MAX_REATTACH_WINDOW_SEC  # False for NaN
    ):
        raise ApiError(
            400,
            "INVALID_REQUEST",
            f"reattach_window_sec must be a number from 0 to {MAX_REATTACH_WINDOW_SEC}",
        )
    buffer = buffer_from(body.get("buffer"), config)
    workspace = resolve_workspace(config, body.get("workspace_path"))
    servers = requested_mcp_servers(request, body.get("mcp_servers"))
    resume = body.get("resume_conversation")
    # A CLI that is not installed fails here for every profile, the same way: a single-turn one
    # would otherwise start (and fail) only at the first prompt. A continued conversation is shown
    # without its agent, which starts (or fails, with AGENT_START_FAILED) at the next prompt.
    missing = missing_executable(profile.command[0], agent_environment(profile.env))
    if missing is not None and resume is None:
        raise ApiError(502, "AGENT_START_FAILED", f"the {agent} agent could not start: {missing}")
    transcript = None
    seed: SpawnSandbox | None = None  # sandbox mode: the HOME that holds the conversation
    own = own_sandboxes(request, agent, workspace) if resume is not None else None
    if resume is not None and own is not None:
        transcript, seed = await conversations.find_conversation(
            profile,
            str(workspace),
            resume,
            own,
            timeout=config.server.conversations_timeout_sec,
            grace=config.server.shutdown_grace_sec,
        )
    elif resume is not None:  # read and translated before anything is created
        transcript = await conversations.load_conversation(
            profile,
            str(workspace),
            resume,
            timeout=config.server.conversations_timeout_sec,
            grace=config.server.shutdown_grace_sec,
        )
    session = await start_session(
        request,
        profile,
        workspace,
        name=name,
        origin=origin,
        reattach_window_sec=float(window),
        buffer=buffer,
        resume=resume,
        transcript=transcript,
        seed=seed,
        mcp_servers=servers,
    )
    return web.json_response(session.to_json(), status=201)


def requested_mcp_servers(request: web.Request, entries: Any) -> tuple[mcp.ServerSpec, ...]:
    """``mcp_servers`` of ``POST /v1/session``, checked (docs/mcp.md): an operator's or an
    admin's (a stdio server is a program the agent runs for them); 400 ``INVALID_MCP_SERVERS``
    naming what is wrong."""
    if entries is None:
        return ()
    require(request, "operator", "session.create")
    try:
        return mcp.servers_from_wire(entries, "request")
    except mcp.McpServerError as err:
        raise ApiError(400, "INVALID_MCP_SERVERS", str(err)) from None


def session_mcp_servers(
    config: Config, profile: AgentProfile, *given: Sequence[mcp.ServerSpec]
) -> tuple[mcp.ServerSpec, ...]:
    """A new session's MCP servers: the configured ones its profile takes, then ``given`` (a
    master's, an editor's); 400 ``INVALID_MCP_SERVERS`` when a name comes twice or there are too
    many."""
    try:
        return mcp.merged(config.mcp.servers, profile.name, *given)
    except mcp.McpServerError as err:
        raise ApiError(400, "INVALID_MCP_SERVERS", str(err)) from None


async def start_session(
    request: web.Request,
    profile: AgentProfile,
    workspace: Path,
    *,
    name: str | None = None,
    origin: str = "remote",
    reattach_window_sec: float | None = None,
    buffer: FrameBuffer | None = None,
    resume: Any = None,
    transcript: Any = None,
    seed: SpawnSandbox | None = None,
    mcp_servers: Sequence[mcp.ServerSpec] = (),
) -> LiveSession:
    """Create, register and start a session of the caller's from what was validated already
    (``POST /v1/session``, an ACP client's ``session/new``); audited. ``seed``: in sandbox mode,
    the sandbox whose HOME holds the conversation ``resume`` names; ``mcp_servers``: the
    master's or the editor's, checked (``mcp_servers.servers_from_wire``), merged here with the
    configured ones."""
    app = request.app
    config = app[CONFIG]
    agent = profile.name
    servers = session_mcp_servers(config, profile, mcp_servers)
    window = (
        config.server.reattach_window_sec if reattach_window_sec is None else reattach_window_sec
    )
    if config.isolation.sandboxed:  # never an agent outside it, single-turn ones included
        problem = await sandbox_probe(config.isolation, agent_environment(profile.env))
        if problem is not None:
            raise ApiError(
                502, "AGENT_START_FAILED", f"the {agent} agent could not start: {problem}"
            )
    # Everything is valid: only now is anything created (the session, its agent).
    check_taking(app, new_session=True)
    if sessions_held(app) >= config.server.max_sessions:
        raise ApiError(
            503,
            "TOO_MANY_SESSIONS",
            f"this gateway runs at most {config.server.max_sessions} sessions (max_sessions); "
            "delete one first",
        )
    session_id = str(uuid.uuid4())
    saved = _session_directory(app, session_id)
    session = LiveSession(
        session_id,
        profile,
        workspace,
        config=config,
        metrics=app[METRICS],
        name=name,
        origin=origin,
        reattach_window_sec=float(window),
        buffer=buffer,
        on_terminated=lambda s: session_ended(app, s),
        saved=saved,
        mcp_servers=servers,
    )
    session.owner = caller(request).user
    wire_session(app, session, caller(request).role)
    try:
        try:  # a record that cannot be written: no session (the cleanup below removes it all)
            session.write_first_record()
        except OSError as err:
            raise _no_storage(session_id, "record", err) from None
        if seed is not None:  # its agent resumes the conversation from a copy of that HOME
            await _copy_home(seed, session)
        if transcript is not None:  # before it is listed: nobody may attach during the replay
            # A transcript means load_conversation took resume as a conversation id (a str).
            await session.continue_conversation(cast(str, resume), transcript)
        app[SESSIONS][session_id] = session
        await session.start()
    except BaseException:
        # Never a registered session (or a running agent) behind an error answer.
        app[SESSIONS].pop(session_id, None)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                asyncio.shield(session.delete("error", "client")),
                config.server.shutdown_grace_sec + 5,
            )
        raise
    if session.start_error is not None:
        app[SESSIONS].pop(session_id, None)
        raise ApiError(
            502, "AGENT_START_FAILED", f"the {agent} agent could not start: {session.start_error}"
        )
    log.info("session created", extra={"session": session_id, "agent": agent})
    detail: dict[str, Any] = {"agent": agent}
    if resume is not None:
        detail["resume_conversation"] = resume
    if servers:  # names, kinds, origins: never a value of env or headers
        detail["mcp_servers"] = [mcp.redacted(server) for server in servers]
    audit(request, "session.create", session_id, detail=detail)
    return session


def _session_directory(app: web.Application, session_id: str) -> SavedSession | None:
    """A new session's directory in the state directory (None without one); 507 when it cannot
    be made."""
    state_dir = app.get(STATE_DIR)
    if state_dir is None:
        return None
    try:
        return state_dir.create(session_id)
    except OSError as err:
        app[METRICS].state_dir_error("create")
        raise _no_storage(session_id, "directory", err) from None


def _no_storage(session_id: str, file: str, err: OSError) -> ApiError:
    """507 ``INSUFFICIENT_STORAGE``: a new session's files cannot be written (a full disk)."""
    log.error(
        "session not created: its %s cannot be written",
        file,
        extra={"session": session_id, "error": err},
    )
    return ApiError(
        507,
        "INSUFFICIENT_STORAGE",
        f"the session's record cannot be written to the state directory: {err.strerror or err}",
    )


def own_sandboxes(request: web.Request, agent: str, workspace: Path) -> list[SpawnSandbox] | None:
    """In sandbox mode, the sandboxes of the caller's own sessions of ``agent`` in ``workspace``,
    newest first: the only HOMEs whose saved conversations the caller may list or continue
    (docs/isolation.md). None when agents are not sandboxed."""
    if not request.app[CONFIG].isolation.sandboxed:
        return None
    user = caller(request).user
    mine = [
        s
        for s in request.app[SESSIONS].values()
        if isinstance(s, LiveSession)  # an ended one's HOME went with it
        and s.owner == user
        and s.profile.name == agent
        and s.workspace == workspace
    ]
    mine.sort(key=lambda s: s.created_at, reverse=True)
    boxes = [s.sandbox() for s in mine[: conversations.MAX_HOMES]]
    return [b for b in boxes if b is not None]


async def _copy_home(seed: SpawnSandbox, session: LiveSession) -> None:
    target = session.sandbox()
    assert target is not None
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, sandboxes.copy_home, seed.home, target.home)
    except sandboxes.HomeTooLarge as err:
        raise ApiError(
            507,
            "HOME_TOO_LARGE",
            f"the HOME that holds the conversation has {err}: it is not copied into a new "
            "session (docs/isolation.md)",
        ) from None


def wire_session(app: web.Application, session: LiveSession, role: str | None = None) -> None:
    """The gateway's audit log and notifier, for what the session's masters and agent do, and the
    permission rules in force with its owner's ``role``."""
    session.audit = app[AUDIT] if app[AUDIT].enabled else None
    session.notifier = app[NOTIFIER] if app[NOTIFIER].enabled else None
    session.budgets = app[BUDGETS]
    apply_policy(app, session, role)


def buffer_from(buffer: Any, config: Config) -> FrameBuffer:
    if buffer is None:
        return FrameBuffer(config.server.buffer_policy, config.server.buffer_max_bytes)  # type: ignore[arg-type]
    if not isinstance(buffer, dict):
        raise ApiError(400, "INVALID_REQUEST", "buffer must be an object {policy, max_bytes}")
    buffer_policy = buffer.get("policy", config.server.buffer_policy)
    if buffer_policy not in BUFFER_POLICIES:
        raise ApiError(
            400, "INVALID_REQUEST", f"buffer.policy must be one of {', '.join(BUFFER_POLICIES)}"
        )
    max_bytes = buffer.get("max_bytes", config.server.buffer_max_bytes)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ApiError(400, "INVALID_REQUEST", "buffer.max_bytes must be an integer >= 0")
    if max_bytes > config.server.max_buffer_bytes:
        raise ApiError(
            400,
            "INVALID_REQUEST",
            f"buffer.max_bytes may be at most {config.server.max_buffer_bytes} on this gateway",
        )
    return FrameBuffer(buffer_policy, max_bytes)


def session_ended(app: web.Application, session: LiveSession) -> None:
    """A session ended: its summary replaces it (freeing everything else), and the oldest
    summaries past ``KEEP_TERMINATED`` are forgotten."""
    sessions: dict[str, LiveSession | TerminatedSession] = app[SESSIONS]
    if sessions.get(session.id) is not session:
        return  # never listed (its agent could not start) or already replaced
    sessions[session.id] = TerminatedSession(session)
    terminated = [s for s in sessions.values() if s.state == "TERMINATED"]
    for old in terminated[:-KEEP_TERMINATED]:
        del sessions[old.id]
        app[METRICS].session_state("TERMINATED", None)


def visible_session(request: web.Request) -> LiveSession | TerminatedSession:
    """The session of the path, if the caller may see it (one they may not is not there)."""
    session_id = request.match_info["session_id"]
    session = request.app[SESSIONS].get(session_id)
    if session is None or role_on(request, session) is None:
        raise ApiError(404, "SESSION_NOT_FOUND", f"no session {session_id}")
    return session


def role_on(request: web.Request, session: LiveSession | TerminatedSession) -> str | None:
    return roles.session_role(caller(request), session.owner, session.members)


def require_on(
    request: web.Request, session: LiveSession | TerminatedSession, role: str, action: str
) -> None:
    """403 ``FORBIDDEN`` (audited) unless the caller's role on ``session`` is at least ``role``."""
    has = role_on(request, session)
    if not roles.at_least(has, role):
        forbidden(request, action, session.id, role, has)


def still_live(session: LiveSession | TerminatedSession) -> LiveSession:
    """The session if it is still live; 409 ``SESSION_TERMINATED`` for one that has ended, whether
    replaced by its summary yet or not (nothing can be done with it)."""
    if isinstance(session, TerminatedSession) or session.state == "TERMINATED":
        raise ApiError(409, "SESSION_TERMINATED", "the session has ended")
    return session


async def list_sessions(request: web.Request) -> web.Response:
    """This gateway's sessions with ``?scope=local``, else the fleet's (gateway/team/fleet.py): each
    peer asked with the caller's credentials shows what that caller may see there."""
    scope = request.query.get("scope")
    if scope is not None and scope != "local":
        raise ApiError(400, "INVALID_REQUEST", "scope must be 'local' (or left out)")
    visible = [s.to_json() for s in request.app[SESSIONS].values() if role_on(request, s)]
    if scope == "local":
        return web.json_response({"sessions": visible})
    return web.json_response(await fleet.sessions_answer(request, visible))


def check_taking(app: web.Application, *, new_session: bool) -> None:
    """503 ``SHUTTING_DOWN`` on a gateway that stops (nothing new lands on it) or is drained (no
    new session; its sessions go on): gateway/team/fleet.py."""
    why = fleet.refusal(app, new_session=new_session)
    if why is not None:
        raise ApiError(503, "SHUTTING_DOWN", why)


def sessions_held(app: web.Application) -> int:
    """The sessions not yet ended (what ``max_sessions`` bounds)."""
    return sum(1 for s in app[SESSIONS].values() if s.state != "TERMINATED")


async def whoami(request: web.Request) -> web.Response:
    identity = caller(request)
    return web.json_response({"user": identity.user, "role": identity.role})


async def get_session(request: web.Request) -> web.Response:
    return web.json_response(visible_session(request).to_json())


async def patch_session(request: web.Request) -> web.Response:
    """``{"name"}`` renames (admin), ``{"members"}`` replaces who it is shared with (the owner or
    an admin), ``{"budget_usd"}`` sets its budget (an admin of the gateway: docs/budgets.md); all
    are checked before any changes."""
    session = visible_session(request)
    body = await _json_body(request)
    if not body.keys() & {"name", "members", "budget_usd"}:
        raise ApiError(
            400, "INVALID_REQUEST", "give name (rename), members (share) or budget_usd (budget)"
        )
    budget: float | None = None
    if "budget_usd" in body:
        require(request, "admin", "session.budget", session.id)
        if body["budget_usd"] is not None:
            try:
                budget = check_limit(body["budget_usd"], "budget_usd")
            except ValueError as err:
                raise ApiError(400, "INVALID_REQUEST", str(err)) from None
    members = None
    if "members" in body:
        if caller(request).user != session.owner:
            require_on(request, session, "admin", "session.share")
        try:
            members = roles.check_members(body["members"])
        except ValueError as err:
            raise ApiError(400, "INVALID_REQUEST", str(err)) from None
    name = body.get("name")
    if "name" in body:
        require_on(request, session, "admin", "session.rename")
        _check_name(name, required=True)
    session = still_live(session)
    if members is not None:
        session.share(members)
        audit(request, "session.share", session.id, detail={"members": members})
    if name is not None:
        session.rename(name)
        audit(request, "session.rename", session.id, detail={"name": name})
    if "budget_usd" in body:
        request.app[BUDGETS].set_limit(session, budget)
        audit(request, "session.budget", session.id, detail={"budget_usd": budget})
    return web.json_response(session.to_json())


async def delete_session(request: web.Request) -> web.Response:
    session = visible_session(request)
    require_on(request, session, "admin", "session.delete")
    if not isinstance(session, TerminatedSession) and session.state != "TERMINATED":
        await session.delete("master_request", "master")
        audit(request, "session.delete", session.id)
    return web.json_response(session.to_json())
