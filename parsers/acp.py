"""Any Agent Client Protocol agent: the gateway is its ACP client, sans-IO.

Theory of operation
-------------------
ACP is JSON-RPC 2.0 over the agent's stdin and stdout, one message per line, and it goes both ways:
the gateway asks (``initialize``, ``session/new``, ``session/prompt``, ...) and the agent asks back
(``session/request_permission``, ``fs/*``, ...). So one ``AcpAdapter`` object is both the session's
parser and its input (``ParserSpec.converses``): what it sent decides what an answer means, and an
answer it must give comes out of ``feed`` as a ``StdinWrite`` event. It never reads a pipe or a
clock; the session machine writes what it returns.

The conversation of one agent process:

1. ``opening(resume_id)`` (the session machine calls it whenever it starts the process) is the
   ``initialize`` request: protocol version 1, ``fs`` off, ``terminal: false``.
2. Its answer says what the agent has (``FeaturesDeclared``: image prompts, ``loadSession``), and
   the adapter asks ``session/new`` (cwd = the workspace, no MCP servers), or ``session/load`` of
   ``resume_id`` when the agent declared ``loadSession``. A load's replay of the conversation is
   dropped (masters have those frames already); a load refused, or an agent without
   ``loadSession``, gets a new session and an ``ACP_SESSION_NOT_RESUMED`` warning.
3. The session's id becomes ``SessionStarted.agent_session_id``; its modes decide ``plan_mode``. A
   prompt given before this point waits in the adapter and is sent now.
4. Per turn: ``session/prompt``; ``session/update`` notifications become content and tool events;
   the prompt's answer (its ``stopReason``) ends the turn (``TurnEnded``).

What each update becomes is the table of ``docs/acp-mapping.md``. Text and thought chunks are
blocks that end when something else is said (a tool call, the other kind of chunk, another
``messageId``, the turn's end). A tool call is announced (``ToolCall``) once its input is known
(an agent may first report it ``pending`` with no input, then update it), and ends with one
``ToolResult`` whose ``output_type`` comes from the call's ``kind`` and content (a ``diff`` item →
a unified diff). ``plan`` is an ``update_plan`` call with a ``structured`` result, as Codex's
todo list is.

Answers to the agent: ``session/request_permission`` becomes a ``PermissionRequest`` with the
agent's own options; the session machine's answer (``permission(..., option=...)``) selects one,
or is ``cancelled`` (a timeout, a cancel). ``fs/*``, ``terminal/*`` and any other method are
answered with JSON-RPC error -32601 (the gateway advertises neither: see the mapping page).

Bad input never raises: a line that is not JSON-RPC, a response to an id never sent, a request of an
unknown method each give an ``agent.error`` warning (``Notice``, said outside any turn without
opening one; the first ``MAX_PROTOCOL_WARNINGS`` of a process, then only logs), and the
conversation goes on.

Saved sessions (``StoreQuery``): a short-lived process of the agent, asked ``session/list`` (page
by page) or ``session/load`` of one session, whose replay is translated by an adapter of its own
into the turns of a ``Transcript`` (docs/acp-mapping.md, "Saved sessions").

Replay (``rawp-gateway translate``): ``replay()`` makes the adapter write nothing of its own; the
transcript's client lines (``{"sent": <message>}``) are given to ``sent`` so answers are read as
they were.
"""

from __future__ import annotations

import base64
from collections import OrderedDict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, Final

import msgspec

from . import acp_schema as S
from . import events as ev
from .base import MAX_LINE_IN_EVENT, JsonLinesParser, ParserSpec, PromptImage
from .file_changes import text_diff
from .json_depth import MAX_AGENT_LINE_DEPTH, too_deep
from .saved import ReplayedTurn, Summary, Transcript, iso_time, title_of

__all__ = [
    "MAX_OPEN_CALLS",
    "MAX_PROTOCOL_WARNINGS",
    "SPEC",
    "AcpAdapter",
    "StoreQuery",
]

CLIENT_NAME: Final = "rawp-gateway"
CLIENT_VERSION: Final = "0.1.0"
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
MAX_OPEN_CALLS: Final = 4096  # tool calls remembered until their end
MAX_COMMANDS: Final = 1024
MAX_COMMAND_DESCRIPTION: Final = 200
MAX_PLAN_ENTRIES: Final = 1024
MAX_PENDING: Final = 64  # requests either side has open at once; real agents have one or two
MAX_QUEUED: Final = 16  # writes waiting for the session to exist (a prompt, a mode)
MAX_PROTOCOL_WARNINGS: Final = 10  # agent.error warnings for protocol faults, per process
MAX_ID_CHARS: Final = 128  # a JSON-RPC id or tool call id kept (longer ones are cut)
PLAN_TOOL: Final = "update_plan"

_encode: Final = msgspec.json.encode
_decode_message: Final = msgspec.json.Decoder(S.Message).decode
_decode_envelope: Final = msgspec.json.Decoder(S.Envelope).decode
_decode_sent: Final = msgspec.json.Decoder(S.Sent).decode
_decode_answer: Final = msgspec.json.Decoder(S.SentAnswer).decode
_decode_block: Final = msgspec.json.Decoder(S.ContentBlock).decode
_decode_tool_content: Final = msgspec.json.Decoder(list[S.ToolCallContent]).decode

# The stop reasons of ACP → (DPS stop_reason, agent.error code or None, severity, message)
_STOPS: Final[dict[str, tuple[str, str | None, str, str]]] = {
    "end_turn": ("end_turn", None, "", ""),
    "max_tokens": ("max_tokens", None, "", ""),
    "cancelled": ("cancelled", None, "", ""),
    "max_turn_requests": (
        "error",
        "MAX_TURN_REQUESTS",
        "warning",
        "the agent stopped: it reached its limit of model requests in one turn",
    ),
    "refusal": (
        "error",
        "AGENT_REFUSED",
        "error",
        "the agent refused to continue; this prompt is not part of the conversation any more",
    ),
}
# ToolKind → the output_type of a result with text (one without is "empty")
_KIND_OUTPUT: Final[dict[str, str]] = {
    "read": "file_content",
    "execute": "text",
    "fetch": "web_content",
    "search": "text",  # file_list when it names locations and no text
    "think": "text",
    "switch_mode": "text",
}
_WRITE_KINDS: Final = frozenset({"edit", "delete", "move"})
_PLAN_WORDS: Final = ("plan", "architect")
_COMPACT_COMMANDS: Final = ("compact", "compress")  # Claude's, Gemini's


def _line(message: dict[str, Any]) -> bytes:
    return _encode(message) + b"\n"


def _cut(text: str | None) -> str:
    return (text or "")[:MAX_ID_CHARS]


class _Call:
    __slots__ = ("announced", "content", "input", "kind", "locations", "name", "streamed", "title")

    def __init__(self) -> None:
        self.announced = False
        self.name: str | None = None
        self.title = ""
        self.kind = "other"
        self.input: dict[str, Any] | None = None
        self.locations: list[str] = []
        self.streamed: list[str] = []  # text already sent as ToolOutput
        # The last content reported before the end (Claude's adapter sends a Write's diff with
        # its input, and none with its completion).
        self.content: list[S.ToolCallContent] | None = None


class AcpAdapter(JsonLinesParser):
    """One agent process's ACP conversation: parser (``feed``/``end``) and input (``prompt``,
    ``interrupt``, ``permission``, ``set_mode``, ``opening``) at once."""

    accepts_images: ClassVar[bool] = True
    # A cancel is session/cancel alone: SIGINT would end the agent, not its turn (the session
    # machine still stops an agent whose turn has not ended 10 s after the cancel).
    sigint_on_cancel: ClassVar[bool] = False
    KNOWN_KINDS: ClassVar[frozenset[str]] = frozenset()

    def __init__(self) -> None:
        super().__init__()
        self.workspace = ""
        self.replaying = False
        self.session_id: str | None = None  # the ACP session, kept across processes (resume)
        self.dropped_replay = 0  # updates of a session/load's replay, not passed on
        self.stray_updates = 0  # content outside any prompt, not passed on
        self._compact: str | None = None  # the agent's compaction command, when it lists one
        self._model: str | None = None  # session/new's models.currentModelId
        self._reset_process()

    def _reset_process(self) -> None:
        self._next_id = 0
        self._sent: dict[int | str, tuple[str, str | None]] = {}  # id → (method, machine's id)
        self._asked: dict[str, int | str] = {}  # the agent's open requests: str(id) → id
        self._allowing: set[str] = set()  # option ids that allow (a replay reads answers)
        self._stage = "closed"  # closed, initializing, creating, loading, ready
        self._resume_id: str | None = None
        self._can_load = False
        self._images = False
        self._queued: list[tuple[str, Any]] = []
        self._modes: list[S.Mode] = []
        self._mode: str | None = None
        self._default_mode: str | None = None
        self._prompt: int | str | None = None  # the session/prompt in flight
        self._cancelled = False
        self._cancel_waiting = False
        self._warnings = 0
        self._context: tuple[int | None, int | None, float | None] = (None, None, None)
        self._calls: OrderedDict[str, _Call] = OrderedDict()
        self._block: tuple[str, str] | None = None  # (kind, key) of the open text/thought block
        self._blocks = 0
        self._message_id: str | None = None
        self._plans = 0

    # --- set-up ---------------------------------------------------------------------------------

    def set_workspace(self, workspace: str) -> None:
        """``ReadsWorkspace``: the session's cwd, sent as ``cwd`` (ACP wants an absolute path)."""
        self.workspace = workspace

    def replay(self) -> None:
        """A recorded transcript is read: nothing is written, the client's lines come by ``sent``."""
        self.replaying = True

    def translate_only(self) -> None:
        """Updates are read as in a prompt and nothing is written (``StoreQuery``'s replay)."""
        self.replaying = True
        self._stage, self._prompt = "ready", -1

    def sent(self, line: bytes) -> list[ev.AgentEvent]:
        """A line the client wrote (``{"sent": <message>}``) in a replayed transcript: remembered
        as if this adapter had sent it."""
        try:
            msg = _decode_sent(line).sent
        except (msgspec.DecodeError, msgspec.ValidationError):
            return []
        if msg.method is not None and msg.id is not None:
            self._sent[msg.id] = (msg.method, None)
            if msg.method == "session/prompt":
                self._prompt, self._cancelled = msg.id, False
        elif msg.method == "session/cancel":
            self._cancelled = True
        elif msg.id is not None and self._asked.pop(str(msg.id)[:MAX_ID_CHARS], None) is not None:
            try:
                chosen = _decode_answer(line).sent.result.outcome
            except (msgspec.DecodeError, msgspec.ValidationError):
                chosen = S.Outcome()  # an answer of another shape: not an allow
            allow = chosen.outcome == "selected" and chosen.optionId in self._allowing
            return [ev.PermissionAnswered(request_id=str(msg.id)[:MAX_ID_CHARS], allow=allow)]
        return []

    # --- the input side (called by the session machine) -----------------------------------------

    def opening(self, resume_id: str | None) -> bytes | None:
        """The process was (re)started: ``initialize``, then a session (new, or ``resume_id``
        loaded) when it answers."""
        session_id, dropped, stray = self.session_id, self.dropped_replay, self.stray_updates
        kept = (self._queued, self._modes, self._default_mode)
        self._reset_process()
        self.session_id, self.dropped_replay, self.stray_updates = session_id, dropped, stray
        # A prompt given before the process started; the modes of the session it may load.
        self._queued, self._modes, self._default_mode = kept
        self._resume_id = resume_id
        self._stage = "initializing"
        return self._request("initialize", _initialize_params())

    def prompt(self, text: str, images: Sequence[PromptImage] = ()) -> bytes | None:
        if self._compact is not None and (text == "/compact" or text.startswith("/compact ")):
            # The session machine's compaction prompt, in the agent's own command's name.
            text = f"/{self._compact}{text[len('/compact') :]}"
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}]
        for image in images:
            blocks.append(
                {
                    "type": "image",
                    "mimeType": image.mime_type,
                    "data": base64.b64encode(image.data).decode("ascii"),
                }
            )
        if self._stage == "ready" and not self._images:
            blocks = _without_images(blocks)  # (a prompt that waits is checked when it goes)
        return self._session_request("session/prompt", {"prompt": blocks})

    def interrupt(self, request_id: str) -> bytes | None:
        self._cancelled = True
        if self._stage != "ready" or self.session_id is None:
            # The prompt waits for the session: it is dropped; its turn ends when the session
            # exists (or the cancel's timers stop the agent).
            kept = [q for q in self._queued if q[0] != "session/prompt"]
            self._cancel_waiting = len(kept) < len(self._queued)
            self._queued = kept
            return b""
        return _line(
            {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": self.session_id}}
        )

    def permission(
        self,
        request_id: str,
        *,
        allow: bool,
        message: str = "",
        updated_input: dict[str, Any] | None = None,
        option: str | None = None,
    ) -> bytes | None:
        """The answer to ``session/request_permission`` ``request_id``: the option chosen, or
        ``cancelled`` when there is none (a timeout, a cancel, the turn ended)."""
        rpc_id = self._asked.pop(request_id, None)
        if rpc_id is None:
            return None
        outcome: dict[str, Any] = {"outcome": "cancelled"}
        if option is not None:
            outcome = {"outcome": "selected", "optionId": option}
        return _line({"jsonrpc": "2.0", "id": rpc_id, "result": {"outcome": outcome}})

    def set_mode(self, request_id: str, mode: str) -> bytes | None:
        """DPS ``plan`` → the agent's plan mode; ``default`` → the mode it started in."""
        target = self._plan_mode() if mode == "plan" else self._default_mode
        if target is None or target == self._mode:
            return None
        self._mode = target  # the agent says no current_mode_update for a switch it was asked
        return self._session_request("session/set_mode", {"modeId": target}, request_id)

    def _plan_mode(self) -> str | None:
        for mode in self._modes:
            if mode.id.lower() in _PLAN_WORDS:
                return mode.id
        return None

    def _request(self, method: str, params: dict[str, Any], machine_id: str | None = None):
        if self.replaying:
            return None
        rpc_id = self._next_id
        self._next_id += 1
        if len(self._sent) >= MAX_PENDING:
            del self._sent[next(iter(self._sent))]  # the oldest, never answered: its answer is late
        self._sent[rpc_id] = (method, machine_id)
        if method == "session/prompt":
            self._prompt, self._cancelled = rpc_id, False
        return _line({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})

    def _session_request(
        self, method: str, params: dict[str, Any], machine_id: str | None = None
    ) -> bytes | None:
        if self._stage != "ready" or self.session_id is None:
            if len(self._queued) < MAX_QUEUED:
                self._queued.append((method, (params, machine_id)))
            return b""  # written when the session exists
        return self._request(method, {"sessionId": self.session_id, **params}, machine_id)

    # --- the parser side ------------------------------------------------------------------------

    def feed(self, line: bytes) -> list[ev.AgentEvent]:
        try:
            msg = _decode_message(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as err:
            return self._not_usable(line, err) + self._answer_malformed(line)
        if msg.method is not None:
            if msg.id is None:
                if msg.method == "session/update" and msg.params is not None:
                    return self._update(msg.params, line)
                return self._unknown(msg.method, line)
            if too_deep(line, MAX_AGENT_LINE_DEPTH):
                return self._too_deep(line) + self._answer_error(msg.id, INVALID_PARAMS, "too deep")
            return self._agent_request(msg, line)
        if msg.id is not None and (len(msg.result) or msg.error is not None):
            return self._response(msg)
        return self._not_usable(
            line, ValueError("not a JSON-RPC request, notification or response")
        )

    def end(self) -> list[ev.AgentEvent]:
        """Stdout closed: the process is gone; open blocks end (the session machine ends the turn
        when it learns of the exit)."""
        out = self._close_block()
        self._stage = "closed"
        self._asked.clear()
        self._sent.clear()
        self._calls.clear()
        return out

    def _not_usable(self, line: bytes, err: Exception) -> list[ev.AgentEvent]:
        events = self._undecodable(line, err)
        if isinstance(events[0], ev.Unknown):
            # Well-formed JSON that is no JSON-RPC message: still a fault of the protocol.
            self.unknown_lines -= 1
            self.parse_errors += 1
            events = [ev.ParseError(message=str(err), line=bytes(line[:MAX_LINE_IN_EVENT]))]
        reason = events[0].message if isinstance(events[0], ev.ParseError) else str(err)
        return events + self._warn(
            "ACP_INVALID_MESSAGE", f"the agent wrote a line that is not ACP: {reason}"
        )

    def _answer_malformed(self, line: bytes) -> list[ev.AgentEvent]:
        """A request whose params are not what its method takes still gets an answer (-32602),
        so the agent does not wait for one forever."""
        try:
            envelope = _decode_envelope(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return []
        if envelope.id is None or envelope.method is None:
            return []
        return self._answer_error(envelope.id, INVALID_PARAMS, "invalid params")

    def _warn(self, code: str, message: str) -> list[ev.AgentEvent]:
        """An ``agent.error`` warning about the agent's use of the protocol (bounded per process)."""
        self._warnings += 1
        if self._warnings > MAX_PROTOCOL_WARNINGS:
            return []
        return [ev.Notice(severity="warning", code=code, message=message[:512], turnless=True)]

    # --- responses --------------------------------------------------------------------------------

    def _response(self, msg: S.Message) -> list[ev.AgentEvent]:
        sent = self._sent.pop(msg.id, None)  # type: ignore[arg-type]
        if sent is None:
            return self._warn(
                "ACP_UNEXPECTED_RESPONSE",
                f"the agent answered a request the gateway never sent (id {str(msg.id)[:64]!r})",
            )
        method, machine_id = sent
        error = msg.error
        if method == "initialize":
            return self._initialized(msg)
        if method in ("session/new", "session/load"):
            return self._session_ready(method, msg)
        if method == "session/prompt":
            return self._prompt_answered(msg)
        if machine_id is not None:
            text = error.message[:512] if error is not None else None
            return [ev.ControlAck(request_id=machine_id, ok=error is None, error=text)]
        if method == "session/set_mode" and error is None:
            return []
        return []

    def _initialized(self, msg: S.Message) -> list[ev.AgentEvent]:
        if msg.error is not None:
            return self._session_failed("initialize", msg.error.message)
        try:
            init = msgspec.json.decode(msg.result, type=S.InitializeResult)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            return self._session_failed("initialize", f"an answer of the wrong shape: {err}")
        caps = init.agentCapabilities
        self._can_load = caps.loadSession
        self._images = caps.promptCapabilities.image
        out: list[ev.AgentEvent] = []
        resume = self._resume_id
        if resume and self._can_load:
            self._stage = "loading"
            params = {"sessionId": resume, "cwd": self.workspace, "mcpServers": []}
            data = self._request("session/load", params)
        else:
            if resume:
                out += self._not_resumed("the agent does not declare loadSession")
            data = self._new_session()
        if data is not None:
            out.append(ev.StdinWrite(data=data))
        return out

    def _new_session(self) -> bytes | None:
        self._stage = "creating"
        return self._request("session/new", {"cwd": self.workspace, "mcpServers": []})

    def _not_resumed(self, why: str) -> list[ev.AgentEvent]:
        message = f"the agent's earlier conversation could not be resumed ({why}); a new one starts"
        return [
            ev.Notice(
                severity="warning",
                code="ACP_SESSION_NOT_RESUMED",
                message=message[:512],
                turnless=True,
            )
        ]

    def _session_ready(self, method: str, msg: S.Message) -> list[ev.AgentEvent]:
        if msg.error is not None:
            if method == "session/load":
                out = self._not_resumed(f"session/load failed: {msg.error.message[:200]}")
                data = self._new_session()
                return out + ([ev.StdinWrite(data=data)] if data is not None else [])
            return self._session_failed(method, msg.error.message)
        modes: S.ModeState | None = None
        try:
            if method == "session/new":
                result = msgspec.json.decode(msg.result, type=S.NewSessionResult)
                self.session_id = _cut(result.sessionId) or None
                modes = result.modes
                if result.models is not None and result.models.currentModelId:
                    self._model = _cut(result.models.currentModelId)
            else:
                if len(msg.result) and bytes(msg.result) != b"null":
                    modes = msgspec.json.decode(msg.result, type=S.LoadSessionResult).modes
                self.session_id = self._resume_id
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            return self._session_failed(method, f"an answer of the wrong shape: {err}")
        if self.session_id is None:
            return self._session_failed(method, "no sessionId in its answer")
        self._stage = "ready"
        if modes is not None:
            self._modes = modes.availableModes[:MAX_COMMANDS]
            self._mode = modes.currentModeId
            if self._default_mode is None or method == "session/new":
                self._default_mode = modes.currentModeId
        out: list[ev.AgentEvent] = [
            ev.SessionStarted(
                agent_session_id=self.session_id, model=self._model, permission_mode=self._mode
            ),
            ev.FeaturesDeclared(features={"plan_mode": self._plan_mode() is not None}),
        ]
        queued, self._queued = self._queued, []
        for method_, (params, machine_id) in queued:
            if method_ == "session/prompt" and not self._images:
                params = {"prompt": _without_images(params["prompt"])}
            data = self._request(method_, {"sessionId": self.session_id, **params}, machine_id)
            if data is not None:
                out.append(ev.StdinWrite(data=data))
        if self._cancel_waiting:
            # The prompt was cancelled before the session existed: it was never sent.
            self._cancel_waiting = False
            out.append(ev.TurnEnded(stop_reason="cancelled"))
        return out

    def _session_failed(self, method: str, why: str) -> list[ev.AgentEvent]:
        """No session: the agent cannot take prompts. A prompt that waited ends with error."""
        self._stage = "closed"
        out: list[ev.AgentEvent] = [
            ev.Notice(
                severity="error",
                code="ACP_SESSION_FAILED",
                message=f"the agent refused {method}: {why}"[:512],
                recoverable=False,
                turnless=True,
            )
        ]
        if any(q[0] == "session/prompt" for q in self._queued):
            out.append(ev.TurnEnded(stop_reason="error", is_error=True, error=why[:512]))
        self._queued = []
        return out

    def _prompt_answered(self, msg: S.Message) -> list[ev.AgentEvent]:
        self._prompt = None
        out = self._close_block()
        used, size, cost = self._context
        cancelled, self._cancelled = self._cancelled, False
        if msg.error is not None:
            if cancelled:  # an agent may answer a cancelled prompt with an error (ACP says not to)
                return out + [ev.TurnEnded(stop_reason="cancelled")]
            text = msg.error.message[:512] or f"JSON-RPC error {msg.error.code}"
            out.append(ev.Notice(severity="error", code="AGENT_ERROR", message=text))
            return out + [ev.TurnEnded(stop_reason="error", is_error=True, error=text)]
        try:
            result = msgspec.json.decode(msg.result, type=S.PromptResult)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            result = S.PromptResult(stopReason="end_turn")
            out += self._warn(
                "ACP_INVALID_MESSAGE", f"a session/prompt answer of the wrong shape: {err}"
            )
        stop, code, severity, message = _STOPS.get(
            result.stopReason,
            (
                "end_turn",
                "ACP_UNKNOWN_STOP_REASON",
                "warning",
                f"the agent ended the turn with stop reason {result.stopReason[:64]!r}",
            ),
        )
        if code is not None:
            out.append(ev.Notice(severity=severity, code=code, message=message))  # type: ignore[arg-type]
        usage = _quota_usage(result.meta)
        if result.usage is not None:
            u = result.usage
            usage = ev.UsageInfo(
                input_tokens=u.inputTokens,
                output_tokens=u.outputTokens,
                cache_read_tokens=u.cachedReadTokens,
                cache_write_tokens=u.cachedWriteTokens,
                thinking_tokens=u.thoughtTokens,
                total_tokens=u.totalTokens,
            )
        out.append(
            ev.TurnEnded(
                stop_reason=stop,  # type: ignore[arg-type]
                usage=usage,
                cost_usd=cost,
                context_window=size,
                context_used=used,
                is_error=stop == "error",
                error=message or None,
            )
        )
        return out

    # --- requests of the agent --------------------------------------------------------------------

    def _agent_request(self, msg: S.Message, line: bytes) -> list[ev.AgentEvent]:
        rpc_id = msg.id
        assert rpc_id is not None and msg.method is not None
        if msg.method == "session/request_permission" and msg.params is not None:
            return self._permission_request(rpc_id, msg.params)
        # fs/* and terminal/* are not advertised; anything else is unknown to ACP v1's client.
        return self._answer_error(
            rpc_id, METHOD_NOT_FOUND, f"method not found: {msg.method}"
        ) + self._warn(
            "ACP_UNKNOWN_METHOD",
            f"the agent asked {msg.method[:64]!r}, which the gateway does not offer; "
            "it was answered with JSON-RPC error -32601",
        )

    def _answer_error(self, rpc_id: int | str, code: int, message: str) -> list[ev.AgentEvent]:
        data = _line({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}})
        return [] if self.replaying else [ev.StdinWrite(data=data)]

    def _permission_request(self, rpc_id: int | str, params: S.Params) -> list[ev.AgentEvent]:
        key = str(rpc_id)[:MAX_ID_CHARS]
        if self._prompt is None or len(self._asked) >= MAX_PENDING:
            # Asked outside any prompt (nobody could answer it in a turn), or one too many.
            data = _line(
                {"jsonrpc": "2.0", "id": rpc_id, "result": {"outcome": {"outcome": "cancelled"}}}
            )
            out: list[ev.AgentEvent] = [] if self.replaying else [ev.StdinWrite(data=data)]
            return out + self._warn(
                "ACP_UNEXPECTED_REQUEST",
                "the agent asked for a permission outside a prompt (or with "
                f"{MAX_PENDING} waiting); it was answered cancelled",
            )
        self._asked[key] = rpc_id
        if self.replaying and len(self._allowing) < MAX_COMMANDS:
            for o in (params.options or [])[:16]:
                if o.kind.startswith("allow"):
                    self._allowing.add(o.optionId)  # to read the transcript's answer (``sent``)
        fields = params.toolCall or S.ToolCallFields()
        call_id = _cut(fields.toolCallId)
        out = self._close_block()
        call = self._merge(call_id, fields) if call_id else None
        if call is not None:
            out += self._announce(call_id, call)
        options = [
            ev.PermissionChoice(option_id=o.optionId[:MAX_ID_CHARS], name=o.name[:200], kind=o.kind)
            for o in (params.options or [])[:16]
        ]
        name = call.name if call is not None else (fields.title or "tool")
        tool_input = call.input if call is not None and call.input is not None else {}
        out.append(
            ev.PermissionRequest(
                request_id=key,
                tool_name=name or "tool",
                input=tool_input,
                call_id=call_id or None,
                affected_paths=call.locations if call is not None else [],
                options=options,
                title=(call.title if call is not None else fields.title) or None,
            )
        )
        return out

    # --- session/update ---------------------------------------------------------------------------

    def _update(self, params: S.Params, line: bytes) -> list[ev.AgentEvent]:
        update = params.update
        if update is None:
            return self._unknown("session/update", line)
        kind = update.sessionUpdate
        if self._stage == "loading":
            self.dropped_replay += 1  # the conversation replayed: masters have it already
            return []
        if kind == "agent_message_chunk" or kind == "agent_thought_chunk":
            if self._prompt is None:
                self.stray_updates += 1
                return []
            return self._chunk(kind == "agent_message_chunk", update)
        if kind == "available_commands_update":
            listed = self._commands(update.availableCommands or [])
            names = {c.name for c in listed.commands}
            compact = next((n for n in _COMPACT_COMMANDS if n in names), None)
            out: list[ev.AgentEvent] = [listed]
            if (compact is None) != (self._compact is None):
                out.append(
                    ev.FeaturesDeclared(features={"context_compaction": compact is not None})
                )
            self._compact = compact
            return out
        if kind == "current_mode_update":
            return self._mode_update(update.currentModeId or update.modeId)
        if kind == "usage_update":
            cost = update.cost
            amount = cost.amount if cost is not None and cost.currency.upper() == "USD" else None
            self._context = (update.used, update.size, amount)
            return []
        if kind == "user_message_chunk" or kind in ("session_info_update", "config_option_update"):
            return []
        if too_deep(line, MAX_AGENT_LINE_DEPTH):
            return self._too_deep(line)
        if self._prompt is None and kind in ("tool_call", "tool_call_update", "plan"):
            self.stray_updates += 1
            return []
        if kind == "tool_call" or kind == "tool_call_update":
            return self._tool(update)
        if kind == "plan":
            return self._plan(update.entries or [])
        return self._unknown(f"session/update/{kind}", line)

    def _chunk(self, text: bool, update: S.Update) -> list[ev.AgentEvent]:
        try:
            block = _decode_block(update.content) if len(update.content) else S.ContentBlock()
        except (msgspec.DecodeError, msgspec.ValidationError):
            return self._warn(
                "ACP_INVALID_MESSAGE", "a message chunk whose content is no ContentBlock"
            )
        value = _block_text(block)
        if not value:
            return []  # Claude's adapter sends an empty chunk after a tool
        kind = "text" if text else "thinking"
        out: list[ev.AgentEvent] = []
        message_id = update.messageId
        open_ = self._block
        if (
            open_ is None
            or open_[0] != kind
            or (message_id is not None and message_id != self._message_id)
        ):
            out += self._close_block()
            self._blocks += 1
            self._block = open_ = (kind, f"{kind[0]}{self._blocks}")
        self._message_id = message_id
        if text:
            out.append(ev.TextDelta(block=open_[1], text=value))
        else:
            out.append(ev.ThinkingDelta(block=open_[1], text=value))
        return out

    def _close_block(self) -> list[ev.AgentEvent]:
        block, self._block = self._block, None
        if block is None:
            return []
        kind, key = block
        return [ev.TextEnd(block=key) if kind == "text" else ev.ThinkingEnd(block=key)]

    def _commands(self, commands: list[S.Command]) -> ev.CommandsListed:
        listed = []
        for command in commands[:MAX_COMMANDS]:
            if command.name:
                description = command.description.split("\n", 1)[0][:MAX_COMMAND_DESCRIPTION]
                listed.append(
                    ev.SlashCommand(
                        name=command.name[:MAX_ID_CHARS], description=description or None
                    )
                )
        return ev.CommandsListed(commands=listed)

    def _mode_update(self, mode_id: str | None) -> list[ev.AgentEvent]:
        if not mode_id or mode_id == self._mode:
            return []
        self._mode = mode_id = mode_id[:MAX_ID_CHARS]
        dps = "plan" if mode_id == self._plan_mode() else "default"
        return [ev.ModeChanged(mode=dps, agent_mode=mode_id)]  # type: ignore[arg-type]

    def _plan(self, entries: list[dict[str, Any]]) -> list[ev.AgentEvent]:
        """The whole plan, again: one ``update_plan`` call and its structured result."""
        self._plans += 1
        call_id = f"plan-{self._plans}"
        todos = [
            {k: e.get(k) for k in ("content", "priority", "status") if k in e}
            for e in entries[:MAX_PLAN_ENTRIES]
            if isinstance(e, dict)
        ]
        return [
            *self._close_block(),
            ev.ToolCall(call_id=call_id, name=PLAN_TOOL, input={"entries": todos}),
            ev.ToolResult(call_id=call_id, is_error=False, output=todos, output_type="structured"),
        ]

    # --- tool calls -------------------------------------------------------------------------------

    def _merge(self, call_id: str, fields: S.ToolCallFields | S.Update) -> _Call:
        call = self._calls.get(call_id)
        if call is None:
            while len(self._calls) >= MAX_OPEN_CALLS:
                self._calls.popitem(last=False)  # never ended (the agent lost it)
            call = self._calls[call_id] = _Call()
        if fields.title:
            call.title = fields.title
        if fields.kind:
            call.kind = fields.kind
        meta = fields.meta or {}
        own = (
            meta.get("claudeCode", {}).get("toolName")
            if isinstance(meta.get("claudeCode"), dict)
            else None
        )
        name = fields.name or (own if isinstance(own, str) else None)
        if name:
            call.name = name[:MAX_ID_CHARS]
        if isinstance(fields.rawInput, dict) and fields.rawInput:
            call.input = fields.rawInput
        if fields.locations:
            call.locations = [loc.path for loc in fields.locations[:64] if loc.path]
        return call

    def _announce(self, call_id: str, call: _Call) -> list[ev.AgentEvent]:
        if call.announced:
            return []
        call.announced = True
        if call.name is None:
            call.name = call.kind  # the catalog knows ACP's kinds (gateway/protocol/tools.py)
        tool_input = call.input
        if tool_input is None:
            tool_input = {"title": call.title}
            if call.locations:
                tool_input["locations"] = call.locations
            call.input = tool_input
        return [ev.ToolCall(call_id=call_id, name=call.name, input=tool_input)]

    def _tool(self, update: S.Update) -> list[ev.AgentEvent]:
        call_id = _cut(update.toolCallId)
        if not call_id:
            return self._warn("ACP_INVALID_MESSAGE", "a tool call without toolCallId")
        out = self._close_block()
        call = self._merge(call_id, update)
        try:
            content = (
                _decode_tool_content(update.content)
                if len(update.content) and bytes(update.content) != b"null"
                else None
            )
        except (msgspec.DecodeError, msgspec.ValidationError):
            content = None
            out += self._warn(
                "ACP_INVALID_MESSAGE", "a tool call whose content is not ToolCallContent"
            )
        status = update.status
        if content:
            call.content = content
        ready = (
            call.input is not None or status in ("in_progress", "completed", "failed") or content
        )
        if ready:
            out += self._announce(call_id, call)
        if status in ("completed", "failed"):
            del self._calls[call_id]
            return out + [
                self._result(
                    call_id, call, status == "failed", content or call.content, update.rawOutput
                )
            ]
        if content and call.announced:
            # Output while it runs: streamed as it comes (only what is new of the text).
            text = "".join(_item_text(item) for item in content if item.type == "content")
            seen = "".join(call.streamed)
            new = text[len(seen) :] if text.startswith(seen) else text
            if new:
                call.streamed.append(new)
                stream = "stdout" if call.kind == "execute" else "progress"
                out.append(ev.ToolOutput(call_id=call_id, chunk=new, stream=stream))  # type: ignore[arg-type]
        return out

    def _result(
        self,
        call_id: str,
        call: _Call,
        failed: bool,
        content: list[S.ToolCallContent] | None,
        raw_output: Any,
    ) -> ev.ToolResult:
        items = content or []
        diffs = [_diff(item) for item in items if item.type == "diff"]
        texts = [_item_text(item) for item in items if item.type == "content"]
        binary = [
            ev.BinaryData(
                data=item.content.data,
                mime_type=item.content.mimeType or "application/octet-stream",
            )
            for item in items
            if item.type == "content"
            and item.content is not None
            and item.content.type == "image"
            and item.content.data
        ]
        text = _unfence("".join(texts)) if texts else "".join(call.streamed)
        if failed:
            return ev.ToolResult(
                call_id=call_id,
                is_error=True,
                output=text or _raw_text(raw_output) or "the tool failed",
            )
        if diffs:
            return ev.ToolResult(
                call_id=call_id,
                is_error=False,
                output="".join(diffs),
                output_type="diff",
                changed=True,
            )
        kind = call.kind
        if kind in _WRITE_KINDS:
            return ev.ToolResult(
                call_id=call_id,
                is_error=False,
                output=text,
                output_type="text" if text else "empty",
            )
        if kind == "search" and not text and call.locations:
            return ev.ToolResult(
                call_id=call_id,
                is_error=False,
                output=call.locations,
                output_type="file_list",
                listing=True,
            )
        printed = _output_of(raw_output) if not text else None
        if printed is not None:
            text = printed  # Codex: the command's own output is in rawOutput
        elif not text and raw_output is not None and not binary:
            return ev.ToolResult(
                call_id=call_id,
                is_error=False,
                output=raw_output,
                output_type="structured" if not isinstance(raw_output, str) else "text",
            )
        return ev.ToolResult(
            call_id=call_id,
            is_error=False,
            output=text,
            output_type=_KIND_OUTPUT.get(kind, "text") if text or binary else "empty",
            binary=binary,
        )


# --- the agent's saved sessions: session/list, session/load's replay ----------------------------------

RESOURCE_NOT_FOUND: Final = -32002  # ACP's "Resource not found": what the real agents answer a load
MAX_SESSION_ID_CHARS: Final = 256  # a listed id (as resume_conversation takes it); longer: left out
MAX_LIST_PAGES: Final = 20  # session/list pages asked for one listing
MAX_SESSIONS_READ: Final = 5000  # sessions of all pages kept for one listing (then cut, sorted)
LIST_ANSWER_BYTES: Final = 8 << 20  # all the agent writes while it is asked for a listing
REPLAY_BYTES: Final = 16 << 20  # of a session/load's replay kept (beyond it the history is partial)
_REPLAYED: Final = (
    ev.TextDelta,
    ev.TextEnd,
    ev.ThinkingDelta,
    ev.ThinkingEnd,
    ev.ToolCall,
    ev.ToolOutput,
    ev.ToolResult,
)
# What agents replay as user messages that the user never typed: Claude Code's records of local
# slash commands (``/model`` on start), Gemini CLI's context of the session
_NOT_PROMPTS: Final = ("<command-name>", "<local-command-", "<session_context>")
# Gemini CLI answers a load of a session it does not know with -32603 and these details
_UNKNOWN_SESSION_DETAILS: Final = ("Invalid session identifier", "No previous sessions found")


class StoreQuery:
    """One question about the agent's saved sessions, asked of a short-lived agent process of its
    own: the sessions of a workspace (``session/list``, page after page), or the conversation of
    one (``load``: the ``session/update`` notifications the agent replays while it answers
    ``session/load``, translated as a live turn's are, one turn per user message).

    Sans-IO: ``opening()`` and ``feed(line)`` return the bytes to write to the agent; once
    ``done`` (``finish()`` when the agent is silent for a while after ``settling``: its answer to
    ``session/load`` came), ``failure`` is ``(kind, message)`` with kind ``unsupported`` (the agent does not
    declare the method), ``not_found`` (the agent does not know the session) or ``agent`` (it
    refused, or answered something that is not ACP), else the answer is ``listed`` and
    ``complete``, or ``transcript``. The shell owns the process, the clock, and ``cut`` (a line
    too long to be read)."""

    def __init__(self, workspace: str, *, limit: int = 50, load: str | None = None) -> None:
        self.workspace = workspace
        self.limit = limit
        self.load_id = load
        self.done = False
        self.failure: tuple[str, str] | None = None
        self.listed: list[Summary] = []
        self.complete = True
        self.transcript: Transcript | None = None
        self.settling = False  # session/load answered: the replay may still come
        self._loading = False  # session/load asked: updates are the replay
        self._next_id = 0
        self._waiting: tuple[int, str] | None = None  # (id, method) of the request out
        self._pages = 0
        self._found: list[S.SessionInfo] = []
        self._bytes = 0
        self._bad_lines = 0
        # the replay: an adapter that translates updates as in a prompt, and writes nothing
        self._adapter = AcpAdapter()
        self._adapter.translate_only()
        self._turns: list[ReplayedTurn] = []
        self._prompt: list[str] | None = None  # the user message of the turn being read
        self._events: list[ev.AgentEvent] = []
        self._left_out = 0  # updates not understood, or past REPLAY_BYTES
        self._user_last = False

    @property
    def method(self) -> str:
        return "session/load" if self.load_id is not None else "session/list"

    def opening(self) -> bytes:
        return self._request("initialize", _initialize_params())

    def _request(self, method: str, params: dict[str, Any]) -> bytes:
        rpc_id = self._next_id
        self._next_id += 1
        self._waiting = (rpc_id, method)
        return _line({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})

    def _fail(self, kind: str, message: str) -> bytes:
        self.done, self.failure = True, (kind, message[:512])
        return b""

    def cut(self, size: int) -> bytes:
        """A line of ``size`` bytes was too long to be read."""
        if self.load_id is not None:
            self._bytes += size
            self._left_out += 1
            return b""
        return self._fail("agent", f"the agent wrote a line of {size} bytes while listing")

    def feed(self, line: bytes) -> bytes:
        if self.done:
            return b""
        self._bytes += len(line)
        if self.load_id is None and self._bytes > LIST_ANSWER_BYTES:
            return self._fail("agent", f"the agent's answer passed {LIST_ANSWER_BYTES} bytes")
        try:
            msg = _decode_message(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            self._bad_lines += 1
            if self._bad_lines > MAX_PROTOCOL_WARNINGS:
                return self._fail("agent", "the agent writes lines that are not JSON-RPC")
            return b""
        if msg.method is not None and msg.id is not None:
            # Nothing is asked of this client: a permission is cancelled, the rest unknown.
            if msg.method == "session/request_permission":
                result = {"outcome": {"outcome": "cancelled"}}
                return _line({"jsonrpc": "2.0", "id": msg.id, "result": result})
            error = {"code": METHOD_NOT_FOUND, "message": f"method not found: {msg.method[:64]}"}
            return _line({"jsonrpc": "2.0", "id": msg.id, "error": error})
        if msg.method == "session/update" and msg.params is not None:
            if self._loading:
                self._replayed(msg.params, line)
            return b""
        if msg.method is not None or self._waiting is None or msg.id != self._waiting[0]:
            return b""  # a notification, or an answer to nothing asked
        method = self._waiting[1]
        self._waiting = None
        if msg.error is not None:
            said = _error_text(msg.error)
            if method == "session/load" and _unknown_session(msg.error):
                return self._fail("not_found", said)
            return self._fail("agent", f"the agent refused {method}: {said}")
        if method == "initialize":
            return self._initialized(msg)
        if method == "session/list":
            return self._page(msg)
        # Loaded. Gemini CLI replays the conversation after it answers: what comes until the
        # agent falls silent is read too (the shell calls ``finish`` then).
        self.settling = True
        return b""

    def finish(self) -> None:
        """The agent fell silent after it answered ``session/load`` (or ended): the replay is
        complete."""
        if not self.settling or self.done:
            return
        self._loading = False
        self._finish_turn()
        problem = None
        if self._left_out:
            problem = (
                f"{self._left_out} replayed updates of the conversation could not be shown "
                f"(not understood, or past {REPLAY_BYTES} bytes)"
            )
        self.transcript = Transcript(self._turns, partial=problem is not None, problem=problem)
        self.done = True

    def _initialized(self, msg: S.Message) -> bytes:
        try:
            caps = msgspec.json.decode(msg.result, type=S.InitializeResult).agentCapabilities
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            return self._fail("agent", f"an initialize answer of the wrong shape: {err}")
        if self.load_id is not None:
            if not caps.loadSession:
                return self._fail("unsupported", "the agent does not declare loadSession")
            params = {"sessionId": self.load_id, "cwd": self.workspace, "mcpServers": []}
            self._loading = True
            return self._request("session/load", params)
        if not isinstance((caps.sessionCapabilities or {}).get("list"), dict):
            return self._fail("unsupported", "the agent does not declare sessionCapabilities.list")
        return self._request("session/list", {"cwd": self.workspace})

    def _page(self, msg: S.Message) -> bytes:
        try:
            page = msgspec.json.decode(msg.result, type=S.ListSessionsResult)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            return self._fail("agent", f"a session/list answer of the wrong shape: {err}")
        self._pages += 1
        workspace = self.workspace.rstrip("/") or "/"
        for info in page.sessions:
            if len(self._found) >= MAX_SESSIONS_READ:
                self.complete = False
                break
            usable = (
                0 < len(info.sessionId) <= MAX_SESSION_ID_CHARS and info.sessionId.isprintable()
            )
            if usable and (info.cwd.rstrip("/") or "/") == workspace:
                self._found.append(info)
        more = bool(page.nextCursor)
        if more and self.complete and self._pages < MAX_LIST_PAGES:
            return self._request("session/list", {"cwd": self.workspace, "cursor": page.nextCursor})
        if more:
            self.complete = False
        # Newest first; the agent's order is not promised (sessions without a time last).
        found = sorted(self._found, key=lambda s: _instant(s.updatedAt), reverse=True)
        if len(found) > self.limit:
            found, self.complete = found[: self.limit], False
        self.listed = [
            Summary(
                id=s.sessionId,
                title=title_of(s.title) if s.title else None,
                updated_at=_iso(s.updatedAt),
                turns=None,
            )
            for s in found
        ]
        self.done = True
        return b""

    def _replayed(self, params: S.Params, line: bytes) -> None:
        update = params.update
        if update is None:
            self._left_out += 1
            return
        if self._bytes > REPLAY_BYTES:
            self._left_out += 1
            return
        if update.sessionUpdate == "user_message_chunk":
            try:
                text = _block_text(_decode_block(update.content)) if len(update.content) else ""
            except (msgspec.DecodeError, msgspec.ValidationError):
                self._left_out += 1
                return
            if text.startswith(_NOT_PROMPTS):
                return
            if not self._user_last:
                self._finish_turn()
                self._prompt = []
            assert self._prompt is not None
            self._prompt.append(text)
            self._user_last = True
            return
        events = self._adapter.feed(line)
        self._user_last = self._user_last and not events
        for event in events:
            if isinstance(event, _REPLAYED):
                self._events.append(event)
                self._user_last = False
            elif isinstance(event, ev.Notice | ev.Unknown | ev.ParseError):
                self._left_out += 1

    def _finish_turn(self) -> None:
        """The turn read so far, when there is one, ends: a new user message begins the next."""
        self._events += self._adapter._close_block()
        if self._prompt is None and not self._events:
            return
        prompt = "".join(self._prompt) if self._prompt is not None else None
        self._turns.append(
            ReplayedTurn(prompt, [*self._events, ev.TurnEnded(stop_reason="end_turn")])
        )
        self._prompt, self._events = None, []


def _error_text(error: S.RpcError) -> str:
    """A JSON-RPC error's message, with its ``data.details`` (Gemini CLI says what it means there)."""
    details = error.data.get("details") if isinstance(error.data, dict) else None
    if isinstance(details, str) and details:
        return f"{error.message}: {details.splitlines()[0]}"
    return error.message


def _unknown_session(error: S.RpcError) -> bool:
    """A ``session/load`` refused because the agent knows no such session."""
    if error.code == RESOURCE_NOT_FOUND:
        return True
    details = error.data.get("details") if isinstance(error.data, dict) else None
    return isinstance(details, str) and details.startswith(_UNKNOWN_SESSION_DETAILS)


def _initialize_params() -> dict[str, Any]:
    return {
        "protocolVersion": S.PROTOCOL_VERSION,
        "clientCapabilities": {
            "fs": {"readTextFile": False, "writeTextFile": False},
            "terminal": False,
        },
        "clientInfo": {"name": CLIENT_NAME, "title": "RAWP gateway", "version": CLIENT_VERSION},
    }


def _instant(stamp: str | None) -> float:
    """An ISO 8601 time as seconds since the epoch (0: none, or not a time)."""
    if not stamp:
        return 0.0
    try:
        moment = datetime.fromisoformat(stamp[:64].replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    except (ValueError, OverflowError, OSError):
        return 0.0


def _iso(stamp: str | None) -> str | None:
    """The agent's time of last activity as the listing's ISO 8601 (UTC, seconds)."""
    return iso_time(_instant(stamp))


# --- pure helpers -----------------------------------------------------------------------------------


def _block_text(block: S.ContentBlock) -> str:
    """What a ContentBlock says as text: its text, a resource's text, a link's URI."""
    if block.type == "text":
        return block.text or ""
    if block.type == "resource_link":
        return f"[{block.name or block.uri}]({block.uri})" if block.uri else ""
    if block.type == "resource" and block.resource is not None:
        text = block.resource.get("text")
        return text if isinstance(text, str) else ""
    return ""


def _item_text(item: S.ToolCallContent) -> str:
    return _block_text(item.content) if item.content is not None else ""


def _unfence(text: str) -> str:
    """A tool's output the agent wrapped in one Markdown code fence (Gemini: "```console\\nhi\\n```")
    without it: masters get the output itself."""
    if text.startswith("```") and text.rstrip().endswith("```"):
        body = text.rstrip()[3:-3]
        first, sep, rest = body.partition("\n")
        if sep and "```" not in rest and " " not in first.strip():
            return rest
    return text


def _without_images(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A prompt for an agent that declared no image prompts (ACP forbids sending it images): the
    images are named in the text instead."""
    images = [b["mimeType"] for b in blocks if b["type"] == "image"]
    if not images:
        return blocks
    text = (
        blocks[0]["text"]
        + f"\n\n(Attached images not sent: this agent takes no images: {', '.join(images)})"
    )
    return [{"type": "text", "text": text}]


def _quota_usage(meta: dict[str, Any] | None) -> ev.UsageInfo | None:
    """Gemini's token counts of a turn: ``_meta.quota.token_count`` of the prompt's answer."""
    quota = meta.get("quota") if meta else None
    counts = quota.get("token_count") if isinstance(quota, dict) else None
    if not isinstance(counts, dict):
        return None
    tokens = {k: v for k, v in counts.items() if type(v) is int and v >= 0}
    return ev.UsageInfo(
        input_tokens=tokens.get("input_tokens", 0), output_tokens=tokens.get("output_tokens", 0)
    )


_OUTPUT_KEYS: Final = ("formatted_output", "aggregated_output", "output", "stdout")


def _output_of(raw: Any) -> str | None:
    """A tool's printed output from its ``rawOutput`` object, where it has one (None: it has
    none; "" is a command that printed nothing)."""
    if not isinstance(raw, dict):
        return None
    found = [raw[k] for k in _OUTPUT_KEYS if isinstance(raw.get(k), str)]
    return next((v for v in found if v), found[0] if found else None)


def _raw_text(raw: Any) -> str:
    if raw is None:
        return ""
    return raw if isinstance(raw, str) else _encode(raw).decode()[:4096]


def _diff(item: S.ToolCallContent) -> str:
    """A ``diff`` item as a unified diff of ``path`` (``oldText`` null: a new file)."""
    return text_diff(item.path or "file", item.oldText, item.newText or "")


SPEC: Final = ParserSpec(
    name="acp",
    parser=AcpAdapter,
    input=AcpAdapter,
    converses=True,
    description="Any Agent Client Protocol agent (JSON-RPC over stdio; the gateway is its client)",
    # What ACP can carry; each agent's initialize and session/new answers narrow it at run time
    # (plan_mode when it lists a plan mode).
    features=frozenset({"thinking_stream", "tool_streaming", "plan_mode"}),
)
