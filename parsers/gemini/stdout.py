"""Gemini CLI (0.61.0) ``gemini -p ... --output-format stream-json``: stdout lines → agent events.

Theory of operation
-------------------
``GeminiParser.feed(line)`` decodes each line once with one msgspec decoder over a tagged union of
the line kinds (``type``: ``init``, ``message``, ``tool_use``, ``tool_result``, ``error``,
``result``). A line that is not JSON, or a known kind of the wrong shape, becomes ``ParseError``; a
well-formed line of another kind becomes ``Unknown``. Nothing raises.

What the CLI prints and what it becomes (facts: the recorded fixtures under ``tests/fixtures/gemini/``;
table: ``docs/gemini-mapping.md``):

* ``init`` → ``SessionStarted`` with ``session_id`` as ``agent_session_id`` (the profile resumes
  with ``--resume {session_id}``) and the model.
* ``message``: the prompt's echo (``role: "user"``) is skipped, the master sent it. Assistant
  chunks (``delta: true``) are text deltas of one block, which ends at the next line of another
  kind (a tool call, the result, an error), or with the turn when stdout closes without a result
  (then ``is_cancelled`` if the turn was cancelled); a whole assistant message (no ``delta``) is
  a block of its own. The CLI prints no thoughts in stream-json.
* ``tool_use`` → ``ToolCall`` (the CLI's name and ``tool_id``; calls printed one right after
  another were issued together: ``group``); ``tool_result`` → its one ``ToolResult`` by
  ``tool_id``, with the duration between the two lines' timestamps. The result's ``status`` is
  the CLI's: a shell command that failed still says ``success`` (the exit code is not printed), so
  it stays a success whose output is the command's error text. ``output`` is a display string and
  may be empty or missing; ``write_file`` and ``replace`` get a unified diff read from the
  workspace instead (``file_changes.py``), ``write_todos`` its list (``structured``).
* ``error`` → ``Notice`` (the CLI's severity); ``result`` → ``TurnEnded``: ``success`` is
  ``end_turn``, ``error`` is ``error`` (with a ``Notice`` carrying an ``API_*`` code when the
  result has an ``error`` object). ``stats`` → usage: ``input`` (or ``input_tokens`` - ``cached``)
  uncached input, ``cached`` cache reads, ``output_tokens``, and what ``total_tokens`` counts beyond
  input and output (thoughts) as thinking. Stats are per run, not carried across ``--resume``.

``describe_exit`` names the CLI's exit codes: the HTTP status of a failed API call cut to 8 bits
(400 → 144, 429 → 173, 500 → 244) becomes its ``API_*`` code, and the CLI's own codes (41 auth,
42 input, 44 sandbox, 52 config, 53 turn limit, 54 tool, 55 untrusted folder, 130 cancelled) their
names. The CLI reads nothing on stdin after its prompt (``NoInput``): cancel is SIGINT.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from .. import events as ev
from .. import numbers
from ..api_errors import HTTP_ERROR_CODES, http_error_code
from ..base import DescribesExit, ExitDescription, JsonLinesParser, ReadsWorkspace, elapsed_ms
from ..file_changes import FileChanges, Reader, no_files, workspace_reader
from ..json_depth import MAX_AGENT_LINE_DEPTH, too_deep

__all__ = ["EXIT_CODES", "GeminiParser"]

_MAX_OPEN_CALLS: Final = 4096

# The CLI's own exit codes (gemini-cli's FatalError subclasses) and what they mean.
EXIT_CODES: Final[dict[int, tuple[str, str]]] = {
    41: ("AUTH_ERROR", "authentication failed or no auth method is configured"),
    42: ("INPUT_ERROR", "the prompt or the arguments were not accepted"),
    44: ("SANDBOX_ERROR", "the sandbox could not be set up"),
    52: ("CONFIG_ERROR", "the configuration is invalid"),
    53: ("TURN_LIMIT", "the session reached its turn limit"),
    54: ("TOOL_ERROR", "a tool failed fatally"),
    55: ("UNTRUSTED_FOLDER", "the workspace folder is not trusted (--skip-trust trusts it)"),
    130: ("CANCELLED", "cancelled"),
}
# Exit code → HTTP status, for the statuses the CLI passes on as its exit code (status & 0xFF).
# Only codes above 128 qualify: smaller ones (e.g. 529 & 0xFF = 17) are too likely other things.
_HTTP_EXITS: Final = {s & 0xFF: s for s in HTTP_ERROR_CODES if (s & 0xFF) > 128}

# --- the line kinds -------------------------------------------------------------------------------


class _Init(msgspec.Struct, tag="init", tag_field="type"):
    session_id: str | None = None
    model: str | None = None


class _Message(msgspec.Struct, tag="message", tag_field="type"):
    role: str = ""
    content: str = ""
    delta: bool | None = None


class _ToolUse(msgspec.Struct, tag="tool_use", tag_field="type"):
    tool_name: str = "?"
    tool_id: str = ""
    parameters: dict[str, Any] = {}
    timestamp: str | None = None


class _ErrorBody(msgspec.Struct):
    type: str | None = None
    message: str | None = None


class _ToolResult(msgspec.Struct, tag="tool_result", tag_field="type"):
    tool_id: str = ""
    status: str = "success"
    output: str | None = None
    error: _ErrorBody | None = None
    timestamp: str | None = None


class _Error(msgspec.Struct, tag="error", tag_field="type"):
    severity: str = "error"
    message: str = ""


class _Stats(msgspec.Struct):
    # Counts typed loosely: one the wrong type must not refuse the result line, which would
    # never end its turn; _usage_of reads them through parsers/numbers.py.
    total_tokens: Any = 0
    input_tokens: Any = 0
    output_tokens: Any = 0
    cached: Any = 0
    input: Any = None  # uncached input, when the CLI says
    duration_ms: Any = None
    tool_calls: Any = None


class _Result(msgspec.Struct, tag="result", tag_field="type"):
    status: str = "success"
    error: _ErrorBody | None = None
    stats: _Stats | None = None


_Line = _Init | _Message | _ToolUse | _ToolResult | _Error | _Result
_line_decoder: Final = msgspec.json.Decoder(_Line)
_KNOWN_KINDS: Final = frozenset({"init", "message", "tool_use", "tool_result", "error", "result"})


WRITE_TOOLS: Final = frozenset({"write_file", "replace"})
TODO_TOOL: Final = "write_todos"

# What an API error message says about the HTTP status behind it: `"code": 400` in the JSON body
# the CLI quotes, or the Google status name.
_CODE_IN_BODY: Final = re.compile(r'"code"\s*:\s*(\d{3})\b')
_GOOGLE_STATUS: Final = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 429,
    "Resource has been exhausted": 429,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
# Error events the CLI prints itself (not the API's): their codes.
_CLI_ERRORS: Final = (
    ("The model returned an empty response", "EMPTY_RESPONSE"),
    ("Model stream ended without a finish reason", "STREAM_ERROR"),
)


class _PendingTool(msgspec.Struct):
    name: str
    input: dict[str, Any]
    started: str | None


class GeminiParser(JsonLinesParser, DescribesExit, ReadsWorkspace):
    """Gemini CLI stream-json stdout, one line at a time (see the module docstring)."""

    __slots__ = (
        "_batch",
        "_batches",
        "_blocks",
        "_calls",
        "_files",
        "_last_error",
        "_text",
    )
    KNOWN_KINDS = _KNOWN_KINDS

    def __init__(self, read_file: Reader = no_files) -> None:
        super().__init__()
        self._files = FileChanges(read_file)
        self._calls: dict[str, _PendingTool] = {}
        self._text: str | None = None  # the open text block's key
        self._blocks = 0
        self._batch: str | None = None  # the group of the tool calls being printed together
        self._batches = 0
        self._last_error: str | None = None  # the last API error message (for describe_exit)

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
        if type(msg) is _Message:  # the hot path: a text chunk
            if msg.role != "assistant":
                return []  # the prompt's echo: the master sent it
            if msg.delta:
                self._batch = None
                if self._text is None:
                    self._blocks += 1
                    self._text = f"text-{self._blocks}"
                return [ev.TextDelta(block=self._text, text=msg.content)]
            return self._whole_message(msg.content)
        if too_deep(line, MAX_AGENT_LINE_DEPTH):  # past the hot path (JsonLinesParser._too_deep)
            return self._too_deep(line)
        out = self._close_text()
        if type(msg) is _ToolUse:
            return out + self._tool_use(msg)
        self._batch = None
        if type(msg) is _ToolResult:
            return out + self._tool_result(msg)
        if type(msg) is _Result:
            return out + self._result(msg)
        if type(msg) is _Error:
            return out + [_notice(msg)]
        if type(msg) is _Init:
            self._last_error = None  # a new run: describe_exit quotes this run's error only
            return out + [
                ev.SessionStarted(agent_session_id=msg.session_id or None, model=msg.model)
            ]
        return out  # pragma: no cover (the union has no other member)

    def end(self) -> list[ev.AgentEvent]:
        """Stdout closed with no result line (a signal, a crash): the open text block and calls
        are left to the mapper's ``end_turn``, which marks them cancelled when the turn was."""
        self._text = None
        self._calls.clear()
        self._files.clear()
        self._batch = None
        return []

    def describe_exit(self, returncode: int) -> ExitDescription | None:
        """The CLI's own exit codes and HTTP statuses cut to 8 bits, by name (module docstring)."""
        last = f": {self._last_error}" if self._last_error else ""
        own = EXIT_CODES.get(returncode)
        if own is not None:
            code, meaning = own
            return code, f"gemini exited {returncode}: {meaning}{last}"
        status = _HTTP_EXITS.get(returncode)
        if status is not None:
            return (
                http_error_code(status),
                f"gemini exited {returncode}: the model API answered HTTP {status}"
                f" (the CLI's exit code is the status cut to 8 bits){last}",
            )
        return None

    # --- content ----------------------------------------------------------------------------------

    def _close_text(self) -> list[ev.AgentEvent]:
        if self._text is None:
            return []
        key, self._text = self._text, None
        return [ev.TextEnd(block=key)]

    def _whole_message(self, text: str) -> list[ev.AgentEvent]:
        out = self._close_text()
        self._batch = None
        if not text:
            return out
        self._blocks += 1
        key = f"text-{self._blocks}"
        return out + [ev.TextDelta(block=key, text=text), ev.TextEnd(block=key)]

    # --- tools ------------------------------------------------------------------------------------

    def _tool_use(self, msg: _ToolUse) -> list[ev.AgentEvent]:
        if self._batch is None:
            self._batches += 1
            self._batch = f"batch-{self._batches}"
        if msg.tool_name in WRITE_TOOLS and isinstance(msg.parameters.get("file_path"), str):
            self._files.before([msg.parameters["file_path"]])
        if len(self._calls) >= _MAX_OPEN_CALLS:
            del self._calls[next(iter(self._calls))]  # never answered (the CLI died): the oldest
        self._calls[msg.tool_id] = _PendingTool(msg.tool_name, msg.parameters, msg.timestamp)
        return [
            ev.ToolCall(
                call_id=msg.tool_id, name=msg.tool_name, input=msg.parameters, group=self._batch
            )
        ]

    def _tool_result(self, msg: _ToolResult) -> list[ev.AgentEvent]:
        call = self._calls.pop(msg.tool_id, None)
        error = msg.error
        status = msg.status
        output: Any = msg.output or ""
        result = ev.ToolResult(
            call_id=msg.tool_id,
            is_error=status not in ("success", "cancelled"),
            cancelled=status == "cancelled",
            output=output,
            # Gemini's tool output is a display string, whatever the tool: text unless a diff or
            # the todo list replaces it below.
            output_type="text",
            duration_ms=elapsed_ms(call.started if call else None, msg.timestamp),
        )
        if result.is_error:
            # The error's own message is the clearer one ("File not found: <path>").
            if error is not None and error.message:
                result.output = error.message
            return [result]
        if call is not None and call.name in WRITE_TOOLS and not result.cancelled:
            path = call.input.get("file_path")
            diff = self._files.diff(path) if isinstance(path, str) else None
            if diff is not None:
                result.output, result.changed, result.output_type = diff, True, "diff"
            else:
                result.output_type = None  # no diff to claim: §5.3.3 decides (a write: empty)
                if not output:
                    result.output = f"{call.name} {path}"  # say what was written
        elif call is not None and call.name == TODO_TOOL:
            todos = call.input.get("todos")
            if isinstance(todos, list):
                result.output, result.output_type = todos, "structured"
        return [result]

    # --- the end of a run -------------------------------------------------------------------------

    def _result(self, msg: _Result) -> list[ev.AgentEvent]:
        out: list[ev.AgentEvent] = []
        error_text = None
        if msg.error is not None:
            error_text = msg.error.message or msg.error.type or "error"
            self._last_error = _api_message(error_text)
            status = _status_of(error_text)
            out.append(
                ev.Notice(
                    severity="error",
                    code=http_error_code(status),
                    message=self._last_error,
                    recoverable=False,
                    http_status=status,
                )
            )
        stop = {"success": "end_turn", "cancelled": "cancelled"}.get(msg.status, "error")
        odd = numbers.OddFields()
        usage = _usage_of(msg.stats, odd)
        if odd.names:
            out.append(ev.OddNumbers(kind="result", fields=odd.names))
        out.append(
            ev.TurnEnded(
                stop_reason=stop,  # type: ignore[arg-type]
                usage=usage,
                is_error=stop == "error",
                error=error_text if stop == "error" else None,
            )
        )
        return out


# --- pure helpers ---------------------------------------------------------------------------------


def _notice(msg: _Error) -> ev.Notice:
    code = "AGENT_ERROR"
    for prefix, known in _CLI_ERRORS:
        if msg.message.startswith(prefix):
            code = known
            break
    warning = msg.severity == "warning"
    return ev.Notice(
        severity="warning" if warning else "error",
        code=code,
        message=msg.message or "error",
        recoverable=warning,
    )


def _status_of(message: str) -> int | None:
    m = _CODE_IN_BODY.search(message)
    if m is not None:
        return int(m.group(1))
    for name, status in _GOOGLE_STATUS.items():
        if name in message:
            return status
    return None


_API_ERROR_JSON: Final = re.compile(r"^\[API Error: (\{.*\})\]", re.S)
_API_ERROR_TEXT: Final = re.compile(r"^\[API Error: (.*?)\]", re.S)


def _api_message(text: str) -> str:
    """The API's own message out of the CLI's ``[API Error: ...]`` wrapping, when it has one."""
    m = _API_ERROR_JSON.match(text)
    if m is not None:
        body = None
        if not too_deep(m.group(1), MAX_AGENT_LINE_DEPTH):
            try:
                body = msgspec.json.decode(m.group(1))
            except (msgspec.DecodeError, UnicodeEncodeError):  # a str may hold lone surrogates
                body = None
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
    m = _API_ERROR_TEXT.match(text)
    if m is not None:
        return (m.group(1) + text[m.end() :]).strip()
    return text


def _usage_of(stats: _Stats | None, odd: numbers.OddFields) -> ev.UsageInfo | None:
    """The turn's counts; an odd one is taken as 0 (and named in ``odd``)."""
    if stats is None:
        return None
    total = odd.count(stats.total_tokens, "stats.total_tokens") or 0
    input_tokens = odd.count(stats.input_tokens, "stats.input_tokens") or 0
    output = odd.count(stats.output_tokens, "stats.output_tokens") or 0
    cached = odd.count(stats.cached, "stats.cached") or 0
    own_input = odd.count(stats.input, "stats.input")
    uncached = own_input if own_input is not None else input_tokens - cached
    beyond = total - input_tokens - output
    return ev.UsageInfo(
        input_tokens=max(0, uncached),
        output_tokens=output,
        cache_read_tokens=cached,
        thinking_tokens=max(0, beyond),
    )
