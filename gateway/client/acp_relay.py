"""The decisions of ``rawp-gateway acp``, the stdio relay to a gateway's ``/acp``, with no I/O.

An editor launches ``rawp-gateway acp --url URL`` as a custom ACP agent: newline-delimited JSON-RPC
on stdin and stdout. The relay passes every message on to the gateway's ``/acp`` WebSocket and
back. What it adds is what a dropped connection needs, decided here with messages in and messages
out (``docs/acp-masters.md``, "The stdio relay"); the shell (``acp_link.py``) owns the pipes, the
socket and the backoff and feeds this object:

* **Ids are the relay's own on the socket.** Every request the editor sends goes out under a fresh
  integer id and its answer comes back under the editor's id, so the requests the relay makes
  itself (``initialize`` and ``session/load`` after a reconnect) never collide with the editor's.
  Requests the gateway sends (``session/request_permission``) reach the editor under ids the relay
  numbers, stable across connections.
* **Reconnect, then load again.** After a drop the relay initializes the new connection with the
  editor's own ``initialize`` params and loads every session the editor created or loaded, with the
  ``cwd`` and ``mcpServers`` it gave. Editor requests wait in a bounded queue until then.
* **No update lost or repeated.** Each ``session/update`` carries the gateway's per-session
  sequence number (``_meta.rawp.seq``, docs/acp-masters.md "Wire details"); the relay remembers the
  last one it passed on per session and drops any update at or below it, so the history a reload
  replays fills exactly the gap.
* **Requests in flight at the drop.** ``initialize``, ``session/list``, ``session/load`` and
  ``session/set_mode`` are safe to send again and are (a load's replay is filtered like any
  other). Anything else (``session/prompt``, ``session/new``, unknown methods) may already have
  acted on the gateway, so it is never sent twice: the editor gets a JSON-RPC error with
  ``data.error_code`` ``CONNECTION_LOST``; a prompt's turn goes on in the gateway and its updates
  keep arriving after the reload. A ``session/cancel`` waiting in the queue is sent after it.
* **A permission question asked again** after a reload (same ``sessionId`` and
  ``toolCall.toolCallId``) is not shown twice: the editor's open question takes the new request's
  place, and an answer the editor gave while the socket was down goes to the new request.
* **Bounded:** editor line size (the shell cuts it), requests in flight, queued messages and their
  bytes, sessions, open questions; each limit refuses with a JSON-RPC error and loses nothing else.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from parsers.json_depth import too_deep

__all__ = [
    "CONNECTION_LOST",
    "GATEWAY_UNREACHABLE",
    "RETRY_SAFE",
    "TOO_MANY_REQUESTS",
    "Log",
    "Relay",
    "RelayLimits",
    "ToEditor",
    "ToGateway",
]

# JSON-RPC 2.0 error codes: the standard ones, and one of the implementation-defined server range
# for what the relay itself refuses (``data.error_code`` says which).
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
RELAY_ERROR: Final = -32000

CONNECTION_LOST: Final = "CONNECTION_LOST"
GATEWAY_UNREACHABLE: Final = "GATEWAY_UNREACHABLE"
TOO_MANY_REQUESTS: Final = "TOO_MANY_REQUESTS"
TOO_MANY_SESSIONS: Final = "TOO_MANY_SESSIONS"
LINE_TOO_LONG: Final = "LINE_TOO_LONG"

# Requests the relay sends again after a reconnect: doing them twice changes nothing.
RETRY_SAFE: Final = frozenset(
    {"initialize", "session/list", "session/load", "session/resume", "session/set_mode"}
)
# Requests that attach the editor to a session: the relay loads it again after a drop.
ATTACHING: Final = frozenset({"session/new", "session/load", "session/resume"})


@dataclass(frozen=True)
class RelayLimits:
    """Every bound of the relay, with the defaults docs/acp-masters.md documents."""

    max_line_bytes: int = 16 * 1024 * 1024  # one editor message (the shell enforces it)
    max_pending: int = 256  # editor requests sent and not yet answered
    max_queued: int = 256  # editor messages waiting for the connection
    max_queued_bytes: int = 32 * 1024 * 1024
    max_sessions: int = 1024  # sessions the relay loads again after a drop
    max_questions: int = 256  # gateway requests the editor has not answered
    fail_queue_after: int = 5  # failed connection attempts before queued requests are refused


@dataclass(frozen=True)
class ToEditor:
    """One line for the editor's stdin (ends with a newline)."""

    data: bytes


@dataclass(frozen=True)
class ToGateway:
    """One text message for the WebSocket."""

    data: bytes


@dataclass(frozen=True)
class Log:
    """One line for stderr (editors show an agent's stderr in their logs)."""

    text: str


Action = ToEditor | ToGateway | Log
Id = int | str | None


class _Envelope(msgspec.Struct):
    """What the relay reads of any JSON-RPC message; ``params`` and ``result`` stay raw."""

    jsonrpc: str | msgspec.UnsetType = msgspec.UNSET
    id: int | str | msgspec.UnsetType | None = msgspec.UNSET
    method: str | None = None
    params: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    result: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    error: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class _Rawp(msgspec.Struct):
    seq: int | None = None


class _Meta(msgspec.Struct):
    rawp: _Rawp | None = None


class _Update(msgspec.Struct):
    meta: _Meta | None = msgspec.field(default=None, name="_meta")


class _UpdateParams(msgspec.Struct):
    sessionId: str = ""
    update: _Update | None = None
    meta: _Meta | None = msgspec.field(default=None, name="_meta")


class _ToolCallRef(msgspec.Struct):
    toolCallId: str = ""


class _QuestionParams(msgspec.Struct):
    sessionId: str = ""
    toolCall: _ToolCallRef | None = None


class _SessionParams(msgspec.Struct):
    sessionId: str = ""
    cwd: str | None = None


class _NewSessionResult(msgspec.Struct):
    sessionId: str = ""


@dataclass
class _Sent:
    """A request on the socket under a relay id: the editor's (``editor_id``) or the relay's own."""

    method: str
    editor_id: Id = None
    from_editor: bool = True
    message: dict[str, Any] | None = None  # the editor's message, to send again if retry-safe
    session_id: str = ""
    session: _Session | None = None  # session/new, session/load: what to remember on success


@dataclass
class _Session:
    cwd: str | None
    mcp_servers: Any  # as the editor gave them


@dataclass
class _Question:
    """A request of the gateway's that the editor holds under ``editor_id``."""

    epoch: int
    gateway_id: Id
    key: tuple[str, str] | None  # (sessionId, toolCallId) of a permission question
    answer: dict[str, Any] | None = None  # the editor's answer, kept while the socket was down


@dataclass
class _Queued:
    message: dict[str, Any]
    size: int


@dataclass
class _State:
    epoch: int = 0  # connections so far; a gateway request id means something only in its epoch
    phase: str = "connecting"  # connecting | reloading | live
    initialized: dict[str, Any] | None = None  # the editor's initialize params, once answered
    failures: int = 0  # failed connection attempts since the last success
    reloads_left: int = 0
    queue: list[_Queued] = field(default_factory=list)
    queued_bytes: int = 0


class Relay:
    """Feed it what happens; it returns what to write where. See the module docstring."""

    def __init__(self, limits: RelayLimits | None = None) -> None:
        self.limits = limits or RelayLimits()
        self._s = _State()
        self._ids = itertools.count(1)  # relay ids on the socket
        self._question_ids = itertools.count(1)  # relay ids toward the editor
        self._sent: dict[int, _Sent] = {}
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._seq: dict[str, int] = {}  # session -> last seq passed to the editor
        self._questions: dict[int, _Question] = {}
        self._by_key: dict[tuple[str, str], int] = {}

    # --- what the shell reports ------------------------------------------------------------------

    @property
    def live(self) -> bool:
        return self._s.phase == "live"

    @property
    def sessions(self) -> list[str]:
        return list(self._sessions)

    def connected(self) -> list[Action]:
        """A new WebSocket is open."""
        s = self._s
        s.epoch += 1
        s.failures = 0
        if s.initialized is None:
            s.phase = "live"
            return self._flush()
        out: list[Action] = [Log(f"reconnected; loading {len(self._sessions)} session(s) again")]
        s.phase = "reloading"
        out.append(self._own_request("initialize", s.initialized))
        return out

    def disconnected(self, reason: str = "") -> list[Action]:
        """The WebSocket closed or failed."""
        s = self._s
        if s.phase == "connecting" and not self._sent:
            return []
        s.phase = "connecting"
        out: list[Action] = [Log(f"connection to the gateway lost{_colon(reason)}; reconnecting")]
        retry: list[_Queued] = []
        for sent in self._sent.values():
            if not sent.from_editor:
                continue
            if sent.method in RETRY_SAFE and sent.message is not None:
                retry.append(_Queued(sent.message, 0))
            else:
                out.append(
                    self._error(
                        sent.editor_id,
                        CONNECTION_LOST,
                        f"the connection to the gateway dropped while {sent.method} was in "
                        "flight; the gateway may have acted on it, so it is not sent again"
                        + (
                            " (the turn goes on, its updates follow)"
                            if sent.method == "session/prompt"
                            else ""
                        ),
                    )
                )
        self._sent.clear()
        # Sent again first, in the order they were first sent, then what was already waiting.
        s.queue[:0] = retry
        return out

    def connect_failed(self, reason: str, retry_in: float) -> list[Action]:
        """An attempt to connect failed; the shell tries again in ``retry_in`` seconds."""
        s = self._s
        s.failures += 1
        out: list[Action] = [
            Log(f"cannot reach the gateway{_colon(reason)}; retrying in {retry_in:g} s")
        ]
        if s.failures >= self.limits.fail_queue_after:
            out += self._fail_queue(GATEWAY_UNREACHABLE, f"the gateway is unreachable: {reason}")
        return out

    def editor_line_too_long(self) -> list[Action]:
        return [
            self._error(
                None,
                LINE_TOO_LONG,
                f"message over {self.limits.max_line_bytes} bytes",
                code=INVALID_REQUEST,
            )
        ]

    # --- editor -> gateway ---------------------------------------------------------------------

    def editor_line(self, line: bytes) -> list[Action]:
        """One line the editor wrote (without its newline)."""
        if not line.strip():
            return []
        if len(line) > self.limits.max_line_bytes:
            return self.editor_line_too_long()
        try:
            if too_deep(line):
                raise msgspec.DecodeError("nested too deeply")
            message = msgspec.json.decode(line)
        except (msgspec.DecodeError, RecursionError) as err:
            return [self._error(None, "PARSE_ERROR", f"not JSON: {err}", code=PARSE_ERROR)]
        if not isinstance(message, dict):
            return [self._error(None, "INVALID_REQUEST", "not a JSON-RPC message", INVALID_REQUEST)]
        method = message.get("method")
        has_id = "id" in message
        if method is None and has_id:
            return self._editor_answer(message)
        if not isinstance(method, str) or (has_id and not _valid_id(message["id"])):
            return [
                self._error(
                    message.get("id") if has_id and _valid_id(message["id"]) else None,
                    "INVALID_REQUEST",
                    "not a JSON-RPC request, notification or response",
                    INVALID_REQUEST,
                )
            ]
        if self._s.phase != "live":
            return self._enqueue(message, len(line))
        return self._send_editor(message)

    def _enqueue(self, message: dict[str, Any], size: int) -> list[Action]:
        s = self._s
        if len(s.queue) >= self.limits.max_queued or (
            s.queued_bytes + size > self.limits.max_queued_bytes
        ):
            return self._refuse(
                message, TOO_MANY_REQUESTS, "too many messages wait for the gateway"
            )
        s.queue.append(_Queued(message, size))
        s.queued_bytes += size
        return []

    def _send_editor(self, message: dict[str, Any]) -> list[Action]:
        method: str = message["method"]
        if "id" not in message:  # a notification: nothing comes back
            return [ToGateway(_encode(message))]
        if len(self._sent) >= self.limits.max_pending:
            return self._refuse(message, TOO_MANY_REQUESTS, "too many requests in flight")
        sent = _Sent(method, editor_id=message["id"], message=message)
        if method == "session/close":
            closed = _params(message, _SessionParams).sessionId
            self._sessions.pop(closed, None)
            self._seq.pop(closed, None)
        if method in ATTACHING:
            params = _params(message, _SessionParams)
            if params.sessionId in self._sessions:
                pass  # attached again: already remembered
            elif len(self._sessions) >= self.limits.max_sessions:
                return self._refuse(
                    message, TOO_MANY_SESSIONS, f"over {self.limits.max_sessions} sessions"
                )
            sent.session_id = params.sessionId
            mcp_servers = (message.get("params") or {}).get("mcpServers")
            sent.session = _Session(params.cwd, [] if mcp_servers is None else mcp_servers)
        relay_id = next(self._ids)
        self._sent[relay_id] = sent
        return [ToGateway(_encode({**message, "id": relay_id}))]

    def _editor_answer(self, message: dict[str, Any]) -> list[Action]:
        """The editor answered one of the gateway's requests (a permission question)."""
        editor_id = message["id"]
        question = self._questions.get(editor_id) if isinstance(editor_id, int) else None
        if question is None:
            return [Log(f"the editor answered an unknown request {editor_id!r}; dropped")]
        if question.epoch == self._s.epoch and self._s.phase != "connecting":
            self._forget_question(editor_id)
            return [ToGateway(_encode({**message, "id": question.gateway_id}))]
        if question.key is None:  # asked on a connection that is gone, and never asked again
            self._forget_question(editor_id)
            return [Log(f"answer to request {editor_id} dropped: its connection is gone")]
        question.answer = message  # sent when the gateway asks it again after the reload
        return []

    # --- gateway -> editor ---------------------------------------------------------------------

    def gateway_message(self, data: bytes | str) -> list[Action]:
        """One text message from the WebSocket."""
        raw = data.encode() if isinstance(data, str) else data
        try:
            env = msgspec.json.decode(raw, type=_Envelope)
        except (msgspec.DecodeError, RecursionError) as err:
            return [Log(f"the gateway sent a message that is not JSON-RPC ({err}); dropped")]
        if env.method is not None:
            if isinstance(env.id, msgspec.UnsetType):
                return self._notification(env, raw)
            return self._gateway_request(env, env.id, raw)
        if isinstance(env.id, int) and env.id in self._sent:
            return self._answer(self._sent.pop(env.id), env, raw)
        return [Log(f"the gateway answered an unknown request {env.id!r}; dropped")]

    def _notification(self, env: _Envelope, raw: bytes) -> list[Action]:
        if env.method == "session/update" and env.params:
            try:
                params = msgspec.json.decode(env.params, type=_UpdateParams)
            except msgspec.DecodeError:
                return [ToEditor(raw + b"\n")]
            seq = _seq(params)
            if seq is not None:
                if seq <= self._seq.get(params.sessionId, -1):
                    return []  # already passed on before the drop
                if params.sessionId in self._seq or len(self._seq) < self.limits.max_sessions:
                    self._seq[params.sessionId] = seq
        return [ToEditor(raw + b"\n")]

    def _gateway_request(self, env: _Envelope, gateway_id: Id, raw: bytes) -> list[Action]:
        key = None
        if env.method == "session/request_permission" and env.params:
            try:
                q = msgspec.json.decode(env.params, type=_QuestionParams)
            except msgspec.DecodeError:
                q = _QuestionParams()
            if q.toolCall is not None and q.toolCall.toolCallId:
                key = (q.sessionId, q.toolCall.toolCallId)
        if key is not None and key in self._by_key:  # asked again after a reload
            editor_id = self._by_key[key]
            question = self._questions[editor_id]
            question.epoch, question.gateway_id = self._s.epoch, gateway_id
            if question.answer is not None:
                self._forget_question(editor_id)
                return [ToGateway(_encode({**question.answer, "id": gateway_id}))]
            return []
        if len(self._questions) >= self.limits.max_questions:
            error = _rpc_error(gateway_id, RELAY_ERROR, "the editor has too many open requests")
            return [ToGateway(_encode(error)), Log("too many open editor requests; one refused")]
        editor_id = next(self._question_ids)
        self._questions[editor_id] = _Question(self._s.epoch, gateway_id, key)
        if key is not None:
            self._by_key[key] = editor_id
        message = msgspec.json.decode(raw)
        message["id"] = editor_id
        return [ToEditor(_encode(message) + b"\n")]

    def _answer(self, sent: _Sent, env: _Envelope, raw: bytes) -> list[Action]:
        ok = bytes(env.error) in (b"", b"null")
        if ok and sent.session is not None:
            session_id = sent.session_id
            if sent.method == "session/new":
                try:
                    session_id = msgspec.json.decode(env.result, type=_NewSessionResult).sessionId
                except msgspec.DecodeError:
                    session_id = ""
            if session_id:
                self._sessions[session_id] = sent.session
        if not sent.from_editor:
            return self._own_answer(sent, env, ok)
        if sent.method == "initialize" and ok and sent.message is not None:
            self._s.initialized = sent.message.get("params") or {}
        message = msgspec.json.decode(raw)
        message["id"] = sent.editor_id
        return [ToEditor(_encode(message) + b"\n")]

    # --- the reload after a reconnect -------------------------------------------------------------

    def _own_request(self, method: str, params: dict[str, Any], session_id: str = "") -> ToGateway:
        relay_id = next(self._ids)
        self._sent[relay_id] = _Sent(method, from_editor=False, session_id=session_id)
        message = {"jsonrpc": "2.0", "id": relay_id, "method": method, "params": params}
        return ToGateway(_encode(message))

    def _own_answer(self, sent: _Sent, env: _Envelope, ok: bool) -> list[Action]:
        s = self._s
        out: list[Action] = []
        if sent.method == "initialize":
            if not ok:
                out.append(Log(f"the gateway refused initialize again: {_text(env.error)}"))
            loads = list(self._sessions.items())
            s.reloads_left = len(loads)
            for session_id, session in loads:
                params = {
                    "sessionId": session_id,
                    "cwd": session.cwd,
                    "mcpServers": session.mcp_servers,
                }
                out.append(self._own_request("session/load", params, session_id))
        elif sent.method == "session/load":
            s.reloads_left -= 1
            if not ok:
                self._sessions.pop(sent.session_id, None)
                out.append(
                    Log(f"session {sent.session_id} could not be loaded again: {_text(env.error)}")
                )
        if s.phase == "reloading" and s.reloads_left <= 0:
            s.phase = "live"
            out.append(Log("sessions loaded again; relaying"))
            out += self._flush()
        return out

    # --- helpers ---------------------------------------------------------------------------------

    def _flush(self) -> list[Action]:
        s = self._s
        queue, s.queue, s.queued_bytes = s.queue, [], 0
        out: list[Action] = []
        for item in queue:
            out += self._send_editor(item.message)
        return out

    def _fail_queue(self, error_code: str, text: str) -> list[Action]:
        s = self._s
        queue, s.queue, s.queued_bytes = s.queue, [], 0
        out: list[Action] = []
        for item in queue:
            out += self._refuse(item.message, error_code, text)
        return out

    def _refuse(self, message: dict[str, Any], error_code: str, text: str) -> list[Action]:
        if "id" not in message:  # a notification cannot be answered
            return [Log(f"{message.get('method')} dropped: {text}")]
        return [self._error(message["id"], error_code, text)]

    def _error(self, id_: Id, error_code: str, text: str, code: int = RELAY_ERROR) -> ToEditor:
        message = _rpc_error(id_, code, text)
        message["error"]["data"] = {"error_code": error_code}
        return ToEditor(_encode(message) + b"\n")

    def _forget_question(self, editor_id: int) -> None:
        question = self._questions.pop(editor_id)
        if question.key is not None:
            self._by_key.pop(question.key, None)


def _rpc_error(id_: Id, code: int, text: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": {"code": code, "message": text}}


def _encode(message: dict[str, Any]) -> bytes:
    return msgspec.json.encode(message)


def _params(message: dict[str, Any], type_: type[_SessionParams]) -> _SessionParams:
    try:
        return msgspec.convert(message.get("params") or {}, type_)
    except msgspec.ValidationError:
        return type_()


def _seq(params: _UpdateParams) -> int | None:
    for meta in (params.meta, params.update.meta if params.update else None):
        if meta is not None and meta.rawp is not None and meta.rawp.seq is not None:
            return meta.rawp.seq
    return None


def _valid_id(id_: object) -> bool:
    return id_ is None or (isinstance(id_, (int, str)) and not isinstance(id_, bool))


def _text(raw: msgspec.Raw) -> str:
    try:
        error = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return "?"
    if isinstance(error, dict):
        data = error.get("data")
        code = data.get("error_code") if isinstance(data, dict) else None
        return f"{error.get('message', '')}" + (f" ({code})" if code else "")
    return str(error)


def _colon(reason: str) -> str:
    return f": {reason}" if reason else ""
