"""Saved sessions (``StoreQuery``): a short-lived process of the agent, asked ``session/list`` (page
by page) or ``session/load`` of one session, whose replay is translated by an adapter of its own
into the turns of a ``Transcript`` (docs/acp-mapping.md, "Saved sessions"). Sans-IO, as the
adapter is: ``gateway/agent/conversations/ask_acp.py`` runs the process.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from .. import events as ev
from ..saved import ReplayedTurn, Summary, Transcript, iso_time, title_of
from . import schema as S
from .adapter import (
    MAX_PROTOCOL_WARNINGS,
    METHOD_NOT_FOUND,
    AcpAdapter,
    decode_block,
    decode_message,
    initialize_params,
    json_line,
)
from .content import block_text

__all__ = ["LIST_ANSWER_BYTES", "REPLAY_BYTES", "StoreQuery"]

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
        return self._request("initialize", initialize_params())

    def _request(self, method: str, params: dict[str, Any]) -> bytes:
        rpc_id = self._next_id
        self._next_id += 1
        self._waiting = (rpc_id, method)
        return json_line({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})

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
            msg = decode_message(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            self._bad_lines += 1
            if self._bad_lines > MAX_PROTOCOL_WARNINGS:
                return self._fail("agent", "the agent writes lines that are not JSON-RPC")
            return b""
        if msg.method is not None and msg.id is not None:
            # Nothing is asked of this client: a permission is cancelled, the rest unknown.
            if msg.method == "session/request_permission":
                result = {"outcome": {"outcome": "cancelled"}}
                return json_line({"jsonrpc": "2.0", "id": msg.id, "result": result})
            error = {"code": METHOD_NOT_FOUND, "message": f"method not found: {msg.method[:64]}"}
            return json_line({"jsonrpc": "2.0", "id": msg.id, "error": error})
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
            # Only read back, never prompted: no MCP server of the session's is started for it.
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
                text = block_text(decode_block(update.content)) if len(update.content) else ""
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
