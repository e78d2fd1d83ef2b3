"""A master-side client for rawp-gateway: the control plane, the WebSocket, and a sans-IO view.

Theory of operation
-------------------
Three layers, each usable alone:

* ``GatewayClient`` speaks the HTTP control plane of ``docs/http-api.md``:
  ``POST /v1/session`` (create), ``GET`` and ``DELETE /v1/session/{id}``, ``GET /v1/agents``, the
  session's files (``upload_file``, ``download_file``; ``docs/files.md``), with
  ``Authorization: Bearer <token>`` when a token is given. A 4xx/5xx answer (or a refused
  WebSocket upgrade) raises ``GatewayError`` carrying the gateway's ``error_code``; transport
  failures stay aiohttp's own exceptions.

* ``Connection`` is one WebSocket on ``ws_path`` with subprotocol ``rawp-dps-1.0``. Right after the
  upgrade it sends our ``session.capabilities`` announcing every feature (``ALL_FEATURES``): a
  terminal can render anything, and the gateway filters what a master did not announce
  (DPS-12.2-filter), so announcing less would only hide things. ``receive()`` returns typed frames
  (``gateway.protocol.frames``) decoded by the codec; unknown types are logged and skipped
  (DPS-2.2-unknown-type), a frame of another envelope version is answered with ``session.error``
  (DPS-2.1-v), duplicates are dropped (DPS-2.1-idempotent); a ``session.history`` the gateway
  split to fit its ``max_frame_size`` is returned once, joined. ``last_message_id`` names the newest
  frame received that the gateway's replay buffer surely holds (a ``session.history`` moves it to
  the history's ``last_message_id``), so that ``GatewayClient.attach(...,
  last_message_id=conn.last_message_id)`` reattaches where this connection stopped.

* ``MasterView`` is the master's picture of a session and the master-side rules of §7.8, with no
  I/O at all: fed frames (received, or sent by us), it tracks open text/thinking blocks, open tool
  calls, the open turn, pending interactions and the agent state. ``finalize()`` (the socket closed
  or failed) closes everything locally and returns the synthetic frames it made, each with
  ``metadata.synthetic: true`` (DPS-7.8-finalize). ``history(payload)`` (after a reattach) removes
  those synthetic frames, restores what was open and replays the history ordered by ``timestamp``
  then ``message_id`` (DPS-2.3-history-order, DPS-7.8-unfinalize), except when the buffer was
  truncated or the history holds ``session.deleted``: then the finalisation stands. Because that
  order shuffles frames of one millisecond (message ids are random), an opening frame never
  reopens what a frame of the same or a later timestamp already closed.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Final, Literal, cast
from urllib.parse import quote, urlencode

import aiohttp
import msgspec

from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.capabilities import ALL_FEATURES, SUPPORTED_NAMESPACES
from gateway.protocol.factory import FrameFactory

__all__ = [
    "SUBPROTOCOL",
    "SYNTHETIC_OUTPUT",
    "Connection",
    "GatewayClient",
    "GatewayError",
    "HistoryOutcome",
    "MasterView",
    "decode_history",
    "history_order",
    "is_synthetic",
    "master_capabilities",
    "payload_of",
]

log = logging.getLogger(__name__)

SUBPROTOCOL: Final = "rawp-dps-1.0"
SYNTHETIC_OUTPUT: Final = "Connection lost"  # §7.8.1: the output of a synthesised cancelled result
DISCONNECTED: Final = "disconnected"  # §7.8.1: the stop_reason of a turn ended by finalisation
# The gateway's frames fit the max_frame_size it announces (1 MiB by default; a long history comes
# in several session.history parts): a margin for gateways configured larger.
DEFAULT_MAX_MESSAGE: Final = 16 * 1024 * 1024
DEFAULT_HTTP_TIMEOUT_S: Final = 30.0

# docs/http-api.md's error codes for the refusals a WebSocket upgrade can meet.
_HANDSHAKE_CODES: Final = {
    400: "SUBPROTOCOL_REQUIRED",
    401: "UNAUTHORIZED",
    404: "SESSION_NOT_FOUND",
}

# Frames a gateway may send to one connection only, outside its replay buffer.
_MAYBE_UNBUFFERED: Final = frozenset(
    {
        "session.capabilities",
        "session.history",
        "session.error",
        "tool.catalog.publish",
        "agent.commands.publish",
    }
)

InputType = Literal["text", "slash_command", "continuation", "piped_stdin"]
CancelReason = Literal["user_cancelled", "timeout", "quota_exceeded"]


# --------------------------------------------------------------------------- control plane


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


MAX_SESSION_PATHS: Final = 1024  # session paths a client remembers (GatewayClient._paths)


class GatewayClient:
    """HTTP control plane of one gateway; ``attach`` opens a ``Connection`` to a session.

    Use as ``async with GatewayClient(url, token=...) as client:``; it owns its aiohttp session
    unless one is passed in. ``url`` may be a fleet's router (docs/fleet.md): a session's calls
    then go to the path its ``ws_path`` gives (``/pods/<pod>/v1/session/<id>``), remembered from
    the session objects this client saw.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        http: aiohttp.ClientSession | None = None,
        timeout_s: float = DEFAULT_HTTP_TIMEOUT_S,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = http
        self._owns_http = http is None
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
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
        heartbeat_s: float | None = 30.0,
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
                heartbeat=heartbeat_s,
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


# --------------------------------------------------------------------------- WebSocket


class Connection:
    """One attached WebSocket: send control payloads, receive typed frames."""

    def __init__(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        session_id: str,
        *,
        last_message_id: str | None = None,
        factory: FrameFactory | None = None,
        seen_capacity: int = 4096,
    ) -> None:
        self.ws = ws
        self.session_id = session_id
        self.factory = factory or FrameFactory(session_id)
        self.last_message_id = last_message_id
        self.server_capabilities: F.Capabilities | None = None
        self._seen = codec.SeenWindow(seen_capacity)
        self._mark: _dt.datetime | None = None  # timestamp of last_message_id's frame
        self._history_parts: list[msgspec.Raw] | None = None  # a split history being joined

    @property
    def closed(self) -> bool:
        return self.ws.closed

    async def close(self) -> None:
        await self.ws.close()

    async def send(
        self,
        payload: F.Payload,
        *,
        turn_id: str | None = None,
        parent_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> F.Frame:
        """Send one frame carrying ``payload``; returns the frame (for ``MasterView.apply``)."""
        frame = self.factory.frame(payload, turn_id=turn_id, parent_id=parent_id, metadata=metadata)
        await self.send_frame(frame)
        return frame

    async def send_frame(self, frame: F.Frame) -> None:
        """Send a frame built beforehand (``self.factory.frame(...)``), when its id must be known
        before an answer to it can arrive."""
        # Text messages, one envelope each (docs/http-api.md: frames are text, never batched).
        await self.ws.send_str(codec.encode(frame).decode())

    # The §6 controls, spelled out so callers need not build payloads.

    async def prompt(
        self,
        text: str,
        *,
        input_type: InputType = "text",
        context_files: list[F.ContextFile] | None = None,
    ) -> F.Frame:
        payload = F.PromptRequest(
            prompt_text=text, input_type=input_type, context_files=context_files or None
        )
        return await self.send(payload)

    async def cancel(self, turn_id: str, *, reason: CancelReason = "user_cancelled") -> F.Frame:
        payload = F.PromptCancel(target_turn_id=turn_id, reason=reason)
        return await self.send(payload, turn_id=turn_id)

    async def answer(
        self,
        interaction_id: str,
        selected_value: str | list[str],
        *,
        text_input: str | None = None,
        turn_id: str | None = None,
    ) -> F.Frame:
        payload = F.InteractionResponse(
            interaction_id=interaction_id, selected_value=selected_value, text_input=text_input
        )
        return await self.send(payload, turn_id=turn_id)

    async def interaction_timeout(
        self, interaction_id: str, *, turn_id: str | None = None
    ) -> F.Frame:
        return await self.send(F.InteractionTimeout(interaction_id=interaction_id), turn_id=turn_id)

    async def switch_mode(self, mode: F.Mode) -> F.Frame:
        return await self.send(F.ModeSwitch(mode=mode))

    async def compact(self, instruction: str | None = None) -> F.Frame:
        return await self.send(F.SessionCompact(instruction=instruction or None))

    async def receive(self) -> F.Frame | None:
        """The next frame, or ``None`` once the WebSocket is closed (or failed)."""
        while True:
            msg = await self.ws.receive()
            if msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                frame = await self._accept(msg.data)
                if frame is not None:
                    return frame
                continue
            if msg.type in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSING,
                aiohttp.WSMsgType.CLOSED,
                aiohttp.WSMsgType.ERROR,
            ):
                return None
            # PING/PONG are answered by aiohttp itself; nothing else is expected.

    async def __aiter__(self) -> AsyncIterator[F.Frame]:
        while (frame := await self.receive()) is not None:
            yield frame

    async def _accept(self, data: str | bytes) -> F.Frame | None:
        result = codec.decode(data)
        if isinstance(result, codec.Ignored):
            log.info("ignoring frame of unknown type %s", result.frame_type)
            self.last_message_id = result.message_id  # an x-* frame is a broadcast, buffered
            return None
        if isinstance(result, codec.Rejected):
            log.warning("gateway sent an invalid frame: %s", result.error.message)
            if result.error.error_code == codec.UNSUPPORTED_VERSION:
                # DPS-2.1-v binds every receiver: ignore and answer with session.error.
                await self.send(result.error, parent_id=result.message_id)
            return None
        frame = result.frame
        if not self._seen.first_time(frame.message_id):
            return None
        payload = payload_of(frame)
        if isinstance(payload, F.Capabilities):
            self.server_capabilities = payload
        if isinstance(payload, F.History):
            joined = self._join_history(frame, payload)
            if joined is None:
                return None  # more parts to come
            frame, payload = joined, payload_of(joined)
            assert isinstance(payload, F.History)
            # What the gateway says we are now in sync with, even if the frames were cut.
            if payload.last_message_id:
                self.last_message_id = payload.last_message_id
                self._mark = _timestamp_key(payload.last_sync_timestamp)
        else:
            self._advance(frame)
        return frame

    def _join_history(self, frame: F.Frame, payload: F.History) -> F.Frame | None:
        """A history the gateway split to fit its ``max_frame_size`` (``metadata.history_part``
        of ``history_parts``, docs/protocol-notes.md) comes back as one ``session.history``: the
        parts' frames in order, the last part's ids and status. None until the last part."""
        meta = frame.metadata or {}
        part, parts = meta.get("history_part"), meta.get("history_parts")
        if not (isinstance(part, int) and isinstance(parts, int) and parts > 1):
            return frame
        if part == 1 or self._history_parts is None:
            self._history_parts = []
        self._history_parts += payload.frames
        if part < parts:
            return None
        whole = msgspec.structs.replace(payload, frames=self._history_parts)
        self._history_parts = None
        return msgspec.structs.replace(frame, payload=whole)  # type: ignore[type-var]

    def _advance(self, frame: F.Frame) -> None:
        """Move ``last_message_id`` to ``frame`` if the gateway's buffer surely holds it.

        Reattaching after an id the buffer does not know makes the gateway call the history
        truncated, which keeps the finalisation (DPS-7.8-unfinalize); reattaching after an older
        id only replays frames we drop as duplicates. So when in doubt the mark stays: frames a
        gateway may send to one connection only (the greeting of an attach, answers to our own
        frames) and frames older than the mark (the greeting re-sends the latest catalog,
        commands and pending questions) do not move it.
        """
        if frame.TYPE in _MAYBE_UNBUFFERED:
            return
        at = _timestamp_key(frame.timestamp)
        if self._mark is not None and at < self._mark:
            return
        self.last_message_id, self._mark = frame.message_id, at


# --------------------------------------------------------------------------- the master's view


def payload_of(frame: F.Frame) -> F.Payload:
    """A frame's payload: every concrete frame class has one, the ``Frame`` base declares none."""
    return frame.payload


def is_synthetic(frame: F.Frame) -> bool:
    """True for a frame this master made up locally during finalisation (§7.8.1)."""
    return bool(frame.metadata and frame.metadata.get("synthetic") is True)


def _timestamp_key(ts: str) -> _dt.datetime:
    try:
        t = _dt.datetime.fromisoformat(ts)
    except ValueError:
        return _dt.datetime.max.replace(tzinfo=_dt.UTC)  # unparseable: after everything else
    # A timestamp without an offset is taken as UTC, so naive and aware ones compare.
    return t if t.tzinfo else t.replace(tzinfo=_dt.UTC)


def history_order(frames: Iterable[F.Frame]) -> list[F.Frame]:
    """``frames`` ordered by ``timestamp``, then ``message_id`` (DPS-2.3-history-order).

    Timestamps are compared as instants, not strings, so ``+09:00`` and ``Z`` forms interleave
    correctly; ``message_id`` breaks ties between frames of the same millisecond.
    """
    return sorted(frames, key=lambda f: (_timestamp_key(f.timestamp), f.message_id))


def decode_history(payload: F.History) -> list[F.Frame]:
    """The frames embedded in a ``session.history``, decoded; invalid and unknown ones skipped."""
    out: list[F.Frame] = []
    for raw in payload.frames:
        result = codec.decode(bytes(raw))
        if isinstance(result, codec.Accepted):
            out.append(result.frame)
        else:
            log.info("skipping a history frame: %s", result)
    return out


# (turn_id, parent_invocation_id of a subagent or None, content_index): content indexes count
# per turn, and a subagent's blocks are its own.
_BlockKey = tuple[str | None, str | None, int]


def _block_key(frame: F.Frame, content_index: int) -> _BlockKey:
    ctx = (frame.metadata or {}).get("subagent_context")
    parent = ctx.get("parent_invocation_id") if isinstance(ctx, dict) else None
    return (frame.turn_id, parent, content_index)


@dataclass
class _Open:
    """Everything that is open at a moment: what finalisation closes and unfinalisation reopens."""

    text: dict[_BlockKey, tuple[F.Frame, list[str]]] = field(default_factory=dict)
    thinking: dict[_BlockKey, tuple[F.Frame, list[str]]] = field(default_factory=dict)
    calls: dict[str, F.Frame] = field(default_factory=dict)  # invocation_id -> request frame
    interactions: dict[str, F.Frame] = field(default_factory=dict)  # interaction_id -> request
    turn: F.Frame | None = None  # the session.turn.start of the open turn
    agent_state: str = "idle"

    def merge(self, other: _Open) -> None:
        self.text.update(other.text)
        self.thinking.update(other.thinking)
        self.calls.update(other.calls)
        self.interactions.update(other.interactions)
        self.turn = other.turn or self.turn
        if other.agent_state != "idle":
            self.agent_state = other.agent_state


@dataclass(frozen=True, slots=True)
class HistoryOutcome:
    """What ``MasterView.history`` did.

    ``unfinalized`` is False when the finalisation stands (``reason`` ``"truncated"`` or
    ``"deleted"``); ``frames`` is the history in replay order either way, for display;
    ``applied`` are those that changed the view (duplicates of frames already seen are not).
    """

    unfinalized: bool
    reason: str | None
    frames: list[F.Frame]
    applied: list[F.Frame]
    lost_frame_count: int | None = None


class MasterView:
    """A master's state of one session, and the §7.8 finalisation rules. Sans-IO.

    ``apply(frame)`` for every frame received or sent; ``finalize()`` when the socket closes or
    fails; ``history(payload)`` when a reattach brings ``session.history``. ``transcript`` is every
    applied frame in order, synthetic ones included until unfinalisation removes them.
    """

    def __init__(self, session_id: str, *, factory: FrameFactory | None = None) -> None:
        self.session_id = session_id
        self.factory = factory or FrameFactory(session_id)
        self.transcript: list[F.Frame] = []
        self.mode: str | None = None
        self.deleted: F.Deleted | None = None
        self.last_usage: F.Usage | None = None
        self._open = _Open()
        self._finalized: _Open | None = None  # what finalisation closed, until unfinalisation
        self._seen = codec.SeenWindow(65536)
        # What real frames closed, and when (bounded: only recent closures can be out of order).
        self._closed: OrderedDict[tuple[Any, ...], _dt.datetime] = OrderedDict()
        self._closed_capacity = 4096

    # -- what is open, for a UI

    @property
    def turn_id(self) -> str | None:
        turn = self._open.turn
        if turn is None:
            return None
        start = payload_of(turn)
        assert isinstance(start, F.TurnStart)
        return start.turn_id

    @property
    def agent_state(self) -> str:
        return self._open.agent_state

    @property
    def open_calls(self) -> list[str]:
        return list(self._open.calls)

    @property
    def pending_interactions(self) -> list[F.Frame]:
        return list(self._open.interactions.values())

    @property
    def open_blocks(self) -> int:
        return len(self._open.text) + len(self._open.thinking)

    @property
    def finalized(self) -> bool:
        return self._finalized is not None

    # -- transitions

    def apply(self, frame: F.Frame) -> bool:
        """Take one frame into the view. False (and no change) for a frame applied before.

        Opening frames (a delta, a tool request, a question, a turn start) never reopen what a
        frame with the same or a later timestamp already closed. In order that cannot happen;
        in a history replayed by timestamp then message_id (DPS-2.3-history-order) it does
        whenever an opener and its closer share a millisecond and the ids sort them the other way
        round, and without this rule the view would be left with a call, block or turn open that
        the gateway closed long ago.
        """
        if not self._seen.first_time(frame.message_id):
            return False
        self.transcript.append(frame)
        o = self._open
        p = payload_of(frame)
        if isinstance(p, F.TextDelta | F.ThinkingDelta):
            blocks = o.text if isinstance(p, F.TextDelta) else o.thinking
            key = _block_key(frame, p.content_index)
            if key in blocks:
                blocks[key][1].append(p.text)
            elif not self._closed_since((p.TYPE, *key), frame):
                blocks[key] = (frame, [p.text])
        elif isinstance(p, F.TextDone | F.ThinkingDone):
            blocks = o.text if isinstance(p, F.TextDone) else o.thinking
            key = _block_key(frame, p.content_index)
            blocks.pop(key, None)
            delta = F.TextDelta.TYPE if isinstance(p, F.TextDone) else F.ThinkingDelta.TYPE
            self._close((delta, *key), frame)
        elif isinstance(p, F.InvokeRequest):
            if not self._closed_since(("call", p.invocation_id), frame):
                o.calls[p.invocation_id] = frame
        elif isinstance(p, F.InvokeResult):
            o.calls.pop(p.invocation_id, None)
            self._close(("call", p.invocation_id), frame)
        elif isinstance(p, F.InteractionRequest):
            if not self._closed_since(("ask", p.interaction_id), frame):
                o.interactions[p.interaction_id] = frame
        elif isinstance(p, F.InteractionResponse | F.InteractionTimeout):
            # Ours or relayed from another master (§2.4): either way nobody needs to ask again.
            o.interactions.pop(p.interaction_id, None)
            self._close(("ask", p.interaction_id), frame)
        elif isinstance(p, F.TurnStart):
            if not self._closed_since(("turn", p.turn_id), frame):
                o.turn = frame
            if p.mode is not None:
                self.mode = p.mode
        elif isinstance(p, F.TurnEnd):
            if self.turn_id == p.turn_id:
                o.turn = None
            self._close(("turn", p.turn_id), frame)
            # The turn is over, so nothing of it can still be asked.
            for iid, req in list(o.interactions.items()):
                if req.turn_id == p.turn_id:
                    del o.interactions[iid]
                    self._close(("ask", iid), frame)
        elif isinstance(p, F.StateChanged):
            o.agent_state = p.current_state
        elif isinstance(p, F.Usage):
            if not (frame.metadata or {}).get("subagent_context"):
                self.last_usage = p
        elif isinstance(p, F.Deleted):
            self.deleted = p
        return True

    def _close(self, key: tuple[Any, ...], frame: F.Frame) -> None:
        self._closed[key] = _timestamp_key(frame.timestamp)
        self._closed.move_to_end(key)
        if len(self._closed) > self._closed_capacity:
            self._closed.popitem(last=False)

    def _closed_since(self, key: tuple[Any, ...], frame: F.Frame) -> bool:
        """True if ``key`` was closed by a frame no older than ``frame`` (see ``apply``)."""
        closed = self._closed.get(key)
        return closed is not None and _timestamp_key(frame.timestamp) <= closed

    def _synth(self, payload: F.Payload, like: F.Frame | None) -> F.Frame:
        metadata: dict[str, Any] = {"synthetic": True}
        ctx = (like.metadata or {}).get("subagent_context") if like is not None else None
        if ctx:
            metadata["subagent_context"] = ctx
        turn_id = like.turn_id if like is not None else None
        return self.factory.frame(payload, turn_id=turn_id, metadata=metadata)

    def finalize(self) -> list[F.Frame]:
        """The connection closed or failed: close everything open locally (DPS-7.8-finalize).

        Returns the synthetic frames made (already in ``transcript``): ``agent.text.done`` /
        ``agent.thinking.done`` for open blocks (text kept as received), ``tool.invoke.result``
        ``cancelled`` with output ``"Connection lost"`` for open calls, ``session.turn.end``
        ``disconnected`` for an open turn, ``agent.state.changed`` to ``idle``. Pending
        interactions are dropped, so nothing waits for an answer. Every synthetic frame carries
        ``metadata.synthetic: true``. Nothing open (or a session already deleted): no frames.
        """
        o = self._open
        made: list[F.Frame] = []
        for (_, _, index), (first, _parts) in o.thinking.items():
            made.append(self._synth(F.ThinkingDone(content_index=index), first))
        for (_, _, index), (first, parts) in o.text.items():
            made.append(
                self._synth(F.TextDone(content_index=index, full_text="".join(parts)), first)
            )
        for request in o.calls.values():
            req = payload_of(request)
            assert isinstance(req, F.InvokeRequest)
            result = F.InvokeResult(
                invocation_id=req.invocation_id,
                tool_name=req.tool_name,
                status="cancelled",
                output=SYNTHETIC_OUTPUT,
                output_type="text",
            )
            made.append(self._synth(result, request))
        if o.turn is not None:
            start = payload_of(o.turn)
            assert isinstance(start, F.TurnStart)
            # "disconnected" is a master-side stop_reason (§7.8.1), not one a gateway sends.
            end = F.TurnEnd(turn_id=start.turn_id, stop_reason=cast(F.StopReason, DISCONNECTED))
            made.append(self._synth(end, o.turn))
        if o.agent_state != "idle":
            changed = F.StateChanged(
                previous_state=o.agent_state, current_state="idle", reason=DISCONNECTED
            )
            made.append(self._synth(changed, None))
        # Remember what was open so that a reattach can put it back (§7.8.3).
        if self._finalized is None:
            self._finalized = o
        else:
            self._finalized.merge(o)
        self._open = _Open()
        for frame in made:
            self._seen.first_time(frame.message_id)
            self.transcript.append(frame)
        return made

    def history(self, payload: F.History) -> HistoryOutcome:
        """A reattach brought ``session.history``: unfinalise and replay (DPS-7.8-unfinalize).

        The history's frames are ordered by ``timestamp`` then ``message_id``
        (DPS-2.3-history-order). Unless the buffer was truncated or the history holds
        ``session.deleted``, the synthetic frames are removed from ``transcript``, what
        finalisation closed is open again, and the frames are applied in that order. Otherwise the
        finalisation stands and nothing is applied (a deleted session is still recorded).
        """
        frames = history_order(decode_history(payload))
        status = payload.buffer_status
        deleted = next(
            (p for p in map(payload_of, frames) if isinstance(p, F.Deleted)),
            None,
        )
        reason = "truncated" if status.truncated else "deleted" if deleted is not None else None
        if reason is not None:
            if deleted is not None:
                self.deleted = deleted
            return HistoryOutcome(False, reason, frames, [], status.lost_frame_count)
        self.transcript = [f for f in self.transcript if not is_synthetic(f)]
        if self._finalized is not None:
            # What is open now (opened after the reattach, before the history) stays open too.
            self._finalized.merge(self._open)
            self._open = self._finalized
            self._finalized = None
        applied = [f for f in frames if self.apply(f)]
        return HistoryOutcome(True, None, frames, applied, status.lost_frame_count)
