"""``GET /acp``: the gateway as an ACP agent toward masters, over a WebSocket (docs/acp-masters.md).

The upgrade is checked as every WebSocket's (Origin, credentials: ``Authorization`` or a one-time
``?ticket=`` from ``POST /v1/acp/ws-ticket``, the number of ACP connections) and answered with
``Acp-Connection-Id``. Then each text frame is one JSON-RPC message (gateway/protocol/acp_rpc.py
reads it), handled here in the order it came: ``initialize``, ``session/new`` (a session of the
caller's, created as ``POST /v1/session`` creates one), ``session/list`` (what ``GET /v1/sessions``
shows the caller), ``session/load``, ``session/prompt``, ``session/cancel``, ``session/set_mode``,
and the client's answers to ``session/request_permission``. What a session says goes out through
the client's views (gateway/session/acp_client.py, gateway/protocol/acp_master.py); a session
another gateway of the fleet holds is relayed to that gateway's ``/acp`` (acp_peer.py). A refusal is a
JSON-RPC error whose ``data.error_code`` is the gateway's; nothing a client sends ends in a 500 or a
traceback, and a session it is attached to goes on whatever the client does. The methods are
``AcpHandler``'s, whatever the transport: the Streamable HTTP one (acp_http.py) hands it the
messages of its POSTs as this WebSocket hands it its frames.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Final, TypeVar

import msgspec
from aiohttp import web

from gateway import __version__
from gateway.agent import mcp as agent_mcp
from gateway.agent.environment import agent_environment
from gateway.agent.sandbox import missing_command
from gateway.api_error import ApiError
from gateway.console.tickets import TICKET_TTL_SEC
from gateway.protocol import acp_rpc
from gateway.protocol.acp_master import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    PROTOCOL_VERSION,
    REFUSED,
    RESOURCE_NOT_FOUND,
    error_response,
    result_response,
)
from gateway.protocol.mcp_delivery import editor_servers
from gateway.protocol.mcp_servers import McpServerError, servers_from_wire
from gateway.server.acp_peer import PeerSockets
from gateway.server.keys import (
    CONFIG,
    GUARD,
    HEARTBEAT,
    SESSIONS,
    STREAMING,
    SUBPROTOCOL,
    TICKET,
    TICKETS,
)
from gateway.server.middleware import audit, caller
from gateway.server.routes.console import ticket_owner
from gateway.server.routes.sessions import (
    TerminatedSession,
    check_taking,
    resolve_workspace,
    role_on,
    start_session,
)
from gateway.server.websocket import check_upgrade_origin, read_socket
from gateway.session import LiveSession
from gateway.session.acp_client import MAX_ATTACHED, AcpAttachment, AcpClient
from gateway.session.fanout import WebSocketConnection
from gateway.team import fleet, roles
from parsers.acp import schema as S

__all__ = [
    "ACP_OPEN",
    "AcpHandler",
    "acp_ticket",
    "acp_websocket",
    "opening",
]

log = logging.getLogger("rawp_gateway.acp")

MAX_ACP_CONNECTIONS: Final = 256  # /acp connections (WebSocket or HTTP) open at once
MAX_PROMPT_BLOCKS: Final = 256
ACP_TICKETS: Final = "/acp"  # what a ticket of /acp is issued for (session ids are UUIDs)
T = TypeVar("T")
ACP_OPEN: Final = web.AppKey("acp_open", set[AcpClient])  # the client of each open /acp connection
_MODES: Final = (
    ("default", "Default", "Asks before it edits files or runs commands"),
    ("plan", "Plan", "Plans only: no edits, no commands"),
    ("review", "Review", "Reads and comments: no edits, no commands"),
)


async def acp_ticket(request: web.Request) -> web.Response:
    """``POST /v1/acp/ws-ticket``: a one-time ticket for an ``/acp`` upgrade (as ``ws-ticket``)."""
    ticket = request.app[TICKETS].issue(
        ACP_TICKETS, time.monotonic(), ticket_owner(request), caller(request)
    )
    if ticket is None:
        raise ApiError(429, "TOO_MANY_TICKETS", "too many unused WebSocket tickets; retry shortly")
    return web.json_response({"ticket": ticket, "expires_in": TICKET_TTL_SEC})


async def acp_websocket(request: web.Request) -> web.StreamResponse:
    app = request.app
    config = app[CONFIG]
    agent = opening(request)
    asked = request.headers.get("Sec-WebSocket-Protocol", "")
    if SUBPROTOCOL in (p.strip() for p in asked.split(",")):
        # A DPS master at the wrong door: upgraded, it would get JSON-RPC errors for its frames
        # (and aiohttp a warning that nothing it asked for is spoken here).
        why = (
            f"/acp speaks ACP (JSON-RPC, no subprotocol); a DPS master ({SUBPROTOCOL}) attaches "
            "to its session's ws_path"
        )
        raise ApiError(400, "BAD_REQUEST", why)
    conn_id = str(uuid.uuid4())
    ws = web.WebSocketResponse(
        max_msg_size=config.server.max_frame_size,
        heartbeat=app[HEARTBEAT],
        compress=False,
    )
    ws.headers["Acp-Connection-Id"] = conn_id
    open_clients = app[ACP_OPEN]
    with app[GUARD].upgrade(ACP_TICKETS, len(open_clients), MAX_ACP_CONNECTIONS) as place:
        if not place:
            raise ApiError(
                503, "TOO_MANY_CONNECTIONS", f"at most {MAX_ACP_CONNECTIONS} /acp connections"
            )
        if not ws.can_prepare(request).ok:
            raise ApiError(400, "BAD_REQUEST", "not a WebSocket upgrade request")
        ticket = request.get(TICKET)
        if ticket is not None and not app[TICKETS].spend(ticket):
            raise ApiError(401, "UNAUTHORIZED", "the WebSocket ticket was used already")
        await ws.prepare(request)
        request[STREAMING] = ws
        transport = request.transport
        if transport is None:  # the peer left during the handshake
            return ws
        out = WebSocketConnection(
            conn_id,
            ws,
            transport=transport,
            drain=request.writer.drain,
            role="acp",
            max_queue_bytes=config.server.send_queue_bytes,
            abort=transport.abort,
        )
        client = AcpClient(conn_id, out, roles.Sender(caller(request), request.remote))
        open_clients.add(client)
    handler = AcpHandler(request, client, agent)
    try:
        await read_socket(ws, out, handler.message)
    finally:
        open_clients.discard(client)
        if handler.peers is not None:
            await handler.peers.close()
        client.close()
        if not out.closed.is_set():
            await out.aclose()
    return ws


def opening(request: web.Request) -> str | None:
    """What every new ``/acp`` connection is checked for, whatever its transport (Origin, a
    gateway that takes connections, the ``?agent=`` it names); the agent it names."""
    config = request.app[CONFIG]
    check_upgrade_origin(request)
    check_taking(request.app, new_session=False)
    agent = request.query.get("agent")
    if agent is not None and agent not in config.agents:
        names = ", ".join(sorted(config.agents))
        raise ApiError(404, "AGENT_NOT_FOUND", f"no agent profile {agent[:64]!r}; known: {names}")
    return agent


class AcpHandler:
    """The JSON-RPC methods of one ``/acp`` connection, whatever its transport: the WebSocket here
    or Streamable HTTP (acp_http.py) hands it each message as it came (``message``), and what it
    answers goes out on the client's writer. ``request`` is the HTTP request the credentials
    came with: the upgrade, or the POST being handled."""

    def __init__(self, request: web.Request, client: AcpClient, agent: str | None) -> None:
        self.request = request
        self.app = request.app
        self.config = request.app[CONFIG]
        self.client = client
        self.agent = agent
        self.identity = caller(request)
        self.limit = acp_rpc.RateLimit(time.monotonic())
        self.init_params = b""  # the client's initialize params: a relay's initialize reuses them
        self.peers: PeerSockets | None = None  # sessions other gateways hold (acp_peer.py)
        self.data = ""  # the message being handled, as it came
        self.methods = {
            "initialize": self.initialize,
            "authenticate": self.authenticate,
            "session/new": self.new,
            "session/list": self.list,
            "session/load": self.load,
            "session/prompt": self.prompt,
            "session/cancel": self.cancel,
            "session/set_mode": self.set_mode,
        }

    def send(self, data: bytes) -> None:
        self.client.out.offer(data)

    async def message(self, data: str | None) -> None:
        if data is None:  # a binary message
            self.send(error_response(None, PARSE_ERROR, "binary messages are not JSON-RPC"))
            return
        got = acp_rpc.read(data)
        if isinstance(got, acp_rpc.Refused):
            self.send(got.response)
            return
        if got.method is None:
            if self.peers is None or not await self.relayed(got, data):
                self.answered(got)
            return
        if not self.limit.take(time.monotonic()):
            if self.limit.hopeless:
                self.client.out.close_after_flush(1008, "too many requests")
            elif got.is_request:
                self.send(
                    error_response(got.id, REFUSED, "too many requests; slow down", "RATE_LIMITED")
                )
            return
        if self.peers is not None and await self.relayed(got, data):
            return
        method = self.methods.get(got.method)
        if method is None:
            if got.is_request:  # an unknown notification (an extension's) is ignored
                why = f"method {got.method[:64]!r} is not supported"
                self.send(error_response(got.id, METHOD_NOT_FOUND, why, "METHOD_NOT_FOUND"))
            return
        self.data = data
        try:
            await method(got)
        except ApiError as err:
            code = (
                RESOURCE_NOT_FOUND
                if err.status == 404
                else (INVALID_PARAMS if err.status == 400 else REFUSED)
            )
            if got.is_request:
                self.send(error_response(got.id, code, err.message, err.error_code))
        except Exception:
            # A bug of ours in one request: logged with its trace here, answered without one,
            # and the connection and its sessions go on.
            log.exception("ACP request failed", extra={"method": got.method[:64]})
            if got.is_request:
                why = "internal error; see the gateway log"
                self.send(error_response(got.id, INTERNAL_ERROR, why, "INTERNAL_ERROR"))

    async def relayed(self, got: acp_rpc.Message, data: str) -> bool:
        """A message of a session another gateway holds goes there as it is (acp_peers.py)."""
        assert self.peers is not None
        where = self.peers.routes.client_message(got.id, got.method, got.params)
        if where is None:
            return False
        if isinstance(where, bytes):
            self.send(where)
        else:
            await self.peers.send(where, data)
        return True

    def held(self) -> int:
        """The sessions this connection holds: attached here, or relayed to their gateway."""
        return len(self.client.attached) + (len(self.peers.routes) if self.peers else 0)

    def answered(self, got: acp_rpc.Message) -> None:
        """The client's answer to a request of ours (a permission question)."""
        rpc_id = str(got.id)
        att = self.client.asker(rpc_id)
        if att is None:
            return
        data = att.view.answer(rpc_id, got.result)
        if data is not None:
            att.session.receive(att.id, data)

    # --- methods --------------------------------------------------------------------------------

    async def initialize(self, got: acp_rpc.Message) -> None:
        params = self.params(got, S.InitializeParams)
        if params is None:
            return
        self.init_params = got.params
        rawp = (params.clientCapabilities.meta or {}).get("rawp")
        self.client.turn_events = isinstance(rawp, dict) and rawp.get("turnEvents") is True
        # The kinds of MCP server the agent of this connection's sessions takes (stdio: every
        # ACP agent), when it is known now: ?agent= on the URL, else [acp] default_agent.
        profile = self.config.agents.get(self.agent or self.config.acp.default_agent or "")
        http = profile is not None and "http" in agent_mcp.kinds_of(profile)
        result = {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
                "mcpCapabilities": {"http": http, "sse": False},
                "sessionCapabilities": {"list": {}},
            },
            "agentInfo": {"name": "rawp-gateway", "title": "RAWP gateway", "version": __version__},
            "authMethods": [],
        }
        if self.config.server.route_prefix:  # a fleet: which gateway this is, and its own /acp
            result["_meta"] = {
                "rawp": {
                    "pod": self.config.server.pod_name,
                    "routePrefix": self.config.server.route_prefix,
                    "acpPath": self.config.server.route_prefix + "/acp",
                }
            }
        self.reply(got, result)

    async def authenticate(self, got: acp_rpc.Message) -> None:
        self.reply(got, {})  # the upgrade's credentials decide who the client is

    def params(self, got: acp_rpc.Message, kind: type[T]) -> T | None:
        """A request's params as ``kind``, or None once the client was told why not."""
        params = acp_rpc.params(got, kind)
        if isinstance(params, acp_rpc.Refused):
            if got.is_request:
                self.send(params.response)
            return None
        return params

    def reply(self, got: acp_rpc.Message, result: Any) -> None:
        if got.is_request:
            self.send(result_response(got.id, result))

    def refuse(self, got: acp_rpc.Message, code: int, message: str, error_code: str) -> None:
        if got.is_request:
            self.send(error_response(got.id, code, message, error_code))

    async def new(self, got: acp_rpc.Message) -> None:
        params = self.params(got, S.NewSessionParams)
        if params is None:
            return
        if not roles.at_least(self.identity.role, "operator"):
            audit(self.request, "session.create", None, result="refused",
                   detail={"needs": "operator", "has": self.identity.role})  # fmt: skip
            why = f"session/new needs role operator; {self.identity.user} has {self.identity.role}"
            self.refuse(got, REFUSED, why, "FORBIDDEN")
            return
        rawp = (params.meta or {}).get("rawp")
        asked = rawp.get("agent") if isinstance(rawp, dict) else None
        agent = self.agent or (asked if isinstance(asked, str) else None)
        agent = agent or self.config.acp.default_agent
        names = ", ".join(sorted(self.config.agents))
        if agent is None:
            why = f"name the agent: ?agent= on the URL, _meta.rawp.agent, or [acp] default_agent; known: {names}"
            self.refuse(got, INVALID_PARAMS, why, "AGENT_REQUIRED")
            return
        profile = self.config.agents.get(agent)
        if profile is None:
            why = f"no agent profile {agent[:64]!r}; known: {names}"
            self.refuse(got, RESOURCE_NOT_FOUND, why, "AGENT_NOT_FOUND")
            return
        if self.held() >= MAX_ATTACHED:
            why = f"one /acp connection holds at most {MAX_ATTACHED} sessions"
            self.refuse(got, REFUSED, why, "TOO_MANY_SESSIONS")
            return
        try:  # checked as a master's mcp_servers are, before anything is made
            editor = servers_from_wire(editor_servers(params.mcpServers), "editor")
        except McpServerError as err:
            self.refuse(got, INVALID_PARAMS, str(err), "INVALID_MCP_SERVERS")
            return
        workspace = resolve_workspace(self.config, params.cwd or None)
        missing = missing_command(
            self.config.isolation, profile.command[0], agent_environment(profile.env)
        )
        if missing is not None:
            raise ApiError(
                502, "AGENT_START_FAILED", f"the {agent} agent could not start: {missing}"
            )
        session = await start_session(self.request, profile, workspace, mcp_servers=editor)
        att = self.client.attach(session, hold=True)
        result = {"sessionId": session.id, "_meta": {"rawp": {"agent": agent}}}
        modes = _modes(session, att.view.mode)
        if modes is not None:
            result["modes"] = modes
        self.reply(got, result)
        att.release()

    async def list(self, got: acp_rpc.Message) -> None:
        params = self.params(got, S.ListSessionsParams)
        if params is None:
            return
        request = self.request
        visible = [s.to_json() for s in self.app[SESSIONS].values() if role_on(request, s)]
        answer = await fleet.sessions_answer(request, visible)
        sessions = []
        for s in answer["sessions"]:
            if params.cwd is not None and s.get("workspace_path") != params.cwd:
                continue
            meta = {k: s.get(k) for k in ("agent", "state", "owner", "pod", "turn_index")}
            meta["acpPath"] = _acp_path(s)
            sessions.append(
                {
                    "sessionId": s.get("session_id"),
                    "cwd": s.get("workspace_path"),
                    "title": s.get("name") or f"{s.get('agent')} session",
                    "updatedAt": s.get("created_at"),
                    "_meta": {"rawp": {k: v for k, v in meta.items() if v is not None}},
                }
            )
        self.reply(got, {"sessions": sessions})

    async def load(self, got: acp_rpc.Message) -> None:
        params = self.params(got, S.LoadSessionParams)
        if params is None:
            return
        session = self._visible(params.sessionId)
        if session is None:
            await self._load_elsewhere(got, params.sessionId)
            return
        if isinstance(session, TerminatedSession) or session.state == "TERMINATED":
            self.refuse(got, REFUSED, "the session has ended", "SESSION_TERMINATED")
            return
        if session.id not in self.client.attached and self.held() >= MAX_ATTACHED:
            why = f"one /acp connection holds at most {MAX_ATTACHED} sessions"
            self.refuse(got, REFUSED, why, "TOO_MANY_SESSIONS")
            return
        rawp = (params.meta or {}).get("rawp")
        since = rawp.get("lastMessageId") if isinstance(rawp, dict) else None
        if not isinstance(since, str) or not since or len(since) > 256:
            since = None
        att = self.client.attach(session, last_message_id=since, history=True)
        view = att.view
        meta = {
            "lastMessageId": view.last_seen,
            "turnId": view.turn_id,
            "lostFrames": view.lost_frames,
        }
        result: dict[str, Any] = {"_meta": {"rawp": meta}}
        modes = _modes(session, att.view.mode)
        if modes is not None:
            result["modes"] = modes
        self.reply(got, result)

    async def _load_elsewhere(self, got: acp_rpc.Message, session_id: str) -> None:
        """``session/load`` of a session this gateway does not hold: relayed to the gateway of
        the fleet that does, with the caller's own credentials (acp_peer.py)."""
        found, unreachable = await fleet.find_on_peers(self.request, session_id)
        if found is None:
            why = f"no session {session_id[:64]!r}"
            data: dict[str, Any] = {}
            if unreachable:  # it may be on one of them (a gateway restarting): worth a retry
                why += f"; {len(unreachable)} gateway(s) of the fleet did not answer: retry"
                data["unreachable"] = len(unreachable)
            if got.is_request:
                self.send(
                    error_response(got.id, RESOURCE_NOT_FOUND, why, "SESSION_NOT_FOUND", **data)
                )
            return
        pod = found.listed.get("pod")
        if self.held() >= MAX_ATTACHED:
            why = f"one /acp connection holds at most {MAX_ATTACHED} sessions"
            self.refuse(got, REFUSED, why, "TOO_MANY_SESSIONS")
            return
        if self.peers is None:
            self.peers = PeerSockets(fleet.peer_ws_http(self.app), self.client.out, self.client.id)
        headers = {"X-Forwarded-For": self.request.remote} if self.request.remote else {}
        authorization = self.request.headers.get("Authorization")
        if authorization:
            headers["Authorization"] = authorization
        url = found.url.rstrip("/") + "/acp"
        failed = await self.peers.open(session_id, url, headers, self.init_params)
        if failed is not None:
            why = f"session {session_id[:64]!r} is on {pod}, and {failed}: load it there"
            data = {"pod": pod, "acpPath": _acp_path(found.listed)}
            if got.is_request:
                self.send(error_response(got.id, REFUSED, why, "SESSION_ON_OTHER_POD", **data))
            return
        self.peers.routes.add(session_id, got.id)
        await self.peers.send(session_id, self.data)

    def _visible(self, session_id: str) -> LiveSession | TerminatedSession | None:
        session = self.app[SESSIONS].get(session_id)
        if session is None or role_on(self.request, session) is None:
            return None
        return session  # type: ignore[no-any-return]

    def _attached(self, got: acp_rpc.Message, session_id: str) -> AcpAttachment | None:
        att = self.client.attached.get(session_id)
        if att is None:
            why = f"session {session_id[:64]!r} is not open on this connection: session/load it"
            self.refuse(got, RESOURCE_NOT_FOUND, why, "SESSION_NOT_FOUND")
        return att

    async def prompt(self, got: acp_rpc.Message) -> None:
        params = self.params(got, S.PromptParams)
        if params is None:
            return
        att = self._attached(got, params.sessionId)
        if att is None or got.id is None:
            return
        if len(params.prompt) > MAX_PROMPT_BLOCKS:
            why = f"a prompt has at most {MAX_PROMPT_BLOCKS} content blocks"
            self.refuse(got, INVALID_PARAMS, why, "INVALID_REQUEST")
            return
        text = _prompt_text(params.prompt)
        if isinstance(text, _Unsupported):
            self.refuse(got, INVALID_PARAMS, text.why, "UNSUPPORTED_CONTENT")
            return
        self.feed(att, *att.view.prompt(got.id, text))

    def feed(self, att: AcpAttachment, mid: str, data: bytes) -> None:
        """A control frame of this client's into its session, as a DPS master's frame goes;
        the request it came from is answered then if the session's reply did not answer it."""
        att.session.receive(att.id, data)
        for message in att.view.settle(mid):
            self.send(message)

    async def cancel(self, got: acp_rpc.Message) -> None:
        params = self.params(got, S.SessionParams)
        if params is None:
            return
        att = self.client.attached.get(params.sessionId)
        if att is None:
            return
        data = att.view.cancel()
        if data is not None:
            att.session.receive(att.id, data)

    async def set_mode(self, got: acp_rpc.Message) -> None:
        params = self.params(got, S.SessionParams)
        if params is None:
            return
        att = self._attached(got, params.sessionId)
        if att is None or got.id is None:
            return
        if params.modeId not in ("default", "plan", "review"):
            why = "modeId must be default, plan or review"
            self.refuse(got, INVALID_PARAMS, why, "INVALID_REQUEST")
            return
        self.feed(att, *att.view.set_mode(got.id, params.modeId))  # type: ignore[arg-type]


class _Unsupported(msgspec.Struct):
    why: str


def _prompt_text(blocks: list[S.ContentBlock]) -> str | _Unsupported:
    """What a prompt's content blocks say, as the text a DPS prompt carries: text as it is, a
    resource link as its Markdown link, an embedded resource's text in a fence named by its URI."""
    parts: list[str] = []
    for block in blocks:
        if block.type == "text" and block.text is not None:
            parts.append(block.text)
        elif block.type == "resource_link" and block.uri:
            parts.append(f"[{block.name or block.uri}]({block.uri})")
        elif block.type == "resource" and isinstance(block.resource, dict):
            text = block.resource.get("text")
            uri = block.resource.get("uri", "")
            if not isinstance(text, str):
                return _Unsupported("only text resources can be embedded in a prompt")
            parts.append(f"```{uri}\n{text}\n```")
        else:
            return _Unsupported(f"content of type {block.type[:32]!r} is not accepted in a prompt")
    return "\n".join(parts)


def _acp_path(listed: dict[str, Any]) -> str | None:
    """The ``/acp`` path of the gateway that holds a listed session: its ``ws_path`` says its
    route prefix (``{prefix}/v1/session/{id}/ws``)."""
    ws_path = listed.get("ws_path")
    if not isinstance(ws_path, str):
        return None
    prefix, found, _ = ws_path.rpartition("/v1/session/")
    return prefix + "/acp" if found else None


def _modes(session: LiveSession, current: str) -> dict[str, Any] | None:
    if not session.machine.config.features.plan_mode:
        return None
    mode = session.machine.mode or current
    return {
        "currentModeId": mode,
        "availableModes": [
            {"id": mid, "name": name, "description": what} for mid, name, what in _MODES
        ],
    }
