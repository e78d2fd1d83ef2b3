"""What the stdio relay (``acp_relay.py``) reads of ACP messages, what it writes, and its bounds.

The relay reads as little as it can: the JSON-RPC envelope (``id``, ``method``), and in the params
of a few methods the ids that place a message (``sessionId``, ``_meta.rawp.messageId``,
``_meta.rawp.interactionId``, a turn event's ``turnId``). Everything else passes through as the
bytes that came, decoded once into these small msgspec structs. The ``_meta.rawp`` fields are the
gateway's (docs/acp-masters.md, "Wire details").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from gateway.protocol.acp_master import FAILED_TURN, STOP_REASONS

__all__ = [
    "CONNECTION_LOST",
    "GATEWAY_UNREACHABLE",
    "TOO_MANY_REQUESTS",
    "TOO_MANY_SESSIONS",
    "TURN_EVENT",
    "Action",
    "Connect",
    "Log",
    "RelayLimits",
    "ToEditor",
    "ToGateway",
]

# JSON-RPC 2.0 error codes: the standard ones, and one of the implementation-defined server range
# for what the relay itself refuses (``data.error_code`` says which), as the gateway does.
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
INTERNAL_ERROR: Final = -32603
RELAY_ERROR: Final = -32000

CONNECTION_LOST: Final = "CONNECTION_LOST"
GATEWAY_UNREACHABLE: Final = "GATEWAY_UNREACHABLE"
TOO_MANY_REQUESTS: Final = "TOO_MANY_REQUESTS"
TOO_MANY_SESSIONS: Final = "TOO_MANY_SESSIONS"
LINE_TOO_LONG: Final = "LINE_TOO_LONG"
SESSION_TERMINATED: Final = "SESSION_TERMINATED"  # the gateway's own code for a session that ended
# The close code of an /acp socket whose gateway stopped keeping no sessions (no state dir): its
# sessions ended with it. A restart that keeps them closes with 1012, and they load again.
GATEWAY_STOPPED: Final = 1001

# A pod's name as the fleet's router takes it in /pods/<pod>/ (one DNS label): nothing the gateway
# says can point the relay at another path or host.
POD: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

# The gateway's notification of a turn's start and end, sent to clients that ask for it in
# ``initialize`` (``clientCapabilities._meta.rawp.turnEvents``); the relay keeps it to itself.
TURN_EVENT: Final = "_rawp/turn"


@dataclass(frozen=True)
class RelayLimits:
    """Every bound of the relay, with the defaults docs/acp-masters.md documents."""

    max_line_bytes: int = 16 * 1024 * 1024  # one editor message (the shell enforces it)
    max_pending: int = 256  # editor requests sent and not yet answered
    max_queued: int = 256  # editor messages waiting for the connection
    max_queued_bytes: int = 32 * 1024 * 1024
    max_sessions: int = 1024  # sessions the relay loads again after a drop
    max_questions: int = 256  # gateway requests the editor has not answered
    seen_window: int = 8192  # update ids remembered to drop one a reload sends again
    fail_queue_after: int = 5  # failed connection attempts before queued requests are refused


@dataclass(frozen=True)
class ToEditor:
    """One line for the editor's stdin (ends with a newline)."""

    data: bytes


@dataclass(frozen=True)
class ToGateway:
    """One text message for the WebSocket of ``link``: ``""`` the one at ``--url``, else the
    ``/pods/<link>/acp`` of that pod of a fleet."""

    data: bytes
    link: str = ""


@dataclass(frozen=True)
class Connect:
    """Open (and keep open) a WebSocket for ``link``: a session lives on that pod."""

    link: str


@dataclass(frozen=True)
class Log:
    """One line for stderr (editors show an agent's stderr in their logs)."""

    text: str


Action = ToEditor | ToGateway | Connect | Log
Id = int | str | None


class Envelope(msgspec.Struct):
    """What the relay reads of any JSON-RPC message; ``params``, ``result``, ``error`` stay raw."""

    id: int | str | msgspec.UnsetType | None = msgspec.UNSET
    method: str | None = None
    params: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    result: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    error: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class Rawp(msgspec.Struct):
    messageId: str | None = None
    interactionId: str | None = None
    lastMessageId: str | None = None
    lostFrames: int | None = None
    turnId: str | None = None
    pod: str | None = None  # session/list: the fleet's pod that holds the session


class Meta(msgspec.Struct):
    rawp: Rawp | None = None


class Placed(msgspec.Struct):
    """The params of a ``session/update``, a ``_rawp/turn`` or a ``session/request_permission``
    (what places them), or the result of a ``session/load`` or ``session/new``."""

    sessionId: str = ""
    turnId: str | None = None  # _rawp/turn
    event: str | None = None  # _rawp/turn: start | end
    stopReason: str | None = None  # _rawp/turn end: the DPS stop reason
    requestId: int | str | None = None  # _rawp/turn live start: the session/prompt that opened it
    toolCall: ToolCallRef | None = None  # session/request_permission
    update: UpdateKind | None = None  # session/update
    meta: Meta | None = msgspec.field(default=None, name="_meta")

    @property
    def rawp(self) -> Rawp:
        return (self.meta.rawp if self.meta else None) or Rawp()


class UpdateKind(msgspec.Struct):
    sessionUpdate: str = ""


class ToolCallRef(msgspec.Struct):
    toolCallId: str = ""


class Listed(msgspec.Struct):
    sessionId: str = ""
    meta: Meta | None = msgspec.field(default=None, name="_meta")


class ListResult(msgspec.Struct):
    """A ``session/list`` answer: where each session lives (``_meta.rawp.pod``)."""

    sessions: list[Listed] = []


def pods_of(raw: msgspec.Raw) -> dict[str, str]:
    """``{session: pod}`` of a ``session/list`` answer (a session without a pod: not in it)."""
    try:
        listed = msgspec.json.decode(raw, type=ListResult).sessions if raw else []
    except msgspec.DecodeError:
        return {}
    pods = {}
    for s in listed:
        pod = s.meta.rawp.pod if s.meta and s.meta.rawp else None
        if s.sessionId and pod and POD.fullmatch(pod):
            pods[s.sessionId] = pod
    return pods


class SessionParams(msgspec.Struct):
    """The params of ``session/new``, ``session/load``, ``session/resume``, ``session/prompt``."""

    sessionId: str = ""
    cwd: str | None = None


def decode_placed(raw: msgspec.Raw | bytes) -> Placed:
    try:
        return msgspec.json.decode(raw, type=Placed) if raw else Placed()
    except msgspec.DecodeError:  # (a ValidationError is one) params of another shape
        return Placed()


def session_params(message: dict[str, Any]) -> SessionParams:
    try:
        return msgspec.convert(message.get("params") or {}, SessionParams)
    except msgspec.ValidationError:
        return SessionParams()


class ErrorData(msgspec.Struct):
    error_code: str | None = None
    pod: str | None = None  # SESSION_ON_OTHER_POD: the pod that holds the session


class RpcError(msgspec.Struct):
    data: ErrorData | None = None


def other_pod(raw: msgspec.Raw) -> str | None:
    """The pod a ``SESSION_ON_OTHER_POD`` refusal names (one DNS label), else None."""
    try:
        data = msgspec.json.decode(raw, type=RpcError).data if raw else None
    except msgspec.DecodeError:
        return None
    if data is None or data.error_code != "SESSION_ON_OTHER_POD" or not data.pod:
        return None
    return data.pod if POD.fullmatch(data.pod) else None


def rpc_error(id_: Id, code: int, text: str, error_code: str, **data: Any) -> dict[str, Any]:
    error = {"code": code, "message": text, "data": {"error_code": error_code, **data}}
    return {"jsonrpc": "2.0", "id": id_, "error": error}


def encode(message: dict[str, Any]) -> bytes:
    return msgspec.json.encode(message)


def line(message: dict[str, Any]) -> ToEditor:
    return ToEditor(encode(message) + b"\n")


def with_id(raw: bytes, id_: Id) -> dict[str, Any]:
    """The message ``raw`` under another id (the one other part of it the relay ever changes)."""
    message: dict[str, Any] = msgspec.json.decode(raw)
    message["id"] = id_
    return message


def valid_id(id_: object) -> bool:
    return id_ is None or (isinstance(id_, (int, str)) and not isinstance(id_, bool))


def is_error(env: Envelope) -> bool:
    return bytes(env.error) not in (b"", b"null")


def error_text(raw: msgspec.Raw) -> str:
    """``message (ERROR_CODE)`` of a JSON-RPC error, for a stderr line."""
    try:
        error = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return "?"
    if not isinstance(error, dict):
        return str(error)
    data = error.get("data")
    code = data.get("error_code") if isinstance(data, dict) else None
    return f"{error.get('message', '')}" + (f" ({code})" if code else "")


def with_turn_events(params: Any) -> Any:
    """The editor's ``initialize`` params, asking the gateway for ``_rawp/turn`` notifications
    too (``clientCapabilities._meta.rawp.turnEvents``); the editor's own fields untouched."""
    if not isinstance(params, dict):
        return params
    caps = params.get("clientCapabilities")
    caps = dict(caps) if isinstance(caps, dict) else {}
    meta = caps.get("_meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    rawp = meta.get("rawp")
    meta["rawp"] = {**(rawp if isinstance(rawp, dict) else {}), "turnEvents": True}
    caps["_meta"] = meta
    return {**params, "clientCapabilities": caps}


def turn_answer(editor_id: Id, turn_id: str, dps_stop: str) -> ToEditor:
    """The answer to a prompt whose connection dropped, from its turn's end: what the gateway
    would have answered on the connection it came on."""
    stop = STOP_REASONS.get(dps_stop)
    if stop is not None:
        result = {"stopReason": stop, "_meta": {"rawp": {"turnId": turn_id}}}
        return line({"jsonrpc": "2.0", "id": editor_id, "result": result})
    code = FAILED_TURN.get(dps_stop, "TURN_FAILED")
    text = f"the turn ended with {dps_stop}"
    return line(rpc_error(editor_id, INTERNAL_ERROR, text, code, turnId=turn_id))
