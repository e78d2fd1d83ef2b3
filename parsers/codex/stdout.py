"""Codex CLI (0.171.0) ``codex exec --json``: stdout lines → agent events.

Theory of operation
-------------------
``CodexParser.feed(line)`` decodes each line once with one msgspec decoder over a tagged union of
the line kinds (``type``: ``thread.started``, ``turn.started``, ``item.started``, ``item.updated``,
``item.completed``, ``turn.completed``, ``turn.failed``, ``error``). A line that is not JSON, or a
known kind of the wrong shape, becomes ``ParseError``; a well-formed line of another kind (or an item
type this parser does not know) becomes ``Unknown``. Nothing raises.

What the CLI prints and what it becomes (facts: the recorded fixtures under ``tests/fixtures/codex/``;
table: ``docs/codex-mapping.md``):

* ``thread.started`` → ``SessionStarted`` with the thread id as ``agent_session_id``: the gateway
  resumes the thread with it (the profile's ``resume_command``, ``codex exec resume ... {session_id}
  {prompt}``, with the thread id as ``{session_id}``).
* ``agent_message`` / ``reasoning`` items arrive whole in ``item.completed``: one text (thinking)
  delta and its end, keyed by the item id.
* Tool items become a ``ToolCall`` on ``item.started`` (or on ``item.completed`` when no start was
  printed) and one ``ToolResult`` on ``item.completed``, matched by item id, so items that complete
  out of order (parallel commands finish as they finish) still pair up. Items started one right
  after another, with nothing else between, were issued together and share a ``group``.

  =====================  ======================  ========================================
  item                   tool name               result
  =====================  ======================  ========================================
  ``command_execution``  ``shell``               ``aggregated_output`` (stdout and stderr
                                                 merged); ``exit_code`` 0 is success, any
                                                 other code (or none, with status failed
                                                 or declined) an error
  ``file_change``        ``apply_patch``         a unified diff per file, read from the
                                                 workspace (``file_changes.py``); without
                                                 one, a line per change (``text``)
  ``mcp_tool_call``      ``mcp__<srv>__<tool>``  the text of the result's content (or its
                                                 ``structured_content``); failed → error
  ``web_search``         ``web_search``          the query and action (``structured``):
                                                 the CLI reports no results
  ``todo_list``          ``update_plan``         the list (``structured``); every new
                                                 version is one call and its result
  =====================  ======================  ========================================

* ``web_search`` items contain the key ``"id"`` twice (the item's and the API's); a JSON decoder
  keeps the last, so the item id is read from the line itself.
* ``turn.completed`` → ``TurnEnded`` ``end_turn``. Its usage is cumulative over the thread (also
  across resume): the parser remembers the last total per thread and reports the difference, the
  turn's own share. The first turn it sees of a resumed thread cannot be told apart from the
  thread's history and is reported whole.
* ``error`` → ``Notice`` (``API_*`` codes from the HTTP status or the API's error type, see
  ``api_errors.py``; "Reconnecting..." retries are warnings); ``turn.failed`` → ``TurnEnded``
  ``error`` (with a ``Notice`` too when no ``error`` line came before it). ``error`` items are
  non-fatal warnings.
* Not printed at all by the CLI, so not reported: a command the read-only sandbox refused and a
  patch that failed to apply (the model hears of them; the master sees only the answer).

``describe_exit`` names exit 1 after a failed turn by that turn's error. The CLI reads nothing on
stdin once started (``NoInput``): cancel is SIGINT.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Final

import msgspec

from .. import events as ev
from .. import numbers
from ..api_errors import http_error_code
from ..base import DescribesExit, ExitDescription, JsonLinesParser, ReadsWorkspace
from ..file_changes import FileChanges, Reader, no_files, workspace_reader
from ..json_depth import MAX_AGENT_LINE_DEPTH, too_deep

__all__ = ["CodexParser"]

_MAX_OPEN_CALLS: Final = 4096  # tool items (and todo lists) remembered until their completion

# --- the line kinds -------------------------------------------------------------------------------
# Field names are the CLI's; every field has a default so that a field the CLI drops does not turn a
# good line into a ParseError. Parts whose shape varies (MCP arguments and results) stay loose.


class _Change(msgspec.Struct):
    path: str = ""
    kind: Any = "update"  # "add" | "update" | "delete" (a table in some versions)


class _TodoItem(msgspec.Struct):
    text: str = ""
    completed: bool = False


class _Item(msgspec.Struct):
    id: str = ""
    type: str = ""
    text: str | None = None  # agent_message, reasoning
    message: str | None = None  # error
    command: str | None = None
    aggregated_output: str | None = None
    exit_code: int | None = None
    status: str | None = None
    changes: list[_Change] = []
    server: str | None = None
    tool: str | None = None
    arguments: Any = None
    result: Any = None
    error: Any = None
    query: str | None = None
    action: Any = None
    items: list[_TodoItem] | None = None


class _ThreadStarted(msgspec.Struct, tag="thread.started", tag_field="type"):
    thread_id: str = ""


class _TurnStarted(msgspec.Struct, tag="turn.started", tag_field="type"):
    pass


class _ItemStarted(msgspec.Struct, tag="item.started", tag_field="type"):
    item: _Item = msgspec.field(default_factory=_Item)


class _ItemUpdated(msgspec.Struct, tag="item.updated", tag_field="type"):
    item: _Item = msgspec.field(default_factory=_Item)


class _ItemCompleted(msgspec.Struct, tag="item.completed", tag_field="type"):
    item: _Item = msgspec.field(default_factory=_Item)


class _Usage(msgspec.Struct):
    input_tokens: int = 0  # includes the cached ones (OpenAI's convention)
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    output_tokens: int = 0  # includes the reasoning ones
    reasoning_output_tokens: int = 0


class _TurnCompleted(msgspec.Struct, tag="turn.completed", tag_field="type"):
    # Loosely typed: a count the wrong type must not refuse the line that ends the turn;
    # _checked_usage reads it through parsers/numbers.py.
    usage: Any = None


def _checked_usage(usage: Any, odd: numbers.OddFields) -> _Usage | None:
    """A ``turn.completed``'s usage with each odd count taken as 0 (and named in ``odd``)."""
    if not isinstance(usage, dict):
        if usage is not None:
            odd.names.append("usage")
        return None
    counts = {
        name: odd.count(usage.get(name, 0), f"usage.{name}") or 0
        for name in _Usage.__struct_fields__
    }
    return _Usage(**counts)


class _ErrorBody(msgspec.Struct):
    message: str = ""


class _TurnFailed(msgspec.Struct, tag="turn.failed", tag_field="type"):
    error: _ErrorBody | None = None


class _Error(msgspec.Struct, tag="error", tag_field="type"):
    message: str = ""


_Line = (
    _ThreadStarted
    | _TurnStarted
    | _ItemStarted
    | _ItemUpdated
    | _ItemCompleted
    | _TurnCompleted
    | _TurnFailed
    | _Error
)
_line_decoder: Final = msgspec.json.Decoder(_Line)
_KNOWN_KINDS: Final = frozenset(
    {
        "thread.started",
        "turn.started",
        "item.started",
        "item.updated",
        "item.completed",
        "turn.completed",
        "turn.failed",
        "error",
    }
)


_json_decoder: Final = msgspec.json.Decoder()

# The first "id" of a line's item (web_search items repeat the key; decoders keep the last).
_FIRST_ITEM_ID: Final = re.compile(rb'"item"\s*:\s*\{\s*"id"\s*:\s*"((?:[^"\\]|\\.)*)"')
_HTTP_STATUS: Final = re.compile(r"\bstatus (\d{3})\b")
# The Responses API's error types that say which HTTP status was behind them.
_API_ERROR_TYPES: Final = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "rate_limit_error": 429,
    "insufficient_quota": 429,
    "server_error": 500,
}

_TOOL_ITEMS: Final = frozenset(
    {"command_execution", "file_change", "mcp_tool_call", "web_search", "todo_list"}
)
SHELL: Final = "shell"
APPLY_PATCH: Final = "apply_patch"
WEB_SEARCH: Final = "web_search"
UPDATE_PLAN: Final = "update_plan"


class CodexParser(JsonLinesParser, DescribesExit, ReadsWorkspace):
    """``codex exec --json`` stdout, one line at a time (see the module docstring)."""

    __slots__ = (
        "_batch",
        "_batches",
        "_error_noticed",
        "_files",
        "_last_error",
        "_open",
        "_plans",
        "_thread",
        "_totals",
    )
    KNOWN_KINDS = _KNOWN_KINDS

    def __init__(self, read_file: Reader = no_files) -> None:
        super().__init__()
        self._files = FileChanges(read_file)
        self._open: dict[str, str] = {}  # tool items started: item id → tool name
        self._batch: str | None = None  # the group of the tool items being started together
        self._batches = 0
        self._plans: dict[str, tuple[int, list[dict[str, Any]]]] = {}  # todo_list: versions, last
        self._thread: str | None = None
        self._totals: _Usage | None = None  # the thread's cumulative usage at the last turn end
        self._error_noticed = False  # an error line was turned into a Notice this turn
        self._last_error: tuple[str, str] | None = None  # (code, message) of the last fatal error

    def set_workspace(self, workspace: str) -> None:
        """The session's workspace, the agent's cwd (``parsers.base.ReadsWorkspace``): the files
        the agent changes are read there and nowhere else. Told once, before the first line;
        until then nothing is read (no diffs)."""
        self._files = FileChanges(workspace_reader(workspace))

    # --- the AgentParser protocol ------------------------------------------------------------------

    def feed(self, line: bytes) -> list[ev.AgentEvent]:
        try:
            msg = _line_decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as err:
            return self._refused(line, err)
        if too_deep(line, MAX_AGENT_LINE_DEPTH):  # JsonLinesParser._too_deep
            return self._too_deep(line)
        if type(msg) is _ItemCompleted:
            self._batch = None
            return self._item_completed(_fix_id(msg.item, line), line)
        if type(msg) is _ItemStarted:
            return self._item_started(_fix_id(msg.item, line))
        self._batch = None
        if type(msg) is _ItemUpdated:
            return self._item_updated(_fix_id(msg.item, line))
        if type(msg) is _ThreadStarted:
            return self._thread_started(msg)
        if type(msg) is _TurnStarted:
            self._error_noticed = False
            self._last_error = None
            return []
        if type(msg) is _TurnCompleted:
            odd = numbers.OddFields()
            usage = _checked_usage(msg.usage, odd)
            note = [ev.OddNumbers(kind="turn.completed", fields=odd.names)] if odd.names else []
            return [*note, ev.TurnEnded(stop_reason="end_turn", usage=self._turn_share(usage))]
        if type(msg) is _TurnFailed:
            return self._turn_failed(msg)
        if type(msg) is _Error:
            return self._error(msg.message)
        return []  # pragma: no cover (the union has no other member)

    def end(self) -> list[ev.AgentEvent]:
        """Stdout closed. Open calls are the mapper's to close (``end_turn`` cancels them). What
        was kept by item id goes: the next ``codex exec`` numbers its items from ``item_0`` again,
        so a todo list left open here must not pass for (or hide) one of the next process."""
        self._open.clear()
        self._plans.clear()
        self._files.clear()
        self._batch = None
        return []

    def describe_exit(self, returncode: int) -> ExitDescription | None:
        """Exit 1 after a failed turn: that turn's error names it (e.g. ``API_UNAUTHORIZED``)."""
        if returncode == 1 and self._last_error is not None:
            code, message = self._last_error
            return code, f"codex exec failed (exit 1): {message}"
        return None

    # --- thread and turn ---------------------------------------------------------------------------

    def _thread_started(self, msg: _ThreadStarted) -> list[ev.AgentEvent]:
        if msg.thread_id != self._thread:
            self._thread = msg.thread_id
            self._totals = None  # another thread: its usage starts from its own history
        # No tool list: `codex exec` does not print one (the catalog stays empty rather than
        # claiming tools the model may not have been offered).
        return [ev.SessionStarted(agent_session_id=msg.thread_id or None)]

    def _turn_share(self, usage: _Usage | None) -> ev.UsageInfo | None:
        if usage is None:
            return None
        before, self._totals = self._totals, usage
        share = usage
        if before is not None:
            diff = _Usage(
                input_tokens=usage.input_tokens - before.input_tokens,
                cached_input_tokens=usage.cached_input_tokens - before.cached_input_tokens,
                cache_write_input_tokens=usage.cache_write_input_tokens
                - before.cache_write_input_tokens,
                output_tokens=usage.output_tokens - before.output_tokens,
                reasoning_output_tokens=usage.reasoning_output_tokens
                - before.reasoning_output_tokens,
            )
            # A count that went down means the CLI started counting afresh: take it as it is.
            if min(msgspec.structs.astuple(diff)) >= 0:
                share = diff
        return ev.UsageInfo(
            input_tokens=max(0, share.input_tokens - share.cached_input_tokens),
            output_tokens=share.output_tokens,
            cache_read_tokens=share.cached_input_tokens,
            cache_write_tokens=share.cache_write_input_tokens,
            thinking_tokens=share.reasoning_output_tokens,
        )

    def _turn_failed(self, msg: _TurnFailed) -> list[ev.AgentEvent]:
        message = msg.error.message if msg.error is not None else "the turn failed"
        out = [] if self._error_noticed else self._error(message)
        self._error_noticed = False
        out.append(
            ev.TurnEnded(
                stop_reason="error", is_error=True, error=_readable(message) or "the turn failed"
            )
        )
        return out

    def _error(self, message: str) -> list[ev.AgentEvent]:
        if message.startswith("Reconnecting"):
            # The CLI retries a dropped stream itself: news, not a failure.
            return [ev.Notice(severity="warning", code="API_RETRY", message=message)]
        status = _status_of(message)
        code = "STREAM_ERROR" if message.startswith("stream disconnected") else None
        code = code or http_error_code(status)
        text = _readable(message) or "error"
        self._error_noticed = True
        self._last_error = (code, text)
        return [
            ev.Notice(
                severity="error", code=code, message=text, recoverable=False, http_status=status
            )
        ]

    # --- items ------------------------------------------------------------------------------------

    def _item_started(self, item: _Item) -> list[ev.AgentEvent]:
        if item.type == "todo_list":
            self._batch = None
            return self._plan(item)
        if item.type not in _TOOL_ITEMS:
            self._batch = None
            return []  # text and reasoning are reported whole when completed
        if item.id in self._open:
            return []
        if self._batch is None:
            self._batches += 1
            self._batch = f"batch-{self._batches}"
        return [self._call(item, self._batch)]

    def _item_updated(self, item: _Item) -> list[ev.AgentEvent]:
        if item.type == "todo_list":
            return self._plan(item)
        return []  # commands print no output chunks in exec mode; the completion has it all

    def _item_completed(self, item: _Item, line: bytes) -> list[ev.AgentEvent]:
        kind = item.type
        if kind == "agent_message":
            if not item.text:
                return []
            return [ev.TextDelta(block=item.id, text=item.text), ev.TextEnd(block=item.id)]
        if kind == "reasoning":
            if not item.text:
                return []
            return [ev.ThinkingDelta(block=item.id, text=item.text), ev.ThinkingEnd(block=item.id)]
        if kind == "todo_list":
            plan = self._plan(item)
            self._plans.pop(item.id, None)
            return plan
        if kind == "error":
            return [
                ev.Notice(
                    severity="warning",
                    code="AGENT_WARNING",
                    message=item.message or item.text or "error",
                )
            ]
        if kind not in _TOOL_ITEMS:
            return self._unknown(f"item/{kind or '?'}", line)
        out: list[ev.AgentEvent] = []
        if item.id not in self._open:
            out.append(self._call(item, None))  # completed without a start: call and result
        self._open.pop(item.id, None)
        out.append(self._result(item))
        return out

    def _call(self, item: _Item, group: str | None) -> ev.ToolCall:
        name, tool_input = _call_of(item)
        if item.type == "file_change":
            self._files.before(c.path for c in item.changes if _kind_of(c) != "add")
        if len(self._open) >= _MAX_OPEN_CALLS:
            del self._open[next(iter(self._open))]  # never completed (the CLI died): the oldest
        self._open[item.id] = name
        return ev.ToolCall(call_id=item.id, name=name, input=tool_input, group=group)

    def _result(self, item: _Item) -> ev.ToolResult:
        kind = item.type
        failed = item.status in ("failed", "declined")
        if kind == "command_execution":
            is_error = item.exit_code != 0 if item.exit_code is not None else failed
            return ev.ToolResult(
                call_id=item.id,
                is_error=is_error,
                output=item.aggregated_output or "",
                output_type="text",
            )
        if kind == "file_change":
            return self._patch_result(item, failed)
        if kind == "mcp_tool_call":
            error = _error_text(item.error)
            if error is not None:
                return ev.ToolResult(call_id=item.id, is_error=True, output=error)
            output, output_type = _mcp_output(item.result)
            return ev.ToolResult(
                call_id=item.id, is_error=failed, output=output, output_type=output_type
            )
        # web_search: the CLI tells what was searched, not what was found.
        found: dict[str, Any] = {"query": item.query or ""}
        if item.action is not None:
            found["action"] = item.action
        return ev.ToolResult(
            call_id=item.id, is_error=failed, output=found, output_type="structured"
        )

    def _patch_result(self, item: _Item, failed: bool) -> ev.ToolResult:
        summary = "".join(f"{_kind_of(c)} {c.path}\n" for c in item.changes)
        if failed:
            return ev.ToolResult(
                call_id=item.id, is_error=True, output=f"the patch failed:\n{summary}"
            )
        diffs: list[str | None] = []
        for change in item.changes:
            kind = _kind_of(change)
            if kind == "add":
                diffs.append(self._files.created(change.path))
            else:
                diffs.append(self._files.diff(change.path, deleted=kind == "delete"))
        if diffs and all(d is not None for d in diffs):
            return ev.ToolResult(
                call_id=item.id,
                is_error=False,
                output="".join(d for d in diffs if d),
                changed=True,
                output_type="diff",
            )
        # No diff could be read for some file (see file_changes.py): say what changed instead of
        # claiming a diff.
        return ev.ToolResult(
            call_id=item.id,
            is_error=False,
            output=summary,
            changed=bool(item.changes),
            output_type="text",
        )

    def _plan(self, item: _Item) -> list[ev.AgentEvent]:
        """A todo list version: one ``update_plan`` call with its result, when it changed."""
        todos = [{"content": t.text, "completed": t.completed} for t in item.items or ()]
        versions, last = self._plans.get(item.id, (0, None))
        if todos == last:
            return []
        if not versions and len(self._plans) >= _MAX_OPEN_CALLS:
            del self._plans[next(iter(self._plans))]  # never completed: the oldest
        self._plans[item.id] = (versions + 1, todos)
        call_id = f"{item.id}#{versions}"
        return [
            ev.ToolCall(call_id=call_id, name=UPDATE_PLAN, input={"todos": todos}),
            ev.ToolResult(call_id=call_id, is_error=False, output=todos, output_type="structured"),
        ]


# --- pure helpers ---------------------------------------------------------------------------------


def _fix_id(item: _Item, line: bytes) -> _Item:
    if item.type == "web_search":
        m = _FIRST_ITEM_ID.search(line)
        if m is not None:
            with contextlib.suppress(msgspec.DecodeError):
                item.id = _json_decoder.decode(b'"' + m.group(1) + b'"')
    return item


def _kind_of(change: _Change) -> str:
    kind = change.kind
    if isinstance(kind, dict):
        kind = kind.get("type")
    return kind if isinstance(kind, str) and kind else "update"


def _call_of(item: _Item) -> tuple[str, dict[str, Any]]:
    kind = item.type
    if kind == "command_execution":
        return SHELL, {"command": item.command or ""}
    if kind == "file_change":
        changes = [{"path": c.path, "kind": _kind_of(c)} for c in item.changes]
        return APPLY_PATCH, {"changes": changes}
    if kind == "mcp_tool_call":
        args = item.arguments if isinstance(item.arguments, dict) else {"arguments": item.arguments}
        return f"mcp__{item.server or '?'}__{item.tool or '?'}", args
    return WEB_SEARCH, {"query": item.query or ""}


def _mcp_output(result: Any) -> tuple[Any, str | None]:
    """The text of an MCP result's content blocks, or its structured content."""
    if not isinstance(result, dict):
        return "", None
    content = result.get("content")
    texts = [
        str(block.get("text", ""))
        for block in (content if isinstance(content, list) else ())
        if isinstance(block, dict) and block.get("type") == "text"
    ]
    if texts:
        return "\n".join(texts), None
    structured = result.get("structured_content")
    if structured is not None:
        return structured, "structured"
    return "", None


def _error_text(error: Any) -> str | None:
    if error is None:
        return None
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


def _status_of(message: str) -> int | None:
    """The HTTP status an error message names (``unexpected status 401 ...``), or that the API's
    error body implies (``{"error": {"type": "invalid_request_error", ...}}``)."""
    m = _HTTP_STATUS.search(message)
    if m is not None:
        return int(m.group(1))
    body = _error_body(message)
    if body is not None:
        code = body.get("code")
        if type(code) is int and 100 <= code <= 599:  # an HTTP status (JSON true is no int here)
            return code
        return _API_ERROR_TYPES.get(str(body.get("type")))
    return None


def _error_body(message: str) -> dict[str, Any] | None:
    if not message.startswith("{"):
        return None
    if too_deep(message, MAX_AGENT_LINE_DEPTH):
        return None
    try:
        obj = _json_decoder.decode(message)
    except (msgspec.DecodeError, UnicodeEncodeError):  # a str may hold lone surrogates
        return None
    error = obj.get("error") if isinstance(obj, dict) else None
    return error if isinstance(error, dict) else None


def _readable(message: str) -> str:
    """The API's own message when the CLI passes the whole error body on."""
    body = _error_body(message)
    if body is not None and isinstance(body.get("message"), str):
        return body["message"]
    return message
