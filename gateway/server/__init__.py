"""The HTTP and WebSocket server of docs/http-api.md (aiohttp), and graceful shutdown.

Theory of operation
-------------------
``create_app(config)`` builds the aiohttp application; ``serve(config)`` runs it on uvloop until
SIGTERM or SIGINT. Sessions live in ``app[SESSIONS]`` as ``LiveSession`` objects; the handlers only
translate HTTP into calls on them. A session that ended is replaced by a ``TerminatedSession``, the
JSON the API shows of it and nothing else (its process, parser, machine, history and connections are
freed); the newest ``KEEP_TERMINATED`` of them stay listed. Two middlewares wrap every request:
errors become ``{"error_code", "message"}`` JSON (never a stack trace; once a WebSocket is open, a
close with 1011 instead), and, when credentials are configured, every request but ``/healthz``
and the browser console's page needs ``Authorization: Bearer <token>``, which ``gateway/team/auth.py``
makes an identity (user, role) on the request; a WebSocket upgrade may carry a one-time
``?ticket=`` instead (``gateway/console/``), which carries the identity of whoever asked for it.
The handlers check the caller's role on the session (its owner and members) and write what was
done or refused to the audit log (``gateway/team/audit.py``). A request is validated whole before
anything is created for it; the bounds are in docs/limits.md.

On shutdown every live session is deleted the DPS way (SIGTERM, SIGKILL after the grace period,
cleanup frames, ``session.deleted``, close), so no agent process outlives the gateway. With a state
directory (``[server] state_dir``) sessions outlive the gateway instead: each is suspended (its agent
stopped, its files written as a clean stop, its WebSockets closed with 1012) and read back when the
gateway starts again (``gateway/storage/state_dir.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import ipaddress
import logging
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, BinaryIO, Final, cast

import msgspec
from aiohttp import WSCloseCode, WSMsgType, web

from gateway import console
from gateway.agent import conversations, process
from gateway.api_error import ApiError
from gateway.config import Config
from gateway.metrics import GatewayMetrics
from gateway.protocol.history import POLICIES, History
from gateway.server.limits import ConnectionGuard, GatewayRunner, handler_args
from gateway.session import LiveSession
from gateway.storage.files import FileError, byte_range, strong_etag, upload_mime_type
from gateway.storage.state_dir import LoadError, StateDir
from gateway.team import auth, fleet, roles
from gateway.team.audit import AuditLog
from gateway.team.notify import Notifier
from parsers.json_depth import MAX_JSON_DEPTH, too_deep

__all__ = ["CONFIG", "METRICS", "SESSIONS", "create_app", "serve"]

log = logging.getLogger("rawp_gateway.server")

SUBPROTOCOL: Final = "rawp-dps-1.0"
CONFIG: Final = web.AppKey("config", Config)
METRICS: Final = web.AppKey("metrics", GatewayMetrics)
SESSIONS: Final = web.AppKey("sessions", dict)
STATE: Final = web.AppKey("state", StateDir)
TICKETS: Final = web.AppKey("tickets", console.TicketStore)
GUARD: Final = web.AppKey("guard", ConnectionGuard)
STATIC: Final = web.AppKey("static", dict)
AUTH: Final = web.AppKey("auth", auth.Authenticator)
AUDIT: Final = web.AppKey("audit", AuditLog)
NOTIFIER: Final = web.AppKey("notifier", Notifier)
# Who made the request (auth_middleware): an Identity, for every request but the public ones.
IDENTITY: Final = web.RequestKey("identity", roles.Identity)
HEARTBEAT: Final = web.AppKey("heartbeat", float)
HEARTBEAT_SEC: Final = 30.0  # docs/http-api.md: pings, and a peer that stops answering is closed
WS_ROUTE: Final = "session-ws"
# A handler that has sent its response head (a WebSocket after prepare) stores the response here:
# from then on an error must never be answered with an HTTP error response (errors_middleware).
STREAMING: Final = web.RequestKey("streaming", web.StreamResponse)
# The ticket a WebSocket upgrade was authenticated with (auth_middleware): spent when it succeeds.
TICKET: Final = web.RequestKey("ticket", str)
KEEP_TERMINATED: Final = 100  # terminated sessions still listed (summaries only), oldest forgotten
# Limits of POST /v1/session and PATCH fields (docs/limits.md).
MAX_NAME_CHARS: Final = 256
MAX_REATTACH_WINDOW_SEC: Final = 7 * 24 * 3600
MAX_WORKSPACE_PATH_CHARS: Final = 1024
MAX_WORKSPACE_DEPTH: Final = 32  # directory levels in workspace_path
MAX_PATH_COMPONENT_BYTES: Final = 255  # NAME_MAX of common filesystems
MAX_MESSAGE_ID_CHARS: Final = 256  # ?last_message_id= (the gateway's own ids are 36)


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


def _error_for(exc: web.HTTPException) -> web.Response:
    codes = {
        400: "BAD_REQUEST",
        401: "UNAUTHORIZED",
        404: "NOT_FOUND",
        405: "METHOD_NOT_ALLOWED",
        413: "REQUEST_TOO_LARGE",
    }
    code = codes.get(exc.status, "HTTP_ERROR")
    message = exc.reason or exc.text or "error"
    if exc.status == 413:
        message = "request body too large"
    return web.json_response({"error_code": code, "message": message}, status=exc.status)


@web.middleware
async def errors_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except Exception as exc:
        streaming = request.get(STREAMING)
        if streaming is None:
            return _error_response(request, exc)
        # The HTTP response was sent already (an upgraded WebSocket): a JSON error written now
        # would land inside the stream and corrupt it. End the stream its own way instead.
        log.error("error after the response began", exc_info=exc, extra={"path": request.path})
        if isinstance(streaming, web.WebSocketResponse) and not streaming.closed:
            await streaming.close(code=WSCloseCode.INTERNAL_ERROR, message=b"internal error")
        return streaming


def _error_response(request: web.Request, exc: Exception) -> web.StreamResponse:
    if isinstance(exc, ApiError):
        return exc.response()
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        return _error_for(exc)
    log.error("unhandled error", exc_info=exc, extra={"path": request.path})
    return web.json_response(
        {"error_code": "INTERNAL_ERROR", "message": "internal error; see the gateway log"},
        status=500,
    )


def _public(path: str) -> bool:
    """Served without the token: liveness, readiness and the console's page (it holds no data)."""
    return path in ("/healthz", "/readyz", "/", "/ui") or path.startswith("/ui/")


def _ticket_identity(request: web.Request) -> roles.Identity | None:
    """Whoever asked for the valid one-time ticket on this upgrade of the session it was issued
    for (browser console); the upgrade spends it once it succeeds (``websocket``)."""
    ticket = request.query.get("ticket")
    if not ticket or request.match_info.handler is not websocket:  # also under route_prefix
        return None
    session_id = request.match_info["session_id"]
    identity = request.app[TICKETS].valid(ticket, session_id, time.monotonic())
    if identity is not None:
        request[TICKET] = ticket
    return identity


def ticket_owner(request: web.Request) -> str:
    """Whose tickets a ``ws-ticket`` request counts against (``MAX_TICKETS_PER_OWNER``): the
    user it was authenticated as (gateway/team/auth.py), whichever credential they used."""
    return _caller(request).user


@web.middleware
async def auth_middleware(request: web.Request, handler):
    """Every request but the public ones gets its ``IDENTITY`` (gateway/team/auth.py), or is refused:
    401 ``UNAUTHORIZED`` for no or a wrong credential, 403 ``FORBIDDEN`` for a user with no role."""
    if _public(fleet.strip_prefix(request.path, request.app[CONFIG].route_prefix)):
        return await handler(request)
    authenticator = request.app[AUTH]
    credential = _bearer(request)
    found: roles.Identity | auth.AuthFailure
    if not credential and authenticator.enabled and "ticket" in request.query:
        found = _ticket_identity(request) or auth.AuthFailure("unknown or spent ticket")
    else:
        found = await authenticator.authenticate(credential)
    if isinstance(found, auth.AuthFailure):
        _audit(request, "auth.failed", None, result="refused", detail={"reason": found.reason})
        return ApiError(401, "UNAUTHORIZED", "missing or invalid credentials").response()
    if found.role is None:
        _audit(request, "auth.failed", None, found, "refused", {"reason": "no known role"})
        return ApiError(
            403, "FORBIDDEN", f"user {found.user} has no role on this gateway"
        ).response()
    request[IDENTITY] = found
    request.app[GUARD].authenticated(request.protocol)
    return await handler(request)


def _audit(
    request: web.Request,
    action: str,
    session_id: str | None,
    identity: roles.Identity | None = None,
    result: str = "ok",
    detail: dict[str, Any] | None = None,
) -> None:
    request.app[AUDIT].record(
        action,
        identity or request.get(IDENTITY),
        peer=request.remote,
        session_id=session_id,
        result=result,
        detail=detail,
    )


def _caller(request: web.Request) -> roles.Identity:
    return request.get(IDENTITY) or roles.LOCAL


def _require(request: web.Request, role: str, action: str, session_id: str | None = None) -> None:
    """403 ``FORBIDDEN`` (audited) unless the caller's own role is at least ``role``."""
    identity = _caller(request)
    if not roles.at_least(identity.role, role):
        _forbidden(request, action, session_id, role, identity.role)


def _forbidden(
    request: web.Request, action: str, session_id: str | None, needed: str, has: str | None
) -> None:
    _audit(request, action, session_id, result="refused", detail={"needs": needed, "has": has})
    raise ApiError(403, "FORBIDDEN", f"this needs role {needed}; {_caller(request).user} has {has}")


def browser_guard_middleware(config: Config):
    """What a web page in the user's browser must not do to a gateway it can reach. Browsers send
    simple cross-site POSTs without asking first, and a DNS-rebound page on a loopback gateway
    looks same-origin; neither carries the token, but with no token nothing else stands in the way:

    * a request that changes something (any method but GET and HEAD) from a page of another origin
      is refused (403 ``ORIGIN_FORBIDDEN``) unless ``[server] allowed_origins`` lists it, as
      WebSocket upgrades are; requests without ``Origin`` (non-browser masters) are unaffected;
    * with no token, the gateway answers only requests addressed to a loopback host (``Host``
      127.0.0.0/8, ``localhost`` or ``[::1]``): anything else is 403 ``HOST_FORBIDDEN``.
    """
    allowed = config.allowed_origins
    tokenless = not config.authenticated

    @web.middleware
    async def middleware(request: web.Request, handler):
        if tokenless and not _loopback_host(request.host):
            return ApiError(
                403,
                "HOST_FORBIDDEN",
                "without a token this gateway answers only requests to 127.0.0.1, localhost or "
                "[::1]",
            ).response()
        if request.method not in ("GET", "HEAD"):
            try:
                console.check_origin(request, allowed)
            except console.OriginForbidden as exc:
                return ApiError(
                    403,
                    "ORIGIN_FORBIDDEN",
                    f"requests from origin {exc} are not allowed (see [server] allowed_origins)",
                ).response()
        return await handler(request)

    return middleware


def _loopback_host(host: str) -> bool:
    """Whether a ``Host`` header names this machine's loopback (with or without a port)."""
    name = host.rpartition("]")[0].lstrip("[") if host.startswith("[") else host.partition(":")[0]
    name = name.lower().rstrip(".")
    return name == "localhost" or name.endswith(".localhost") or is_loopback(name)


def _bearer(request: web.Request) -> bytes:
    """The credentials of ``Authorization: Bearer <token>``; the scheme is case-insensitive (RFC
    7235). Header bytes that are not UTF-8 reach us as surrogate escapes: they are given back as
    the bytes they were (never an error), so they simply do not match."""
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return b""
    return credentials.strip(" ").encode("utf-8", "surrogateescape")


# --- handlers -----------------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def metrics_handler(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS].render()
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response


async def list_agents(request: web.Request) -> web.Response:
    agents = request.app[CONFIG].agents
    # An agent that says what it can do when it starts (ACP) is shown with what its newest
    # session's agent declared; before any session, with the profile's features.
    declared = {s.profile.name: s.machine.config.features for s in request.app[SESSIONS].values()}
    return web.json_response(
        {"agents": [p.public(declared.get(name)) for name, p in agents.items()]}
    )


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


def _resolve_workspace(config: Config, requested: Any) -> Path:
    """The session's workspace directory: an existing directory inside the root, named by a
    bounded path (checked before anything is touched)."""
    root = config.workspace_root
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
    _require(request, "operator", "session.create")
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
    window = body.get("reattach_window_sec", config.reattach_window_sec)
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
    history = _history_from(body.get("buffer"), config)
    workspace = _resolve_workspace(config, body.get("workspace_path"))
    resume = body.get("resume_conversation")
    # A CLI that is not installed fails here for every profile, the same way: a single-turn one
    # would otherwise start (and fail) only at the first prompt. A continued conversation is shown
    # without its agent, which starts (or fails, with AGENT_START_FAILED) at the next prompt.
    missing = process.missing_executable(profile.command[0], {**os.environ, **profile.env})
    if missing is not None and resume is None:
        raise ApiError(502, "AGENT_START_FAILED", f"the {agent} agent could not start: {missing}")
    transcript = None
    if resume is not None:  # read and translated before anything is created
        transcript = await conversations.load_conversation(
            profile,
            str(workspace),
            resume,
            timeout=config.conversations_timeout_sec,
            grace=config.shutdown_grace_sec,
        )
    # Everything is valid: only now is anything created (the session, its agent).
    _check_taking(app, new_session=True)
    if _held(app) >= config.max_sessions:
        raise ApiError(
            503,
            "TOO_MANY_SESSIONS",
            f"this gateway runs at most {config.max_sessions} sessions (max_sessions); "
            "delete one first",
        )
    session_id = str(uuid.uuid4())
    state = app.get(STATE)
    session = LiveSession(
        session_id,
        profile,
        workspace,
        config=config,
        metrics=app[METRICS],
        name=name,
        origin=origin,
        reattach_window_sec=float(window),
        history=history,
        on_terminated=lambda s: _terminated(app, s),
        saved=state.create(session_id) if state is not None else None,
    )
    session.owner = _caller(request).user
    _wire(app, session)
    try:
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
                asyncio.shield(session.delete("error", "client")), config.shutdown_grace_sec + 5
            )
        raise
    if session.start_error is not None:
        app[SESSIONS].pop(session_id, None)
        raise ApiError(
            502, "AGENT_START_FAILED", f"the {agent} agent could not start: {session.start_error}"
        )
    log.info("session created", extra={"session": session_id, "agent": agent})
    detail = {"agent": agent} if resume is None else {"agent": agent, "resume_conversation": resume}
    _audit(request, "session.create", session_id, detail=detail)
    return web.json_response(session.to_json(), status=201)


def _wire(app: web.Application, session: LiveSession) -> None:
    """The gateway's audit log and notifier, for what the session's masters and agent do."""
    session.audit = app[AUDIT] if app[AUDIT].enabled else None
    session.notifier = app[NOTIFIER] if app[NOTIFIER].enabled else None


async def list_conversations(request: web.Request) -> web.Response:
    """``GET /v1/agents/{agent}/conversations?workspace=PATH&limit=N`` (gateway/agent/conversations/)."""
    _require(request, "operator", "conversations.list")
    config = request.app[CONFIG]
    agent = request.match_info["agent"]
    profile = config.agents.get(agent)
    if profile is None:
        raise ApiError(404, "AGENT_NOT_FOUND", f"no agent profile {agent!r}")
    workspace = _resolve_workspace(config, request.query.get("workspace"))
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
        timeout=config.conversations_timeout_sec,
        grace=config.shutdown_grace_sec,
    )
    return web.json_response(await listing)


def _history_from(buffer: Any, config: Config) -> History:
    if buffer is None:
        return History(config.buffer_policy, config.buffer_max_bytes)  # type: ignore[arg-type]
    if not isinstance(buffer, dict):
        raise ApiError(400, "INVALID_REQUEST", "buffer must be an object {policy, max_bytes}")
    policy = buffer.get("policy", config.buffer_policy)
    if policy not in POLICIES:
        raise ApiError(
            400, "INVALID_REQUEST", f"buffer.policy must be one of {', '.join(POLICIES)}"
        )
    max_bytes = buffer.get("max_bytes", config.buffer_max_bytes)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ApiError(400, "INVALID_REQUEST", "buffer.max_bytes must be an integer >= 0")
    if max_bytes > config.max_buffer_bytes:
        raise ApiError(
            400,
            "INVALID_REQUEST",
            f"buffer.max_bytes may be at most {config.max_buffer_bytes} on this gateway",
        )
    return History(policy, max_bytes)


def _terminated(app: web.Application, session: LiveSession) -> None:
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


def _session(request: web.Request) -> LiveSession | TerminatedSession:
    """The session of the path, if the caller may see it (one they may not is not there)."""
    session_id = request.match_info["session_id"]
    session = request.app[SESSIONS].get(session_id)
    if session is None or _role_on(request, session) is None:
        raise ApiError(404, "SESSION_NOT_FOUND", f"no session {session_id}")
    return session


def _role_on(request: web.Request, session: LiveSession | TerminatedSession) -> str | None:
    return roles.session_role(_caller(request), session.owner, session.members)


def _require_on(
    request: web.Request, session: LiveSession | TerminatedSession, role: str, action: str
) -> None:
    """403 ``FORBIDDEN`` (audited) unless the caller's role on ``session`` is at least ``role``."""
    has = _role_on(request, session)
    if not roles.at_least(has, role):
        _forbidden(request, action, session.id, role, has)


def _live(session: LiveSession | TerminatedSession) -> LiveSession:
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
    visible = [s.to_json() for s in request.app[SESSIONS].values() if _role_on(request, s)]
    if scope == "local":
        return web.json_response({"sessions": visible})
    return web.json_response(await fleet.sessions_answer(request, visible))


def _check_taking(app: web.Application, *, new_session: bool) -> None:
    """503 ``SHUTTING_DOWN`` on a gateway that stops (nothing new lands on it) or is drained (no
    new session; its sessions go on): gateway/team/fleet.py."""
    why = fleet.refusal(app, new_session=new_session)
    if why is not None:
        raise ApiError(503, "SHUTTING_DOWN", why)


def _held(app: web.Application) -> int:
    """The sessions not yet ended (what ``max_sessions`` bounds)."""
    return sum(1 for s in app[SESSIONS].values() if s.state != "TERMINATED")


def _set_draining(app: web.Application, on: bool) -> None:
    fleet.set_draining(app, on, _held(app))


async def whoami(request: web.Request) -> web.Response:
    identity = _caller(request)
    return web.json_response({"user": identity.user, "role": identity.role})


async def get_session(request: web.Request) -> web.Response:
    return web.json_response(_session(request).to_json())


async def patch_session(request: web.Request) -> web.Response:
    """``{"name"}`` renames (admin), ``{"members"}`` replaces who it is shared with (the owner or
    an admin); both are checked before either changes."""
    session = _session(request)
    body = await _json_body(request)
    if "name" not in body and "members" not in body:
        raise ApiError(400, "INVALID_REQUEST", "give name (rename) or members (share)")
    members = None
    if "members" in body:
        if _caller(request).user != session.owner:
            _require_on(request, session, "admin", "session.share")
        try:
            members = roles.check_members(body["members"])
        except ValueError as err:
            raise ApiError(400, "INVALID_REQUEST", str(err)) from None
    name = body.get("name")
    if "name" in body:
        _require_on(request, session, "admin", "session.rename")
        _check_name(name, required=True)
    session = _live(session)
    if members is not None:
        session.share(members)
        _audit(request, "session.share", session.id, detail={"members": members})
    if name is not None:
        session.rename(name)
        _audit(request, "session.rename", session.id, detail={"name": name})
    return web.json_response(session.to_json())


async def delete_session(request: web.Request) -> web.Response:
    session = _session(request)
    _require_on(request, session, "admin", "session.delete")
    if not isinstance(session, TerminatedSession) and session.state != "TERMINATED":
        await session.delete("master_request", "master")
        _audit(request, "session.delete", session.id)
    return web.json_response(session.to_json())


async def ws_ticket(request: web.Request) -> web.Response:
    session = _session(request)
    session = _live(session)
    ticket = request.app[TICKETS].issue(
        session.id, time.monotonic(), ticket_owner(request), _caller(request)
    )
    if ticket is None:
        raise ApiError(429, "TOO_MANY_TICKETS", "too many unused WebSocket tickets; retry shortly")
    return web.json_response({"ticket": ticket, "expires_in": console.TICKET_TTL_S})


async def console_page(request: web.Request) -> web.Response:
    return console.static_response(request.app[STATIC]["index.html"])


async def console_file(request: web.Request) -> web.Response:
    file = request.app[STATIC].get(request.match_info["name"])
    if file is None:
        raise ApiError(404, "NOT_FOUND", "no such console file")
    return console.static_response(file)


async def console_redirect(request: web.Request) -> web.Response:
    raise web.HTTPFound(request.path.removesuffix("/") + "/ui")  # under route_prefix too


async def websocket(request: web.Request) -> web.StreamResponse:
    config = request.app[CONFIG]
    try:
        console.check_origin(request, config.allowed_origins)
    except console.OriginForbidden as exc:
        raise ApiError(
            403,
            "ORIGIN_FORBIDDEN",
            f"WebSocket upgrades from origin {exc} are not allowed (see [server] allowed_origins)",
        ) from None
    session = _session(request)
    _check_taking(request.app, new_session=False)
    offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
    if SUBPROTOCOL not in offered:
        raise ApiError(
            400,
            "SUBPROTOCOL_REQUIRED",
            f"offer the WebSocket subprotocol {SUBPROTOCOL} (RAWP-1.0-Legacy is not supported)",
        )
    session = _live(session)
    role = "local_ui" if request.query.get("role") == "local-ui" else "master"
    if role == "local_ui" and not is_loopback(request.remote):
        # A local UI runs on the gateway's own machine: the role (the only way into a local
        # session, whose frames must never reach a master) is not for a client elsewhere, token
        # or not (docs/protocol-notes.md).
        raise ApiError(
            403, "LOCAL_UI_FORBIDDEN", "?role=local-ui is accepted from a loopback address only"
        )
    if session.origin == "local" and role != "local_ui":
        # DPS-2.4-local: a local session's frames go to local UI connections only.
        raise ApiError(403, "LOCAL_SESSION", "a local session accepts only ?role=local-ui")
    last_message_id = request.query.get("last_message_id") or request.headers.get(
        "X-RAWP-Last-Message-Id"
    )
    if last_message_id is not None and (
        len(last_message_id) > MAX_MESSAGE_ID_CHARS or not last_message_id.isascii()
    ):
        # It can come back in session.history, which must fit max_frame_size (and be UTF-8: a
        # header's bytes that are not arrive as surrogates). The gateway's ids are UUIDs.
        raise ApiError(
            400,
            "INVALID_REQUEST",
            f"last_message_id must be at most {MAX_MESSAGE_ID_CHARS} ASCII characters",
        )
    # ?history=all: a master with nothing yet (a new tab) gets everything the buffer holds.
    history = request.query.get("history")
    if history is not None and history != "all":
        raise ApiError(400, "INVALID_REQUEST", "history must be 'all' (or left out)")
    if history is not None and last_message_id is not None:
        raise ApiError(
            400,
            "INVALID_REQUEST",
            "give last_message_id (a reattach) or history=all (a first attach), not both",
        )
    # No permessage-deflate: the session frames each message once and writes the same bytes to
    # every connection (gateway/session/fanout.py), which a per-connection compressor would undo.
    ws = web.WebSocketResponse(
        protocols=(SUBPROTOCOL,),
        max_msg_size=config.max_frame_size,
        heartbeat=request.app[HEARTBEAT],
        compress=False,
    )
    limit = config.max_connections_per_session
    with request.app[GUARD].upgrade(session.id, len(session.connections), limit) as place:
        if not place:
            raise ApiError(
                503,
                "TOO_MANY_CONNECTIONS",
                f"a session takes at most {limit} WebSockets (max_connections_per_session)",
            )
        if not ws.can_prepare(request).ok:
            raise ApiError(400, "BAD_REQUEST", "not a WebSocket upgrade request")
        ticket = request.get(TICKET)
        if ticket is not None and not request.app[TICKETS].spend(ticket):
            # Another upgrade with the same ticket succeeded since it was checked.
            raise ApiError(401, "UNAUTHORIZED", "the WebSocket ticket was used already")
        await ws.prepare(request)
        request[STREAMING] = ws
        conn_id = str(uuid.uuid4())
        transport = request.transport
        if transport is None:  # the peer left during the handshake
            return ws
        conn = session.attach(
            conn_id,
            ws,
            role=role,
            last_message_id=last_message_id,
            full_history=history is not None,
            transport=transport,
            drain=request.writer.drain,
            abort=transport.abort,
            sender=roles.Sender(_caller(request), request.remote),
        )
    close_ready = asyncio.ensure_future(conn.close_ready.wait())
    try:
        while True:
            receiving = asyncio.ensure_future(ws.receive())
            await asyncio.wait((receiving, close_ready), return_when=asyncio.FIRST_COMPLETED)
            if not receiving.done():
                # The session closes this connection; this task owns the socket's reading, so it
                # does the close handshake (and waits for the master's close frame).
                receiving.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await receiving
                code, reason = conn.close_args
                await ws.close(code=code, message=reason)
                break
            msg = receiving.result()
            if msg.type == WSMsgType.TEXT:
                session.receive(conn_id, msg.data)
            elif msg.type == WSMsgType.BINARY:
                session.receive(conn_id, b"\x00binary")  # answered as INVALID_FRAME
            else:  # CLOSE, CLOSING, CLOSED, ERROR
                break
    finally:
        close_ready.cancel()
        session.detach(conn_id)
        if not conn.closed.is_set():
            await conn.aclose()
    return ws


# --- files (docs/files.md; gateway/storage/files.py) ----------------------------------------
# Binaries are exchanged over HTTP, never on the WebSocket. Every route here needs the token like
# any other (auth_middleware); a file belongs to its session and is gone with it.

_UPLOAD_CHUNK: Final = 64 * 1024


async def put_file(request: web.Request) -> web.Response:
    """``PUT /v1/session/{id}/files?name=<file name>``: the raw body becomes a file of the session,
    streamed to disk and refused (413) as soon as it passes ``max_upload_bytes``."""
    session = _session(request)
    _require_on(request, session, "operator", "upload")
    session = _live(session)
    store = session.files
    name = request.query.get("name")
    if name is None:
        raise ApiError(400, "INVALID_FILE_NAME", "name=<file name> is required")
    try:
        mime_type = upload_mime_type(request.headers.get("Content-Type"))
    except FileError:
        session.metrics.file("upload", "refused")
        raise
    declared = request.content_length
    if declared is not None and declared > store.max_upload_bytes:
        session.metrics.file("upload", "refused")
        raise ApiError(
            413, "FILE_TOO_LARGE", f"an upload may be at most {store.max_upload_bytes} bytes"
        )
    try:
        stored = await store.receive(
            request.content.iter_chunked(_UPLOAD_CHUNK),
            file_name=name,
            mime_type=mime_type,
        )
    except ConnectionError:
        # The master went away mid-upload; the store kept nothing of it.
        raise ApiError(400, "INVALID_REQUEST", "the upload was interrupted") from None
    _audit(
        request,
        "upload",
        session.id,
        detail={"file_name": stored.file_name[:256], "size_bytes": stored.size_bytes},
    )
    log.info(
        "file uploaded",
        extra={
            "session": session.id,
            "transfer_id": stored.transfer_id,
            "bytes": stored.size_bytes,
        },
    )
    body = {
        "transfer_id": stored.transfer_id,
        "file_url": stored.file_url,
        "file_name": stored.file_name,
        "mime_type": stored.mime_type,
        "size_bytes": stored.size_bytes,
        "checksum": stored.checksum,
    }
    return web.json_response(body, status=201)


async def get_file(request: web.Request) -> web.StreamResponse:
    """``GET /v1/session/{id}/files/{transfer_id}``: the bytes, with their ``Content-Type``, an
    ``ETag`` that is their SHA-256, one ``Range`` honoured (206; 416 when unsatisfiable),
    ``If-None-Match`` (304) and ``If-Range`` against that ETag (docs/files.md says why this is not
    aiohttp's ``FileResponse``)."""
    sessions = request.app[SESSIONS]
    session = sessions.get(request.match_info["session_id"])
    transfer_id = request.match_info["transfer_id"]
    if session is None or _role_on(request, session) is None:  # not there for this caller
        raise ApiError(404, "TRANSFER_NOT_FOUND", f"no file {transfer_id!r}: no such session")
    if isinstance(session, TerminatedSession):  # its files went with it
        raise ApiError(404, "TRANSFER_NOT_FOUND", f"no file {transfer_id!r}: the session has ended")
    stored, fd = session.files.open(transfer_id)
    with open(fd, "rb") as f:
        return await _send_file(request, f, stored.size_bytes, stored.mime_type, stored.checksum)


async def _send_file(
    request: web.Request, f: BinaryIO, size: int, mime_type: str, checksum: str
) -> web.StreamResponse:
    etag = strong_etag(checksum)
    headers = {
        "ETag": etag,
        "Accept-Ranges": "bytes",
        # A file is data for a master, never a page of the gateway's origin.
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox",
    }
    if_none_match = request.if_none_match
    if if_none_match is not None and any(t.value in ("*", etag[1:-1]) for t in if_none_match):
        return web.Response(status=304, headers=headers)
    if_range = request.headers.get("If-Range")
    wanted = byte_range(request.headers.get("Range"), size) if if_range in (None, etag) else True
    if wanted is False:
        refused = ApiError(416, "RANGE_NOT_SATISFIABLE", "the range is outside the file")
        answer = refused.response()
        answer.headers["Content-Range"] = f"bytes */{size}"
        return answer
    start, end = (0, size) if wanted is True else wanted
    response = web.StreamResponse(status=200 if wanted is True else 206, headers=headers)
    response.content_type = mime_type
    response.content_length = end - start
    if wanted is not True:
        response.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    await response.prepare(request)
    if request.method == "HEAD":  # the headers only: bytes after them would corrupt the connection
        await response.write_eof()
        return response
    loop = asyncio.get_running_loop()
    try:
        f.seek(start)
        left = end - start
        while left > 0:
            chunk = await loop.run_in_executor(None, f.read, min(_UPLOAD_CHUNK, left))
            if not chunk:
                break
            await response.write(chunk)
            left -= len(chunk)
        await response.write_eof()
    except ConnectionError:
        pass  # the master went away mid-download: nothing to answer
    return response


def add_file_routes(app: web.Application) -> None:
    app.router.add_put("/v1/session/{session_id}/files", put_file)
    app.router.add_get("/v1/session/{session_id}/files/{transfer_id}", get_file)


# --- the application ---------------------------------------------------------------------------


def create_app(
    config: Config, *, metrics: GatewayMetrics | None = None, heartbeat_sec: float = HEARTBEAT_SEC
) -> web.Application:
    app = web.Application(
        middlewares=[
            errors_middleware,
            fleet.forwarded_middleware(config.trusted_proxies),
            browser_guard_middleware(config),
            auth_middleware,
        ],
        client_max_size=config.max_request_bytes,
        handler_args=handler_args(config.header_timeout_sec),
    )
    app[CONFIG] = config
    app[HEARTBEAT] = heartbeat_sec
    app[METRICS] = metrics or GatewayMetrics(agents=config.agents.keys())
    app[SESSIONS] = {}
    if config.state_dir is not None:
        app[STATE] = StateDir(config.state_dir)
        app.on_startup.append(_restore_sessions)
        app.on_cleanup.append(_release_state_dir)
    # A users file that cannot be read stops the start (ValueError); later, SIGHUP reloads it.
    app[AUTH] = auth.Authenticator(config.token, config.auth)
    app[AUDIT] = AuditLog(
        config.auth.audit_log, max_bytes=config.auth.audit_max_bytes, keep=config.auth.audit_keep
    )
    app[NOTIFIER] = Notifier(config.webhooks, app[METRICS], public_url=config.public_url)
    app.on_startup.append(_start_reporting)
    app.on_cleanup.append(_stop_reporting)
    app[TICKETS] = console.TicketStore()
    app[GUARD] = ConnectionGuard(config.max_pending_connections)
    app[STATIC] = console.load_static()
    fleet.setup(app, config, on_drain=app[METRICS].draining)
    app.router.add_get("/", console_redirect)
    app.router.add_get("/ui", console_page)
    app.router.add_get("/ui/{name}", console_file)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", fleet.readyz)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/v1/agents", list_agents)
    app.router.add_get("/v1/agents/{agent}/conversations", list_conversations)
    app.router.add_post("/v1/session", create_session)
    app.router.add_get("/v1/sessions", list_sessions)
    app.router.add_get("/v1/whoami", whoami)
    app.router.add_get("/v1/session/{session_id}", get_session)
    app.router.add_patch("/v1/session/{session_id}", patch_session)
    app.router.add_delete("/v1/session/{session_id}", delete_session)
    app.router.add_post("/v1/session/{session_id}/ws-ticket", ws_ticket)
    app.router.add_get("/v1/session/{session_id}/ws", websocket, name=WS_ROUTE)
    add_file_routes(app)
    fleet.add_prefixed_routes(app, config.route_prefix)  # after every route: it copies them all
    app.on_shutdown.append(_shutdown_sessions)
    return app


def reload_users(app: web.Application) -> None:
    """SIGHUP: read the users file again. A WebSocket of a user the new file removed or gave
    another role is closed (1008): it was opened under the old one, and reconnecting takes the
    new one."""
    authenticator = app[AUTH]
    before = authenticator.users()
    if not authenticator.reload_users():
        return
    after = authenticator.users()
    changed = {name for name, identity in before.items() if after.get(name) != identity}
    if not changed:
        return
    for session in app[SESSIONS].values():
        if isinstance(session, LiveSession):
            session.close_users(changed, "your access to this gateway changed; reconnect")


async def _start_reporting(app: web.Application) -> None:
    app[AUDIT].start()
    await app[NOTIFIER].start()


async def _stop_reporting(app: web.Application) -> None:
    await app[NOTIFIER].close()
    await app[AUDIT].close()


async def _restore_sessions(app: web.Application) -> None:
    """Read back the sessions of the state directory; one that cannot be used is skipped with a
    log line and a metric, never a failed start."""
    config, metrics = app[CONFIG], app[METRICS]
    crashed: list[str] = []
    # One session at a time: only the one being restored has its log in memory.
    for got in app[STATE].load(max_buffer_bytes=config.max_buffer_bytes):
        if isinstance(got, LoadError):
            _restore_failed(metrics, got.session_id, got.reason, got.message)
            continue
        record = got.record
        if not record["clean"]:
            crashed.append(record["session_id"])
        profile = config.agents.get(record["agent"])
        if profile is None:
            got.saved.release()
            _restore_failed(
                metrics, record["session_id"], "agent", f"no agent profile {record['agent']!r}"
            )
            continue
        try:
            # The record is input like a request body (the agent can write the state directory):
            # the very check of POST /v1/session, symlinks followed.
            workspace = _resolve_workspace(config, record["workspace_path"])
        except ApiError as err:
            got.saved.release()
            _restore_failed(metrics, record["session_id"], "workspace", err.message)
            continue
        try:
            session = LiveSession.restore(
                got,
                profile,
                workspace,
                config=config,
                metrics=metrics,
                on_terminated=lambda s: _terminated(app, s),
            )
        except (KeyError, TypeError, ValueError) as err:
            got.saved.release()
            _restore_failed(metrics, record["session_id"], "corrupt", f"unusable record: {err}")
            continue
        _wire(app, session)
        app[SESSIONS][session.id] = session
        await session.start()
        metrics.session_restored()
        log.info(
            "session restored",
            extra={
                "session": session.id,
                "agent": profile.name,
                "turn_index": record["turn_index"],
            },
        )
    # The gateway before this one was killed: what its agents left running would go on beside
    # the agents the next prompts start, in the same workspaces.
    killed = process.kill_left_behind(crashed)
    if killed:
        log.warning("agent processes left by the previous gateway killed", extra={"count": killed})


async def _release_state_dir(app: web.Application) -> None:
    app[STATE].close()


def _restore_failed(metrics: GatewayMetrics, session_id: str, reason: str, message: str) -> None:
    metrics.session_restore_failed(reason)
    log.error(
        "saved session skipped: %s",
        message,
        extra={"session": session_id, "reason": reason},
    )


async def _shutdown_sessions(app: web.Application) -> None:
    live = [s for s in app[SESSIONS].values() if s.state != "TERMINATED"]
    if live:
        log.info("shutting down", extra={"sessions": len(live)})
        if STATE in app:  # they live on: suspended, read back at the next start
            ending = (s.suspend() for s in live)
        else:
            ending = (s.delete("error", "client") for s in live)
        await asyncio.gather(*ending, return_exceptions=True)
    await process.terminate_all()


def is_loopback(address: str | None) -> bool:
    """The peer is this machine: 127.0.0.0/8, ::1, or 127.x mapped into IPv6."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


class StartError(Exception):
    """The gateway cannot start as configured: one line for ``rawp-gateway serve`` to print."""


def check_bind(config: Config) -> None:
    """With no token the gateway serves loopback only (docs/http-api.md, Security)."""
    loopback = config.host in ("127.0.0.1", "localhost", "::1") or config.host.startswith("127.")
    if not config.authenticated and not loopback:
        raise StartError(
            f"refusing to listen on {config.host} without a token: give --token-file FILE (or "
            "set RAWP_GATEWAY_TOKEN, or [auth] users_file, [auth.oidc]) with --workspace-root "
            "DIR, which a token needs, or listen on 127.0.0.1"
        )


async def run(config: Config, *, ready: Callable[[int], None] | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then shut down gracefully; SIGHUP reloads the users file,
    SIGUSR1/SIGUSR2 begin/end a drain."""
    check_bind(config)
    # What the imports made lives as long as the process: out of the collector's sight, a full
    # collection no longer walks its ~40,000 objects (10 ms of the event loop each time). Done
    # before any session exists, whose cycles must stay collectable.
    gc.collect()
    gc.freeze()
    try:
        app = create_app(config)
    except ValueError as err:  # the users file
        raise SystemExit(f"rawp-gateway: {err}") from None
    runner = GatewayRunner(app, app[GUARD], handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as err:  # a name that does not resolve, a port in use: one line, no traceback
        await runner.cleanup()
        # aiohttp's strerror repeats the address; the errno's own words do not.
        why = os.strerror(err.errno) if err.errno else str(err)
        if err.errno == errno.EADDRINUSE:
            why = f"port {config.port} is in use (another gateway? --port 0 picks a free one)"
        raise StartError(f"cannot listen on {config.host}:{config.port}: {why}") from None
    port = runner.addresses[0][1] if runner.addresses else config.port
    log.info(
        "listening",
        extra={"host": config.host, "port": port, "workspace_root": str(config.workspace_root)},
    )
    if ready is not None:
        ready(port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload_users, app)
    # An operator drains the gateway before it is removed (docs/fleet.md): SIGUSR1 on, SIGUSR2 off.
    loop.add_signal_handler(signal.SIGUSR1, _set_draining, app, True)
    loop.add_signal_handler(signal.SIGUSR2, _set_draining, app, False)
    try:
        await stop.wait()
        # Not ready from now on (docs/fleet.md): the sessions are suspended while the gateway
        # still answers, so readiness, new sessions and reattaches get 503 SHUTTING_DOWN.
        fleet.begin_stopping(app)
        log.info("stopping")
        await _shutdown_sessions(app)
    finally:
        await runner.cleanup()


def serve(config: Config, *, ready: Callable[[int], None] | None = None) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        asyncio.run(run(config, ready=ready))
    else:
        uvloop.run(run(config, ready=ready))
