"""The HTTP control plane of one gateway (``docs/http-api.md``), and the WebSocket it opens.

``GatewayClient`` speaks ``POST /v1/session`` (create), ``GET`` and ``DELETE /v1/session/{id}``,
``GET /v1/agents``, the session's files (``upload_file``, ``download_file``; ``docs/files.md``),
with ``Authorization: Bearer <token>`` when a token is given; ``attach`` opens a ``Connection``.
A 4xx/5xx answer (or a refused WebSocket upgrade) raises ``GatewayError`` carrying the gateway's
``error_code``; transport failures stay aiohttp's own exceptions.
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO, Final
from urllib.parse import quote, urlencode

import aiohttp

from gateway.client.websocket import DEFAULT_MAX_MESSAGE, SUBPROTOCOL, Connection
from gateway.local_token import local_token
from gateway.protocol import frames as F
from gateway.protocol.capabilities import ALL_FEATURES, SUPPORTED_NAMESPACES

DEFAULT_HTTP_TIMEOUT_SEC: Final = 30.0

# docs/http-api.md's error codes for the refusals a WebSocket upgrade can meet.
_HANDSHAKE_CODES: Final = {
    400: "SUBPROTOCOL_REQUIRED",
    401: "UNAUTHORIZED",
    404: "SESSION_NOT_FOUND",
}


class GatewayError(Exception):
    """The gateway answered an HTTP request with an error (its fault or our request's, per code)."""

    def __init__(self, status: int, error_code: str, message: str) -> None:
        super().__init__(f"{error_code}: {message} (HTTP {status})")
        self.status = status
        self.error_code = error_code
        self.message = message


def master_capabilities(features: F.Features = ALL_FEATURES) -> F.Capabilities:
    """Our ``session.capabilities`` payload: a master announcing ``features`` (DPS-12.2-caps)."""
    return F.Capabilities(
        protocol_version=F.PROTOCOL_VERSION,
        supported_namespaces=list(SUPPORTED_NAMESPACES),
        features=features,
    )


def read_token(token_file: str | None, url: str | None = None) -> str | None:
    """The bearer token every client command (``chat``, ``acp``) sends as ``Authorization:
    Bearer``, the first of: ``--token-file``, ``$RAWP_GATEWAY_TOKEN``, and for a loopback ``url``
    the token a gateway made on that port (gateway/local_token.py); else none."""
    if token_file:
        with open(token_file, encoding="utf-8") as f:
            return f.read().strip() or None
    return os.environ.get("RAWP_GATEWAY_TOKEN") or (local_token(url) if url else None)


MAX_SESSION_PATHS: Final = 1024  # session paths a client remembers (GatewayClient._paths)


class GatewayClient:
    """HTTP control plane of one gateway; ``attach`` opens a ``Connection`` to a session.

    Use as ``async with GatewayClient(url, token=...) as client:``; it owns its aiohttp session
    unless one is passed in. ``url`` may be a fleet's router (docs/fleet.md): a session's calls
    then go to the path its ``ws_path`` gives (``/pods/<pod>/v1/session/<id>``), remembered from
    the session objects this client saw. With no ``token``, a loopback ``url``'s gateway is sent
    the token it made, when its user's file holds one (gateway/local_token.py): a client on the
    gateway's own machine needs nothing more, as ``chat`` does not.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        http: aiohttp.ClientSession | None = None,
        timeout_sec: float = DEFAULT_HTTP_TIMEOUT_SEC,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        token = token or local_token(self.base_url)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = http
        self._owns_http = http is None
        self._timeout = aiohttp.ClientTimeout(total=timeout_sec)
        self._paths: dict[str, str] = {}  # session id -> its path, from the session's ws_path

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None and self._owns_http:
            await self._http.close()
        self._http = None

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            # Created lazily so that constructing a client needs no running loop.
            self._http = aiohttp.ClientSession(timeout=self._timeout)
            self._owns_http = True
        return self._http

    def _remember(self, session: Any) -> Any:
        """Notes where a session object says the session lives; returns it."""
        if isinstance(session, dict):
            sid, ws_path = session.get("session_id"), session.get("ws_path")
            if isinstance(sid, str) and isinstance(ws_path, str) and ws_path.endswith("/ws"):
                self._paths.pop(sid, None)
                self._paths[sid] = ws_path[: -len("/ws")]
                if len(self._paths) > MAX_SESSION_PATHS:
                    del self._paths[next(iter(self._paths))]
        return session

    def session_path(self, session_id: str) -> str:
        """The path of a session's endpoints: under its gateway's route prefix when known."""
        return self._paths.get(session_id, f"/v1/session/{session_id}")

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        async with self.http.request(
            method, self.base_url + path, json=body, headers=self._headers
        ) as resp:
            return await _answer(resp)

    async def agents(self) -> list[dict[str, Any]]:
        """``GET /v1/agents``: the configured agent profiles."""
        data = await self._request("GET", "/v1/agents")
        if isinstance(data, dict):
            data = data.get("agents", [])
        return list(data or [])

    async def create_session(
        self,
        agent: str,
        *,
        workspace_path: str | None = None,
        name: str | None = None,
        origin: str | None = None,
        reattach_window_sec: int | None = None,
        resume_conversation: str | None = None,
    ) -> dict[str, Any]:
        """``POST /v1/session``: a new Agent Session; returns the session object. With
        ``resume_conversation`` it continues that conversation the agent saved."""
        body: dict[str, Any] = {"agent": agent}
        optional = {
            "workspace_path": workspace_path,
            "name": name,
            "origin": origin,
            "reattach_window_sec": reattach_window_sec,
            "resume_conversation": resume_conversation,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        return self._remember(await self._request("POST", "/v1/session", body))

    async def whoami(self) -> dict[str, Any]:
        """``GET /v1/whoami``: ``{"user", "role"}`` of this client's credentials."""
        return await self._request("GET", "/v1/whoami")

    async def conversations(
        self, agent: str, *, workspace_path: str | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        """``GET /v1/agents/{agent}/conversations``: the conversations the agent saved for the
        workspace, newest first: ``{"conversations": [{id, title, updated_at, turns}], "complete"}``."""
        query = {"workspace": workspace_path, "limit": limit}
        params = urlencode({k: v for k, v in query.items() if v is not None})
        path = f"/v1/agents/{quote(agent, safe='')}/conversations"
        return await self._request("GET", f"{path}?{params}" if params else path)

    async def get_session(self, session_id: str) -> dict[str, Any]:
        return self._remember(await self._request("GET", self.session_path(session_id)))

    async def delete_session(self, session_id: str) -> dict[str, Any]:
        """``DELETE /v1/session/{id}``: ends the session (the gateway sends the cleanup frames)."""
        return await self._request("DELETE", self.session_path(session_id))

    async def upload_file(
        self, session_id: str, name: str, data: bytes | BinaryIO, mime_type: str
    ) -> dict[str, Any]:
        """``PUT /v1/session/{id}/files?name=``: store a file in the session (``data`` is streamed
        when it is a file object); returns ``{transfer_id, file_url, ...}`` for a prompt's
        ``context_files``."""
        async with self.http.put(
            f"{self.base_url}{self.session_path(session_id)}/files",
            params={"name": name},
            data=data,
            headers={**self._headers, "Content-Type": mime_type},
        ) as resp:
            return await _answer(resp)

    def file_location(self, file_url: str) -> str:
        """Where to GET a file: an ``agent.file.transfer``'s ``file_url`` (a path on this gateway
        or already a full URL) as a full URL."""
        return file_url if "://" in file_url else self.base_url + file_url

    async def download_file(self, file_url: str) -> bytes:
        """The bytes of a session's file (an ``agent.file.transfer``'s ``file_url``)."""
        async with self.http.get(self.file_location(file_url), headers=self._headers) as resp:
            if resp.status >= 400:
                await _answer(resp)
            return await resp.read()

    async def attach(
        self,
        session: str | dict[str, Any],
        *,
        last_message_id: str | None = None,
        full_history: bool = False,
        features: F.Features = ALL_FEATURES,
        max_msg_size: int = DEFAULT_MAX_MESSAGE,
        heartbeat_sec: float | None = 30.0,
    ) -> Connection:
        """Open the session's WebSocket and announce our capabilities.

        ``session`` is a session object (its ``ws_path`` is used) or a session id. With
        ``last_message_id`` this is a reattach: the gateway sends ``session.history`` first. With
        ``full_history`` (a first attach to a session that already ran, ``?history=all``) that
        ``session.history`` holds everything the gateway's buffer has, ``truncated`` only if some
        of it is gone.
        """
        if last_message_id and full_history:
            raise ValueError("a reattach (last_message_id) already gets its history")
        if isinstance(session, dict):
            session_id = str(self._remember(session)["session_id"])
        else:
            session_id = session
        ws_path = f"{self.session_path(session_id)}/ws"
        params = None
        if last_message_id:
            params = {"last_message_id": last_message_id}
        elif full_history:
            params = {"history": "all"}
        try:
            ws = await self.http.ws_connect(
                self.base_url + ws_path,
                protocols=(SUBPROTOCOL,),
                headers=self._headers,
                params=params,
                max_msg_size=max_msg_size,
                heartbeat=heartbeat_sec,
            )
        except aiohttp.WSServerHandshakeError as err:
            # aiohttp keeps the refusal's status but not its JSON body: name the error by status,
            # so callers can tell "gone" or "not allowed" (stop) from a passing failure (retry).
            code = _HANDSHAKE_CODES.get(err.status, "HANDSHAKE_FAILED")
            raise GatewayError(
                err.status, code, f"WebSocket upgrade refused: {err.message}"
            ) from err
        if ws.protocol != SUBPROTOCOL:
            # A peer that did not select rawp-dps-1.0 speaks something else (DPS-1.3-legacy).
            await ws.close()
            raise GatewayError(400, "SUBPROTOCOL_REQUIRED", f"server selected {ws.protocol!r}")
        conn = Connection(ws, session_id, last_message_id=last_message_id)
        await conn.send(master_capabilities(features))
        return conn


async def _answer(resp: aiohttp.ClientResponse) -> Any:
    """A JSON answer, or ``GatewayError`` with the gateway's ``error_code`` for a 4xx/5xx."""
    try:
        data = await resp.json(content_type=None)
    except ValueError:
        data = None
    if resp.status >= 400:
        code, message = "HTTP_ERROR", resp.reason or ""
        if isinstance(data, dict):
            code = str(data.get("error_code", code))
            message = str(data.get("message", message))
        raise GatewayError(resp.status, code, message)
    return data
