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
   the adapter asks ``session/new`` (cwd = the workspace, the session's MCP servers of the kinds
   the agent declared in ``mcpCapabilities``: ``set_mcp_servers``), or ``session/load`` of
   ``resume_id`` (with the same servers: ACP keeps none across a load) when the agent declared
   ``loadSession``. A server of a kind the agent does not take is reported failed
   (``SessionStarted.mcp_servers``), the others ``pending``: no pinned agent says more. A load's
   replay of the conversation is dropped (masters have those frames already); a load refused, or
   an agent without ``loadSession``, gets a new session and an ``ACP_SESSION_NOT_RESUMED``
   warning.
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

A transcript (``rawp-gateway translate``): ``read_transcript()`` makes the adapter write nothing of
its own; the transcript's client lines (``{"sent": <message>}``) are given to ``sent`` so answers
are read as they were.

This module is large on purpose: ``AcpAdapter`` is one state machine (the process's stage, the
requests either side has open, the open block and tool calls, the queued writes) whose every
transition reads and changes the same state, so it is kept whole, where one reader sees every
transition (as h11 keeps its in ``_state.py``). What needs none of that state is elsewhere:
content conversions in ``content.py``, saved sessions in ``store_query.py``.
"""

from __future__ import annotations

import base64
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final

import msgspec

from .. import events as ev
from .. import numbers
from ..base import (
    MAX_LINE_IN_EVENT,
    JsonLinesParser,
    Opens,
    PromptImage,
    ReadsWorkspace,
    TakesImages,
    TakesMcpServers,
)
from ..json_depth import MAX_AGENT_LINE_DEPTH, too_deep
from . import schema as S
from .content import AcpToolCall, block_text, item_text, quota_usage, tool_result, without_images

__all__ = [
    "MAX_OPEN_CALLS",
    "MAX_PENDING",
    "MAX_PROTOCOL_WARNINGS",
    "AcpAdapter",
    "decode_block",
    "decode_message",
    "initialize_params",
    "json_line",
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
decode_message: Final = msgspec.json.Decoder(S.Message).decode
_decode_envelope: Final = msgspec.json.Decoder(S.Envelope).decode
_decode_sent: Final = msgspec.json.Decoder(S.Sent).decode
_decode_answer: Final = msgspec.json.Decoder(S.SentAnswer).decode
decode_block: Final = msgspec.json.Decoder(S.ContentBlock).decode
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
_PLAN_WORDS: Final = ("plan", "architect")
# Gemini CLI 0.61.0's title of a call to an MCP tool, e.g. "peek (probe MCP Server)".
_GEMINI_MCP_TITLE: Final = re.compile(r"(\S+) \((\S+) MCP Server\)")
_COMPACT_COMMANDS: Final = ("compact", "compress")  # Claude's, Gemini's


def json_line(message: dict[str, Any]) -> bytes:
    return _encode(message) + b"\n"


def _cut(text: str | None) -> str:
    return (text or "")[:MAX_ID_CHARS]


class AcpAdapter(JsonLinesParser, ReadsWorkspace, Opens, TakesImages, TakesMcpServers):
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
        self.mcp_servers: list[dict[str, Any]] = []  # the session's, in ACP's shapes
        self._server_names: set[str] = set()
        self.reading_transcript = False
        self.session_id: str | None = None  # the ACP session, kept across processes (resume)
        self.dropped_load_updates = 0  # updates of a session/load's replay, not passed on
        self.stray_updates = 0  # content outside any prompt, not passed on
        self._compact: str | None = None  # the agent's compaction command, when it lists one
        self._model: str | None = None  # session/new's models.currentModelId
        self._reset_process()

    def _reset_process(self) -> None:
        self._next_id = 0
        self._sent: dict[int | str, tuple[str, str | None]] = {}  # id → (method, machine's id)
        self._asked: dict[str, int | str] = {}  # the agent's open requests: str(id) → id
        self._allowing: set[str] = set()  # option ids that allow (a transcript's answers)
        self._stage = "closed"  # closed, initializing, creating, loading, ready
        self._resume_id: str | None = None
        self._can_load = False
        self._images = False
        self._offered: list[dict[str, Any]] = []  # mcp_servers of the kinds the agent declared
        self._mcp_report: list[ev.McpServer] = []
        self._queued: list[tuple[str, Any]] = []
        self._modes: list[S.Mode] = []
        self._mode: str | None = None
        self._default_mode: str | None = None
        self._prompt: int | str | None = None  # the session/prompt in flight
        self._cancelled = False
        self._cancel_waiting = False
        self._said = False  # the prompt in flight has had content (text, thought, tool, plan)
        self._after_cancel = False  # the last prompt answered was cancelled
        self._warnings = 0
        self._context: tuple[int | None, int | None, float | None] = (None, None, None)
        self._calls: OrderedDict[str, AcpToolCall] = OrderedDict()
        self._block: tuple[str, str] | None = None  # (kind, key) of the open text/thought block
        self._blocks = 0
        self._message_id: str | None = None
        self._plans = 0

    # --- set-up ---------------------------------------------------------------------------------

    def set_workspace(self, workspace: str) -> None:
        """``ReadsWorkspace``: the session's cwd, sent as ``cwd`` (ACP wants an absolute path)."""
        self.workspace = workspace

    def set_mcp_servers(self, servers: Sequence[Mapping[str, Any]]) -> None:
        """``TakesMcpServers``: the session's MCP servers, in ACP's shapes (stdio without a
        ``type``, ``"type": "http"``), given in every ``session/new`` and ``session/load``."""
        self.mcp_servers = [dict(server) for server in servers]
        self._server_names = {str(server.get("name")) for server in self.mcp_servers}

    def read_transcript(self) -> None:
        """A recorded transcript is read: nothing is written, the client's lines come by ``sent``."""
        self.reading_transcript = True

    def translate_only(self) -> None:
        """Updates are read as in a prompt and nothing is written (``StoreQuery``'s replay)."""
        self.reading_transcript = True
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
                self._prompt, self._cancelled, self._said = msg.id, False, False
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
        session_id, dropped, stray = self.session_id, self.dropped_load_updates, self.stray_updates
        kept = (self._queued, self._modes, self._default_mode)
        self._reset_process()
        self.session_id, self.dropped_load_updates, self.stray_updates = session_id, dropped, stray
        # A prompt given before the process started; the modes of the session it may load.
        self._queued, self._modes, self._default_mode = kept
        self._resume_id = resume_id
        self._stage = "initializing"
        return self._request("initialize", initialize_params())

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
            blocks = without_images(blocks)  # (a prompt that waits is checked when it goes)
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
        return json_line(
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
        return json_line({"jsonrpc": "2.0", "id": rpc_id, "result": {"outcome": outcome}})

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
        if self.reading_transcript:
            return None
        rpc_id = self._next_id
        self._next_id += 1
        if len(self._sent) >= MAX_PENDING:
            del self._sent[next(iter(self._sent))]  # the oldest, never answered: its answer is late
        self._sent[rpc_id] = (method, machine_id)
        if method == "session/prompt":
            self._prompt, self._cancelled, self._said = rpc_id, False, False
        return json_line({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})

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
            msg = decode_message(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as err:
            again = self._read_again(line, err)
            if again is not None:
                return again
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
        self._offer_servers(caps.mcpCapabilities)
        out: list[ev.AgentEvent] = []
        resume = self._resume_id
        if resume and self._can_load:
            self._stage = "loading"
            params = {"sessionId": resume, "cwd": self.workspace, "mcpServers": self._offered}
            data = self._request("session/load", params)
        else:
            if resume:
                out += self._not_resumed("the agent does not declare loadSession")
            data = self._new_session()
        if data is not None:
            out.append(ev.StdinWrite(data=data))
        return out

    def _offer_servers(self, caps: S.McpCapabilities) -> None:
        """The session's servers of the kinds the agent declared (stdio always) are offered; each
        other is reported failed, and the session goes on without it. The agent says nothing of
        the ones it starts (none of the three pinned ones does): they stay ``pending``."""
        taken = {"stdio": True, "http": caps.http, "sse": caps.sse}
        self._offered, self._mcp_report = [], []
        for server in self.mcp_servers:
            kind = server.get("type", "stdio")
            name = str(server.get("name", ""))
            if taken.get(kind, False):
                self._offered.append(server)
                self._mcp_report.append(ev.McpServer(name=name, status="pending"))
            else:
                why = f"the agent does not take {kind} servers"
                self._mcp_report.append(ev.McpServer(name=name, status="failed", error=why))

    def _new_session(self) -> bytes | None:
        self._stage = "creating"
        return self._request("session/new", {"cwd": self.workspace, "mcpServers": self._offered})

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
                notice = self._not_resumed(f"session/load failed: {msg.error.message[:200]}")
                data = self._new_session()
                return notice + ([ev.StdinWrite(data=data)] if data is not None else [])
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
                agent_session_id=self.session_id,
                model=self._model,
                permission_mode=self._mode,
                mcp_servers=list(self._mcp_report),
            ),
            ev.FeaturesDeclared(features={"plan_mode": self._plan_mode() is not None}),
        ]
        queued, self._queued = self._queued, []
        for method_, (params, machine_id) in queued:
            if method_ == "session/prompt" and not self._images:
                params = {"prompt": without_images(params["prompt"])}
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
        after_cancel, self._after_cancel = self._after_cancel, cancelled
        if msg.error is not None:
            if cancelled:  # an agent may answer a cancelled prompt with an error (ACP says not to)
                return out + [ev.TurnEnded(stop_reason="cancelled")]
            text = msg.error.message[:512] or f"JSON-RPC error {msg.error.code}"
            out.append(ev.Notice(severity="error", code="AGENT_ERROR", message=text))
            return out + [ev.TurnEnded(stop_reason="error", is_error=True, error=text)]
        odd = numbers.OddFields()
        try:
            result = _prompt_result(msg.result, odd)
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
        elif stop == "end_turn" and after_cancel and not self._said:
            # Said, not hidden: the agent's answer may come with the next prompt (claude-agent-acp
            # 0.23.1 answers the prompt after a cancel at once and gives its answer one turn late).
            out.append(
                ev.Notice(
                    severity="warning",
                    code="ACP_EMPTY_TURN",
                    message="the agent ended the turn without answering, right after a cancelled "
                    "turn; its answer may come with the next prompt",
                )
            )
        usage = quota_usage(result.meta)
        if result.usage is not None:
            u = result.usage
            usage = ev.UsageInfo(
                input_tokens=odd.count(u.inputTokens, "usage.inputTokens") or 0,
                output_tokens=odd.count(u.outputTokens, "usage.outputTokens") or 0,
                cache_read_tokens=odd.count(u.cachedReadTokens, "usage.cachedReadTokens"),
                cache_write_tokens=odd.count(u.cachedWriteTokens, "usage.cachedWriteTokens"),
                thinking_tokens=odd.count(u.thoughtTokens, "usage.thoughtTokens"),
                total_tokens=odd.count(u.totalTokens, "usage.totalTokens"),
            )
        if odd.names:
            out.append(ev.OddNumbers(kind="session/prompt", fields=odd.names))
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
        data = json_line(
            {"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}}
        )
        return [] if self.reading_transcript else [ev.StdinWrite(data=data)]

    def _permission_request(self, rpc_id: int | str, params: S.Params) -> list[ev.AgentEvent]:
        key = str(rpc_id)[:MAX_ID_CHARS]
        if self._prompt is None or len(self._asked) >= MAX_PENDING:
            # Asked outside any prompt (nobody could answer it in a turn), or one too many.
            data = json_line(
                {"jsonrpc": "2.0", "id": rpc_id, "result": {"outcome": {"outcome": "cancelled"}}}
            )
            out: list[ev.AgentEvent] = [] if self.reading_transcript else [ev.StdinWrite(data=data)]
            return out + self._warn(
                "ACP_UNEXPECTED_REQUEST",
                "the agent asked for a permission outside a prompt (or with "
                f"{MAX_PENDING} waiting); it was answered cancelled",
            )
        self._asked[key] = rpc_id
        self._said = True
        if self.reading_transcript and len(self._allowing) < MAX_COMMANDS:
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
                kind=(call.kind if call is not None else fields.kind) or None,
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
            self.dropped_load_updates += 1  # the conversation replayed: masters have it already
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
            odd = numbers.OddFields()
            cost = update.cost
            usd = cost is not None and cost.currency.upper() == "USD"
            amount = odd.cost(cost.amount, "cost.amount") if usd and cost is not None else None
            used, size = odd.count(update.used, "used"), odd.count(update.size, "size")
            self._context = (used, size, amount)
            return (
                [ev.OddNumbers(kind="session/update/usage_update", fields=odd.names)]
                if (odd.names)
                else []
            )
        if kind == "user_message_chunk" or kind in ("session_info_update", "config_option_update"):
            return []
        if too_deep(line, MAX_AGENT_LINE_DEPTH):
            return self._too_deep(line)
        if self._prompt is None and kind in ("tool_call", "tool_call_update", "plan"):
            self.stray_updates += 1
            return []
        if kind == "tool_call" or kind == "tool_call_update":
            self._said = True
            return self._tool(update)
        if kind == "plan":
            self._said = True
            return self._plan(update.entries or [])
        return self._unknown(f"session/update/{kind}", line)

    def _chunk(self, text: bool, update: S.Update) -> list[ev.AgentEvent]:
        try:
            block = decode_block(update.content) if len(update.content) else S.ContentBlock()
        except (msgspec.DecodeError, msgspec.ValidationError):
            return self._warn(
                "ACP_INVALID_MESSAGE", "a message chunk whose content is no ContentBlock"
            )
        value = block_text(block)
        if not value:
            return []  # Claude's adapter sends an empty chunk after a tool
        self._said = True
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

    def _merge(self, call_id: str, fields: S.ToolCallFields | S.Update) -> AcpToolCall:
        call = self._calls.get(call_id)
        if call is None:
            while len(self._calls) >= MAX_OPEN_CALLS:
                self._calls.popitem(last=False)  # never ended (the agent lost it)
            call = self._calls[call_id] = AcpToolCall()
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

    def _announce(self, call_id: str, call: AcpToolCall) -> list[ev.AgentEvent]:
        if call.announced:
            return []
        call.announced = True
        if call.name is None:
            # An MCP tool of the session's servers by the name every agent's has
            # (mcp__<server>__<tool>), so a permission rule names it alike; else ACP's kind, which
            # the catalog knows (gateway/protocol/tools.py).
            call.name = self._mcp_tool(call) or call.kind
        tool_input = call.input
        if tool_input is None:
            tool_input = {"title": call.title}
            if call.locations:
                tool_input["locations"] = call.locations
            call.input = tool_input
        return [ev.ToolCall(call_id=call_id, name=call.name, input=tool_input)]

    def _mcp_tool(self, call: AcpToolCall) -> str | None:
        """``mcp__<server>__<tool>`` of a call to a tool of one of the session's servers, as the
        pinned agents show one: codex-acp's ``rawInput`` ``{"server", "tool", "arguments"}``,
        Gemini's title ``"<tool> (<server> MCP Server)"``; None for any other call."""
        raw = call.input or {}
        server, tool = raw.get("server"), raw.get("tool")
        if not (isinstance(server, str) and isinstance(tool, str)):
            found = _GEMINI_MCP_TITLE.fullmatch(call.title)
            server, tool = (found.group(2), found.group(1)) if found else (None, None)
        if server is None or tool is None or server not in self._server_names or not tool:
            return None
        return f"mcp__{server}__{tool}"[:MAX_ID_CHARS]

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
        if status:
            call.status = status[:MAX_ID_CHARS]
        if content is not None:
            # ACP: a content list replaces the call's earlier one, an empty list too (Gemini's
            # shell reports a note when it starts and completes with none).
            call.content = content
        ready = (
            call.input is not None or status in ("in_progress", "completed", "failed") or content
        )
        if ready:
            out += self._announce(call_id, call)
        if status in ("completed", "failed"):
            del self._calls[call_id]
            return out + [
                tool_result(call_id, call, status == "failed", call.content, update.rawOutput)
            ]
        if (
            content
            and call.announced
            and call.status == "in_progress"
            and update.sessionUpdate == "tool_call_update"
        ):
            # Output while it runs: streamed as it comes (only what is new of the text). Content
            # of a call not yet running (Claude's Bash description, with no status while the call
            # is pending) or given when it is announced (Gemini's working-directory note) says
            # what the call is, not what it printed. An update without a status leaves the
            # call's status as it was (ACP sends only what changed).
            text = "".join(item_text(item) for item in content if item.type == "content")
            seen = "".join(call.streamed)
            new = text[len(seen) :] if text.startswith(seen) else text
            if new:
                call.streamed.append(new)
                stream = "stdout" if call.kind == "execute" else "progress"
                out.append(ev.ToolOutput(call_id=call_id, chunk=new, stream=stream))  # type: ignore[arg-type]
        return out


def initialize_params() -> dict[str, Any]:
    return {
        "protocolVersion": S.PROTOCOL_VERSION,
        "clientCapabilities": {
            "fs": {"readTextFile": False, "writeTextFile": False},
            "terminal": False,
        },
        "clientInfo": {"name": CLIENT_NAME, "title": "RAWP gateway", "version": CLIENT_VERSION},
    }


def _prompt_result(raw: msgspec.Raw, odd: numbers.OddFields) -> S.PromptResult:
    """A prompt's answer; a number in it msgspec cannot decode (``1e400``: the message around it
    skipped it unread) is read as null and named in ``odd``, so the stop reason is not lost."""
    try:
        return msgspec.json.decode(raw, type=S.PromptResult)
    except msgspec.DecodeError:
        again = numbers.without_odd_numbers(bytes(raw))
        if again is None:
            raise
        fixed, names = again
        odd.names += [f"result.{name}" for name in names]
        return msgspec.json.decode(fixed, type=S.PromptResult)
