"""Claude Code (CLI 2.1.328) ``--output-format stream-json --verbose``: stdout lines → agent events.

Theory of operation
-------------------
``ClaudeCodeParser.feed(line)`` decodes each line once, with one msgspec decoder over a tagged union
of the line kinds (``type``: ``stream_event``, ``assistant``, ``user``, ``system``, ``result``,
``control_request``, ``control_response``). Nested parts that only some lines need (a user line's
``tool_use_result``, a tool's ``input``) are typed loosely and read on demand; everything else is
skipped by the decoder without building Python objects. A line that is not JSON, or a known kind of
the wrong shape, becomes ``ParseError``; a well-formed line of a kind this parser does not know
becomes ``Unknown``. Nothing raises.

The hot path is ``stream_event`` ``text_delta`` (one line per few tokens with
``--include-partial-messages``): one decode, two attribute reads, one event.

What the CLI prints and what it becomes (the full table is ``docs/claude-code-mapping.md``):

* Text and thinking come from ``stream_event`` deltas when partial messages are on. The CLI then
  still prints the whole block as an ``assistant`` line (just before the block's
  ``content_block_stop``); the parser remembers which API messages it saw streamed
  (``message_start``) and skips their text/thinking blocks in ``assistant`` lines, so nothing is
  said twice. Without partial messages each ``assistant`` line carries one whole block, which becomes
  a delta and its end at once. Block keys are ``<message id>:<index>`` (streamed) or
  ``<message id>:a<n>`` (whole blocks); the CLI restarts ``index`` at 0 for every API message, the
  mapper turns keys into turn-unique ``content_index`` es.
* ``tool_use`` blocks always come from ``assistant`` lines (they carry the complete input; the
  streamed ``input_json_delta`` s are not needed). Calls of one API message share ``group`` (the
  message id).
* ``user`` lines carry ``tool_result`` blocks; the richer ``tool_use_result`` beside them is turned
  into the output its ``output_type`` promises (Edit/Write ``structuredPatch`` → unified diff, Read →
  file text, Glob → paths, Grep by output mode, Bash → stdout and stderr, TodoWrite → the todo list,
  Agent → the subagent's report).
* Subagents: lines from inside one carry ``parent_tool_use_id``, which becomes ``parent``. A
  foreground subagent's end is announced right before its ``Agent`` result (from the result's own
  status, usage and duration); a background one (``is_backgrounded`` / ``isAsync``) returns at once,
  so its result is flagged ``background`` and its end comes from the later ``task_notification``.
* Compaction: ``compact_boundary`` (trigger, token counts) is held until the synthetic summary
  message that follows it, then both become one ``Compacted``.
* Interrupts: an ``assistant`` line marked ``aborted`` ends its blocks as cancelled; a tool result
  the CLI produced because the user interrupted the call becomes a cancelled result.

``ClaudeCodeInput`` is the stdin side (``--input-format stream-json``), shapes from
the recorded fixtures under ``tests/fixtures/claude-code/``.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from typing import Any, ClassVar, Final

import msgspec

from . import events as ev
from .base import JsonLinesParser, ParserSpec, PromptImage, elapsed_ms
from .file_changes import new_file_diff, unified_diff
from .json_depth import MAX_AGENT_LINE_DEPTH, too_deep
from .saved import SavedFormat

__all__ = [
    "MAX_OPEN_BLOCKS",
    "MAX_STREAMED_MESSAGES",
    "SPEC",
    "ClaudeCodeInput",
    "ClaudeCodeParser",
]

_KNOWN_KINDS: Final = frozenset(
    {"stream_event", "assistant", "user", "system", "result", "control_request", "control_response"}
)
# tool_use_result of a call the user interrupted
_INTERRUPT_RESULT: Final = "User rejected tool use"
_MAX_OPEN_CALLS: Final = 4096  # tool calls remembered while waiting for their results
# Streamed blocks remembered while waiting for their content_block_stop. The main agent's are
# forgotten at its turn's result; a subagent's that never stops (it was stopped mid-block) only
# by this bound, oldest first. Far more than ever stream at once (a few per agent).
MAX_OPEN_BLOCKS: Final = 1024
# API messages remembered as streamed, so their assistant lines do not say their text again. The
# main agent's are forgotten at its turn's result; a subagent's at its end (a background one still
# streams after the result), or by this bound, oldest first, if that end never comes.
MAX_STREAMED_MESSAGES: Final = 1024
_MAX_COMMANDS: Final = 1024  # slash commands taken from the initialize answer
_MAX_COMMAND_DESCRIPTION: Final = 200  # characters of a command's description (its first line)


# --- the line kinds -------------------------------------------------------------------------------
# Field names are the CLI's. Every field has a default: the CLI adds and drops fields between
# versions, and a missing field must not turn a good line into a ParseError.


class _Delta(msgspec.Struct):
    type: str = ""
    text: str | None = None
    thinking: str | None = None


class _StartBlock(msgspec.Struct):
    type: str = ""
    id: str | None = None
    name: str | None = None


class _StartMessage(msgspec.Struct):
    id: str | None = None


class _StreamEvent(msgspec.Struct):
    type: str = ""
    index: int = 0
    delta: _Delta | None = None
    content_block: _StartBlock | None = None
    message: _StartMessage | None = None


class _StreamEventLine(msgspec.Struct, tag="stream_event", tag_field="type"):
    event: _StreamEvent = msgspec.field(default_factory=_StreamEvent)
    parent_tool_use_id: str | None = None
    api_message_id: str | None = None


class _Block(msgspec.Struct):
    type: str = ""
    text: str | None = None
    thinking: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None


class _ApiUsage(msgspec.Struct):
    input_tokens: int | None = 0
    output_tokens: int | None = 0
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    output_tokens_details: dict[str, Any] | None = None


class _AssistantMessage(msgspec.Struct):
    id: str = ""
    model: str | None = None
    content: list[_Block] = []
    usage: _ApiUsage | None = None


class _AssistantLine(msgspec.Struct, tag="assistant", tag_field="type"):
    message: _AssistantMessage = msgspec.field(default_factory=_AssistantMessage)
    parent_tool_use_id: str | None = None
    aborted: bool = False
    is_api_error_message: bool = False
    api_error_status: int | None = None
    api_error_type: str | None = None
    error: Any = None
    timestamp: str | None = None


class _UserBlock(msgspec.Struct):
    type: str = ""
    text: str | None = None
    tool_use_id: str | None = None
    content: Any = None
    is_error: bool | None = None


class _UserMessage(msgspec.Struct):
    content: str | list[_UserBlock] = ""


class _UserLine(msgspec.Struct, tag="user", tag_field="type"):
    message: _UserMessage = msgspec.field(default_factory=_UserMessage)
    parent_tool_use_id: str | None = None
    tool_use_result: Any = None
    tool_result_meta: list[dict[str, Any]] | None = None
    isSynthetic: bool = False  # the CLI's camelCase names
    isReplay: bool = False
    timestamp: str | None = None


class _McpServerInfo(msgspec.Struct):
    name: str = ""
    status: str = ""
    error: str | None = None


class _CompactMeta(msgspec.Struct):
    trigger: str = "auto"
    pre_tokens: int = 0
    post_tokens: int | None = None


class _SystemLine(msgspec.Struct, tag="system", tag_field="type"):
    subtype: str = ""
    session_id: str | None = None
    # init
    tools: list[str] = []
    mcp_servers: list[_McpServerInfo] = []
    slash_commands: list[str] = []
    model: str | None = None
    permissionMode: str | None = None
    # status
    status: str | None = None
    compact_result: str | None = None
    # compact_boundary
    compact_metadata: _CompactMeta | None = None
    # api_retry
    attempt: int | None = None
    max_retries: int | None = None
    retry_delay_ms: int | None = None
    error_status: int | None = None
    error: Any = None
    # permission_denied
    tool_name: str | None = None
    tool_use_id: str | None = None
    message: str | None = None
    decision_reason_type: str | None = None
    # task_*
    task_id: str | None = None
    description: str | None = None
    subagent_type: str | None = None
    is_backgrounded: bool | None = None
    summary: str | None = None
    usage: dict[str, Any] | None = None
    last_tool_name: str | None = None


class _ResultLine(msgspec.Struct, tag="result", tag_field="type"):
    subtype: str = ""
    is_error: bool = False
    stop_reason: str | None = None
    terminal_reason: str | None = None
    num_turns: int | None = None
    total_cost_usd: float | None = None
    usage: _ApiUsage | None = None
    modelUsage: dict[str, dict[str, Any]] | None = None
    api_error_status: int | None = None
    result: str | None = None
    errors: list[Any] | None = None


class _ControlRequestBody(msgspec.Struct):
    subtype: str = ""
    tool_name: str | None = None
    input: dict[str, Any] = {}
    tool_use_id: str | None = None
    decision_reason_type: str | None = None
    blocked_path: str | None = None


class _ControlRequestLine(msgspec.Struct, tag="control_request", tag_field="type"):
    request_id: str = ""
    request: _ControlRequestBody = msgspec.field(default_factory=_ControlRequestBody)


class _ControlResponseBody(msgspec.Struct):
    subtype: str = ""
    request_id: str = ""
    response: dict[str, Any] | None = None
    error: str | None = None


class _ControlResponseLine(msgspec.Struct, tag="control_response", tag_field="type"):
    response: _ControlResponseBody = msgspec.field(default_factory=_ControlResponseBody)


_Line = (
    _StreamEventLine
    | _AssistantLine
    | _UserLine
    | _SystemLine
    | _ResultLine
    | _ControlRequestLine
    | _ControlResponseLine
)
_line_decoder: Final = msgspec.json.Decoder(_Line)


# System subtypes that are understood and deliberately produce nothing: their information reaches
# the master another way (task_updated and background_tasks_changed: task_notification;
# thinking_tokens: the result's usage; status: compact_boundary reports the compaction).
# task_started produces nothing either but is read first (it says whether a subagent runs in the
# background).
_QUIET_SYSTEM: Final = frozenset(
    {"task_updated", "background_tasks_changed", "thinking_tokens", "status"}
)

_STOP_REASONS: Final = {
    "end_turn": "end_turn",
    "max_tokens": "max_tokens",
    "model_context_window_exceeded": "max_tokens",
    "stop_sequence": "end_turn",
    "tool_use": "tool_use",
    "pause_turn": "end_turn",
    "refusal": "end_turn",
}


class _Call(msgspec.Struct):
    name: str
    input: dict[str, Any]
    parent: str | None
    started: str | None  # the CLI's timestamp of the assistant line that made the call
    background: bool = False


class _PendingCompaction(msgspec.Struct):
    trigger: str
    pre_tokens: int
    post_tokens: int


class ClaudeCodeParser(JsonLinesParser):
    """Claude Code's stream-json stdout, one line at a time (see the module docstring)."""

    __slots__ = (
        "_aborted_streams",
        "_api_error_noticed",
        "_blocks",
        "_calls",
        "_command_descriptions",
        "_compaction",
        "_context_used",
        "_local_outputs",
        "_streamed",
        "_whole_counts",
        "mode",
    )
    KNOWN_KINDS = _KNOWN_KINDS

    def __init__(self) -> None:
        super().__init__()
        # Streamed blocks still open: (message id, index) → (block key, kind, parent).
        self._blocks: dict[tuple[str, int], tuple[str, str, str | None]] = {}
        # API message ids seen through stream_event → the subagent that streamed them (None: main)
        self._streamed: dict[str, str | None] = {}
        self._aborted_streams: set[str] = set()
        self._whole_counts: dict[str, int] = {}  # message id → whole blocks seen (for keys)
        self._calls: dict[str, _Call] = {}  # open tool calls by tool_use id
        self._compaction: _PendingCompaction | None = None
        self._api_error_noticed = False
        self._context_used: int | None = None
        self._local_outputs = 0
        # The CLI's own descriptions of its commands (the initialize answer), used again when its
        # init names the same commands, so the list is not published twice for a wording change.
        self._command_descriptions: dict[str, str] = {}
        self.mode: str | None = None  # the CLI's permission mode (plan text is marked in "plan")

    # --- the AgentParser protocol ----------------------------------------------------------------

    def feed(self, line: bytes) -> list[ev.AgentEvent]:
        try:
            msg = _line_decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as err:
            return self._undecodable(line, err)
        # The hot path first: a streamed text delta.
        if type(msg) is _StreamEventLine and self._compaction is None:
            event = msg.event
            delta = event.delta
            if delta is not None and delta.type == "text_delta" and delta.text is not None:
                open_block = self._blocks.get((msg.api_message_id or "", event.index))
                if open_block is not None and open_block[1] == "text":
                    return [
                        ev.TextDelta(
                            block=open_block[0],
                            text=delta.text,
                            parent=msg.parent_tool_use_id,
                            role="plan" if self.mode == "plan" else None,
                        )
                    ]
            return self._stream_event(msg)
        # Stream events keep no free-form JSON; other lines are measured (JsonLinesParser).
        if too_deep(line, MAX_AGENT_LINE_DEPTH):
            return self._too_deep(line)
        out: list[ev.AgentEvent] = []
        if self._compaction is not None and not _continues_compaction(msg):
            out += self._flush_compaction("")
        if type(msg) is _StreamEventLine:
            return out + self._stream_event(msg)
        if type(msg) is _AssistantLine:
            return out + self._assistant(msg)
        if type(msg) is _UserLine:
            return out + self._user(msg)
        if type(msg) is _SystemLine:
            return out + self._system(msg, line)
        if type(msg) is _ResultLine:
            return out + self._result(msg)
        if type(msg) is _ControlRequestLine:
            return out + self._control_request(msg, line)
        if type(msg) is _ControlResponseLine:
            return out + self._control_response(msg)
        return out  # pragma: no cover (the union has no other member)

    def end(self) -> list[ev.AgentEvent]:
        """Stdout closed: a compaction still waiting for its summary is reported without one.

        Open blocks and calls are left to the mapper's ``end_turn``, which closes them for the turn.
        What the turn kept goes as a result line would have cleared it: a process that died before
        its result must not leave, say, an API error "already noticed" for the next process's.
        """
        out = self._flush_compaction("") if self._compaction is not None else []
        self._blocks.clear()
        self._calls.clear()
        self._streamed.clear()
        self._forget_turn()
        return out

    # --- stream events ----------------------------------------------------------------------------

    def _stream_event(self, msg: _StreamEventLine) -> list[ev.AgentEvent]:
        event = msg.event
        message_id = msg.api_message_id or ""
        kind = event.type
        parent = msg.parent_tool_use_id
        if kind == "content_block_delta":
            delta = event.delta
            open_block = self._blocks.get((message_id, event.index))
            if delta is None or open_block is None:
                return []
            if (
                delta.type == "thinking_delta"
                and delta.thinking is not None
                and open_block[1] == "thinking"
            ):
                return [ev.ThinkingDelta(block=open_block[0], text=delta.thinking, parent=parent)]
            # input_json_delta, signature_delta: the assistant line has the result. A delta of the
            # other kind than its block's (never seen from the CLI) would mix text into thinking.
            return []
        if kind == "content_block_start":
            block = event.content_block
            if block is None:
                return []
            self._mark_streamed(message_id, parent)
            key = f"{message_id}:{event.index}"
            if block.type in ("text", "thinking"):
                self._open_block(message_id, event.index, (key, block.type, parent))
            elif block.type == "redacted_thinking":
                self._open_block(message_id, event.index, (key, "thinking", parent))
                return [ev.ThinkingDelta(block=key, text="", redacted=True, parent=parent)]
            return []
        if kind == "content_block_stop":
            open_block = self._blocks.pop((message_id, event.index), None)
            if open_block is None:
                return []
            key, block_kind, parent = open_block
            cancelled = message_id in self._aborted_streams
            if block_kind == "text":
                return [ev.TextEnd(block=key, cancelled=cancelled, parent=parent)]
            return [ev.ThinkingEnd(block=key, cancelled=cancelled, parent=parent)]
        if kind == "message_start":
            # Mark the message as streamed now: its assistant lines must not repeat its text.
            message_id = message_id or (event.message.id if event.message else "") or ""
            self._mark_streamed(message_id, parent)
        return []  # message_delta, message_stop, ping

    def _mark_streamed(self, message_id: str, parent: str | None) -> None:
        streamed = self._streamed
        if message_id in streamed:
            return
        if len(streamed) >= MAX_STREAMED_MESSAGES:
            # Subagents' messages whose end never came (a subagent that was stopped): the oldest
            # printed its assistant lines long ago.
            del streamed[next(iter(streamed))]
        streamed[message_id] = parent

    def _open_block(self, message_id: str, index: int, block: tuple[str, str, str | None]) -> None:
        blocks = self._blocks
        if len(blocks) >= MAX_OPEN_BLOCKS:
            # Blocks whose stop never came (a subagent stopped mid-block): forget the oldest.
            del blocks[next(iter(blocks))]
        blocks[(message_id, index)] = block

    # --- assistant lines --------------------------------------------------------------------------

    def _assistant(self, msg: _AssistantLine) -> list[ev.AgentEvent]:
        message = msg.message
        parent = msg.parent_tool_use_id
        if msg.is_api_error_message:
            return self._api_error_message(msg)
        if parent is None and message.usage is not None:
            self._context_used = _context_of(message.usage)
        streamed = message.id in self._streamed
        if msg.aborted and streamed:
            self._aborted_streams.add(message.id)
        out: list[ev.AgentEvent] = []
        for block in message.content:
            btype = block.type
            if btype == "tool_use":
                out += self._tool_use(msg, block)
                continue
            if streamed and btype in ("text", "thinking", "redacted_thinking"):
                continue  # already streamed
            n = self._whole_counts.get(message.id, 0)
            self._whole_counts[message.id] = n + 1
            key = f"{message.id}:a{n}"
            if btype == "text" and block.text is not None:
                role = "plan" if self.mode == "plan" else None
                out.append(ev.TextDelta(block=key, text=block.text, parent=parent, role=role))
                out.append(ev.TextEnd(block=key, cancelled=msg.aborted, parent=parent))
            elif btype == "thinking":
                out.append(ev.ThinkingDelta(block=key, text=block.thinking or "", parent=parent))
                out.append(ev.ThinkingEnd(block=key, cancelled=msg.aborted, parent=parent))
            elif btype == "redacted_thinking":
                # The block's data is encrypted: nothing readable to forward, only the fact.
                out.append(ev.ThinkingDelta(block=key, text="", redacted=True, parent=parent))
                out.append(ev.ThinkingEnd(block=key, cancelled=msg.aborted, parent=parent))
        return out

    def _tool_use(self, msg: _AssistantLine, block: _Block) -> list[ev.AgentEvent]:
        call_id = block.id or ""
        name = block.name or "?"
        tool_input = block.input or {}
        parent = msg.parent_tool_use_id
        subagent = name in ("Agent", "Task")
        background = subagent and bool(tool_input.get("run_in_background"))
        if len(self._calls) >= _MAX_OPEN_CALLS:
            # Calls whose result never came (the CLI died, an interrupt lost it): forget the oldest.
            del self._calls[next(iter(self._calls))]
        self._calls[call_id] = _Call(name, tool_input, parent, msg.timestamp, background)
        call = ev.ToolCall(
            call_id=call_id,
            name=name,
            input=tool_input,
            group=msg.message.id or None,
            parent=parent,
            background=background,
        )
        out: list[ev.AgentEvent] = []
        if subagent:
            # The CLI's default subagent is general-purpose when the model names none.
            call.subagent_type = _str(tool_input.get("subagent_type")) or "general-purpose"
            call.description = _str(tool_input.get("description"))
        elif name == "ExitPlanMode" and isinstance(tool_input.get("plan"), str):
            # The plan document is content for the user, marked as such (Appendix A.3).
            key = f"{call_id}:plan"
            out.append(ev.TextDelta(block=key, text=tool_input["plan"], parent=parent, role="plan"))
            out.append(ev.TextEnd(block=key, parent=parent))
        out.append(call)
        return out

    def _api_error_message(self, msg: _AssistantLine) -> list[ev.AgentEvent]:
        text = "".join(b.text or "" for b in msg.message.content if b.type == "text")
        self._api_error_noticed = True
        return [
            ev.Notice(
                severity="error",
                code="API_ERROR",
                message=text or f"API error {msg.api_error_status or ''}".strip(),
                recoverable=False,
                http_status=msg.api_error_status,
                parent=msg.parent_tool_use_id,
            )
        ]

    # --- user lines: tool results, subagent prompts, compaction summaries -------------------------

    def _user(self, msg: _UserLine) -> list[ev.AgentEvent]:
        content = msg.message.content
        if self._compaction is not None and msg.isSynthetic:
            return self._flush_compaction(_text_of(content))
        text = content if isinstance(content, str) else None
        if text is None and content and all(b.type == "text" for b in content):
            text = _text_of(content)
        if text is not None:
            # A prompt (replayed) is what the master sent; a slash command's output is news.
            return self._local_command_output(text, msg.parent_tool_use_id)
        out: list[ev.AgentEvent] = []
        results = [b for b in content if b.type == "tool_result"]
        for block in results:
            out += self._tool_result(msg, block, len(results) == 1)
        return out

    def _local_command_output(self, text: str, parent: str | None) -> list[ev.AgentEvent]:
        found = _LOCAL_OUTPUT.findall(text)
        if not found:
            return []
        self._local_outputs += 1
        key = f"local:{self._local_outputs}"
        body = "\n".join(part for part in found if part)
        return [
            ev.TextDelta(block=key, text=body, parent=parent, role="command_output"),
            ev.TextEnd(block=key, parent=parent),
        ]

    def _tool_result(self, msg: _UserLine, block: _UserBlock, only: bool) -> list[ev.AgentEvent]:
        call_id = block.tool_use_id or ""
        call = self._calls.pop(call_id, None)
        name = call.name if call is not None else None
        parent = msg.parent_tool_use_id
        is_error = bool(block.is_error)
        # tool_use_result belongs to the line; with several results on one line it cannot be
        # told apart, so it is used only when the line has one.
        rich = msg.tool_use_result if only else None
        text = _strip_error_tags(_text_of(block.content))
        cancelled = is_error and (
            rich == _INTERRUPT_RESULT or _interrupted_meta(msg.tool_result_meta, call_id)
        )
        if isinstance(rich, dict) and rich.get("interrupted") is True:
            cancelled = True
        result = ev.ToolResult(
            call_id=call_id,
            is_error=is_error,
            output=text,
            cancelled=cancelled,
            parent=parent,
        )
        if call is not None and not is_error and isinstance(rich, dict):
            _shape_output(result, call, rich)
        if not is_error:
            path = call.input.get("file_path") if call is not None else None
            result.binary = _binary_blocks(block.content, path if isinstance(path, str) else None)
        if call is not None:
            result.duration_ms = _duration(rich, call.started, msg.timestamp)
        out: list[ev.AgentEvent] = []
        if name in ("Agent", "Task") and call is not None:
            if isinstance(rich, dict) and rich.get("isAsync"):
                call.background = True
            if call.background:
                result.background = True
            else:
                self._forget_subagent(call_id)
                out.append(self._foreground_subagent_end(call_id, result, rich, parent))
        out.append(result)
        return out

    def _foreground_subagent_end(
        self, call_id: str, result: ev.ToolResult, rich: Any, parent: str | None
    ) -> ev.SubagentEnded:
        status = "cancelled" if result.cancelled else "failed" if result.is_error else "completed"
        usage = None
        if isinstance(rich, dict):
            if rich.get("status") not in (None, "completed") and status == "completed":
                status = "failed"
            usage = _usage_of(rich.get("usage"))
            if usage is not None and _count(rich.get("totalTokens")) is not None:
                usage.total_tokens = rich["totalTokens"]
        return ev.SubagentEnded(
            call_id=call_id,
            status=status,
            duration_ms=result.duration_ms,
            usage=usage,
            parent=parent,
        )

    def _forget_subagent(self, call_id: str) -> None:
        """The subagent ended: its streamed messages have printed their assistant lines."""
        if call_id in self._streamed.values():
            self._streamed = {m: p for m, p in self._streamed.items() if p != call_id}

    # --- system lines -----------------------------------------------------------------------------

    def _system(self, msg: _SystemLine, line: bytes) -> list[ev.AgentEvent]:
        sub = msg.subtype
        if sub == "init":
            return [self._init(msg)]
        if sub == "compact_boundary":
            meta = msg.compact_metadata or _CompactMeta()
            post = meta.post_tokens if meta.post_tokens is not None else 0
            self._compaction = _PendingCompaction(meta.trigger, meta.pre_tokens, post)
            # The context is now what the compaction left: the turn's usage says so.
            self._context_used = post
            return []
        if sub == "api_retry":
            status = msg.error_status
            what = f"API error {status}" if status else "API error"
            if isinstance(msg.error, str) and msg.error:
                what += f" ({msg.error})"
            return [
                ev.Notice(
                    severity="warning",
                    code="API_RETRY",
                    message=f"{what}; retry {msg.attempt or '?'} of {msg.max_retries or '?'}"
                    f" in {msg.retry_delay_ms or 0} ms",
                    recoverable=True,
                    http_status=status,
                )
            ]
        if sub == "permission_denied":
            return [
                ev.Notice(
                    severity="warning",
                    code="PERMISSION_DENIED",
                    message=msg.message or f"{msg.tool_name} was not allowed",
                    recoverable=True,
                    tool_name=msg.tool_name,
                    call_id=msg.tool_use_id,
                )
            ]
        if sub == "task_started":
            call = self._calls.get(msg.tool_use_id or "")
            if call is not None and msg.is_backgrounded:
                call.background = True
            return []
        if sub == "task_progress":
            if not msg.tool_use_id:
                return []
            chunk = msg.description or (f"using {msg.last_tool_name}" if msg.last_tool_name else "")
            return [ev.ToolOutput(call_id=msg.tool_use_id, chunk=chunk, stream="progress")]
        if sub == "task_notification":
            return self._task_notification(msg)
        if sub in _QUIET_SYSTEM:
            return []
        return self._unknown(f"system/{sub}", line)

    def _init(self, msg: _SystemLine) -> ev.SessionStarted:
        self.mode = msg.permissionMode
        servers = []
        for server in msg.mcp_servers:
            prefix = f"mcp__{_mcp_name(server.name)}__"
            servers.append(
                ev.McpServer(
                    name=server.name,
                    status=server.status,
                    error=server.error,
                    tools=[t for t in msg.tools if t.startswith(prefix)],
                )
            )
        return ev.SessionStarted(
            agent_session_id=msg.session_id,
            model=msg.model,
            tools=list(msg.tools),
            mcp_servers=servers,
            commands=[
                ev.SlashCommand(name=c, description=self._describe(c)) for c in msg.slash_commands
            ],
            permission_mode=msg.permissionMode,
        )

    def _task_notification(self, msg: _SystemLine) -> list[ev.AgentEvent]:
        call_id = msg.tool_use_id
        if not call_id:
            return []
        call = self._calls.get(call_id)
        if call is not None and not call.background:
            # A foreground subagent: its end is told with its result, which follows.
            return []
        self._forget_subagent(call_id)
        status = {"completed": "completed", "failed": "failed", "killed": "cancelled"}.get(
            msg.status or "", "failed" if msg.status == "error" else "completed"
        )
        usage = msg.usage or {}
        total = _count(usage.get("total_tokens"))
        return [
            ev.SubagentEnded(
                call_id=call_id,
                status=status,  # type: ignore[arg-type]
                duration_ms=_count(usage.get("duration_ms")),
                summary=msg.summary,
                usage=ev.UsageInfo(total_tokens=total) if total is not None else None,
            )
        ]

    def _flush_compaction(self, text: str) -> list[ev.AgentEvent]:
        pending = self._compaction
        assert pending is not None
        self._compaction = None
        summary = _summary_of(text)
        trigger = "manual" if pending.trigger == "manual" else "auto"
        return [
            ev.Compacted(
                trigger=trigger,
                summary=summary,
                pre_tokens=pending.pre_tokens,
                post_tokens=pending.post_tokens,
                preserved=preserved_elements(summary),
            )
        ]

    # --- result and control lines -----------------------------------------------------------------

    def _forget_turn(self) -> None:
        """The turn is over: every API message of it has printed its assistant lines, so what was
        kept to tell streamed blocks from whole ones can go (it would grow with the session
        otherwise), and the next turn's API error is news again. A background subagent's messages
        may still be streaming: they are forgotten at its end."""
        if self._streamed:
            self._streamed = {m: p for m, p in self._streamed.items() if p is not None}
        self._aborted_streams.clear()
        self._whole_counts.clear()
        self._api_error_noticed = False

    def _result(self, msg: _ResultLine) -> list[ev.AgentEvent]:
        noticed = self._api_error_noticed
        self._forget_turn()
        if self._blocks:
            # The main agent's blocks still open were cut off (an interrupt, a stream error): its
            # turn is over, and the mapper closes them with it. A background subagent's may still
            # stream after the result: they stay.
            self._blocks = {k: b for k, b in self._blocks.items() if b[2] is not None}
        out: list[ev.AgentEvent] = []
        stop = _stop_reason(msg)
        api_error = msg.api_error_status is not None or msg.terminal_reason == "api_error"
        if api_error and not noticed:
            out.append(
                ev.Notice(
                    severity="error",
                    code="API_ERROR",
                    message=msg.result or "API error",
                    recoverable=False,
                    http_status=msg.api_error_status,
                )
            )
        capacity = None
        for model in (msg.modelUsage or {}).values():
            window = _count(model.get("contextWindow"))
            if window is not None:
                capacity = max(capacity or 0, window)
        error = None
        if msg.is_error:
            error = msg.result or "; ".join(str(e) for e in msg.errors or ()) or msg.subtype
        out.append(
            ev.TurnEnded(
                stop_reason=stop,  # type: ignore[arg-type]
                usage=_usage_of(msg.usage),
                cost_usd=msg.total_cost_usd,
                num_turns=msg.num_turns,
                context_window=capacity,
                context_used=self._context_used,
                is_error=msg.is_error,
                error=error,
            )
        )
        return out

    def _control_request(self, msg: _ControlRequestLine, line: bytes) -> list[ev.AgentEvent]:
        req = msg.request
        if req.subtype != "can_use_tool":
            return self._unknown(f"control_request/{req.subtype}", line)
        paths = _paths_of(req.input)
        if req.blocked_path and req.blocked_path not in paths:
            paths.append(req.blocked_path)
        call = self._calls.get(req.tool_use_id or "")
        return [
            ev.PermissionRequest(
                request_id=msg.request_id,
                tool_name=req.tool_name or "?",
                input=req.input,
                call_id=req.tool_use_id,
                reason=req.decision_reason_type,
                affected_paths=paths,
                parent=call.parent if call is not None else None,
            )
        ]

    def _control_response(self, msg: _ControlResponseLine) -> list[ev.AgentEvent]:
        body = msg.response
        ok = body.subtype == "success"
        out: list[ev.AgentEvent] = []
        if ok and body.response and isinstance(body.response.get("mode"), str):
            self.mode = body.response["mode"]  # set_permission_mode took effect
        if ok and body.response and isinstance(body.response.get("commands"), list):
            out.append(self._commands_listed(body.response["commands"]))  # the initialize answer
        ack = ev.ControlAck(
            request_id=body.request_id, ok=ok, error=body.error, response=body.response
        )
        return [ack, *out]

    def _commands_listed(self, listed: list[Any]) -> ev.CommandsListed:
        commands = []
        for item in listed[:_MAX_COMMANDS]:
            name = _str(item.get("name")) if isinstance(item, dict) else None
            if name is None:
                continue
            description = _str(item.get("description"))
            remembered = len(self._command_descriptions) < _MAX_COMMANDS
            if description is not None and name not in _COMMANDS and remembered:
                first = description.split("\n", 1)[0].strip()
                if len(first) > _MAX_COMMAND_DESCRIPTION:
                    first = first[: _MAX_COMMAND_DESCRIPTION - 1].rstrip() + "…"
                self._command_descriptions[name] = first
            commands.append(ev.SlashCommand(name=name, description=self._describe(name)))
        return ev.CommandsListed(commands=commands)

    def _describe(self, command: str) -> str | None:
        return _COMMANDS.get(command) or self._command_descriptions.get(command)


# --- pure helpers ---------------------------------------------------------------------------------


def _continues_compaction(msg: object) -> bool:
    """Lines that may sit between compact_boundary and its summary without ending the wait."""
    return type(msg) is _UserLine or (
        type(msg) is _SystemLine and msg.subtype in ("init", "status")  # type: ignore[attr-defined]
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _count(value: Any) -> int | None:
    """A count or a duration from free-form JSON: a whole number, not negative (JSON ``true`` is
    an int to Python, and would make a frame field of type integer invalid)."""
    return value if type(value) is int and value >= 0 else None


def _mcp_name(name: str) -> str:
    # Claude Code names MCP tools mcp__<server>__<tool> with the server name's other characters
    # replaced by underscores.
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def _text_of(content: Any) -> str:
    """Text of a message or tool_result content: a string, or a list of blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, _UserBlock):
                parts.append(block.text or "")
            elif isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
        return "".join(parts)
    return ""


# What a slash command run by the CLI itself (/compact, /cost, /context, ...) printed.
_LOCAL_OUTPUT: Final = re.compile(
    r"<local-command-(?:stdout|stderr)>(.*?)</local-command-(?:stdout|stderr)>", re.S
)

_ERROR_TAGS: Final = re.compile(r"^<tool_use_error>(.*)</tool_use_error>$", re.S)


def _strip_error_tags(text: str) -> str:
    m = _ERROR_TAGS.match(text)
    return m.group(1) if m else text


def _interrupted_meta(meta: list[dict[str, Any]] | None, call_id: str) -> bool:
    """An interrupted call: "user-rejected" with no permission decision behind it (a refused
    permission says ``permission_decision: reject``)."""
    for entry in meta or ():
        if entry.get("id") == call_id:
            return entry.get("non_execution_kind") == "user-rejected" and not entry.get(
                "permission_decision"
            )
    return False


def _context_of(usage: _ApiUsage) -> int:
    return (
        (usage.input_tokens or 0)
        + (usage.cache_read_input_tokens or 0)
        + (usage.cache_creation_input_tokens or 0)
        + (usage.output_tokens or 0)
    )


def _usage_of(usage: Any) -> ev.UsageInfo | None:
    if isinstance(usage, dict):
        try:
            usage = msgspec.convert(usage, _ApiUsage)
        except msgspec.ValidationError:  # free-form JSON (a subagent's tool_use_result)
            return None
    if not isinstance(usage, _ApiUsage):
        return None
    thinking = _count((usage.output_tokens_details or {}).get("thinking_tokens"))
    return ev.UsageInfo(
        input_tokens=usage.input_tokens or 0,
        output_tokens=usage.output_tokens or 0,
        cache_read_tokens=usage.cache_read_input_tokens,
        cache_write_tokens=usage.cache_creation_input_tokens,
        thinking_tokens=thinking,
    )


def _stop_reason(msg: _ResultLine) -> str:
    """The DPS stop_reason of a result line (§7.5.2)."""
    if msg.terminal_reason in ("aborted_streaming", "aborted_tools"):
        return "cancelled"
    if msg.terminal_reason == "api_error" or msg.api_error_status is not None:
        return "error"
    if msg.subtype == "error_max_turns":
        return "max_tokens"  # the turn hit a limit it was given; the closest DPS value
    if msg.subtype.startswith("error"):
        return "error"
    if msg.is_error:
        return "error"
    if msg.stop_reason is None:
        return "end_turn"  # a local command (e.g. /compact) with no model call
    return _STOP_REASONS.get(msg.stop_reason, "end_turn")


def _duration(rich: Any, started: str | None, ended: str | None) -> int | None:
    """The tool's own duration when it reports one, else the time between the CLI's timestamps of
    the call and of its result (the lines carry them; the core reads no clock)."""
    if isinstance(rich, dict):
        for key in ("durationMs", "totalDurationMs", "duration_ms"):
            if (own := _count(rich.get(key))) is not None:
                return own
    return elapsed_ms(started, ended)


def _paths_of(tool_input: dict[str, Any]) -> list[str]:
    paths = []
    for key in ("file_path", "notebook_path", "path"):
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            paths.append(value)
    edits = tool_input.get("edits")
    for edit in edits if isinstance(edits, list) else ():
        if isinstance(edit, dict) and isinstance(edit.get("file_path"), str):
            paths.append(edit["file_path"])
    return paths


def _shape_output(result: ev.ToolResult, call: _Call, rich: dict[str, Any]) -> None:
    """Fill ``output`` (and ``changed``/``listing``) from the tool's ``tool_use_result``."""
    name = call.name
    if name in ("Edit", "MultiEdit", "Write", "NotebookEdit"):
        path = str(rich.get("filePath") or rich.get("notebook_path") or call.input.get("file_path"))
        patch = rich.get("structuredPatch")
        if isinstance(patch, list) and patch:
            result.output, result.changed = unified_diff(path, patch), True
        elif rich.get("type") == "create" and isinstance(rich.get("content"), str):
            result.output, result.changed = new_file_diff(path, rich["content"]), True
        elif name == "NotebookEdit":
            result.changed = True  # a cell changed; the CLI gives no diff for it
        else:
            result.output, result.changed = None, False
    elif name in ("Read", "NotebookRead"):
        file = rich.get("file")
        if isinstance(file, dict) and isinstance(file.get("content"), str):
            result.output = file["content"]
    elif name in ("Glob", "LS"):
        if isinstance(rich.get("filenames"), list):
            result.output, result.listing = rich["filenames"], True
    elif name == "Grep":
        if rich.get("mode") == "files_with_matches" and isinstance(rich.get("filenames"), list):
            result.output, result.listing = rich["filenames"], True
        elif isinstance(rich.get("content"), str):
            result.output = rich["content"]
    elif name in ("Bash", "BashOutput"):
        stdout, stderr = rich.get("stdout"), rich.get("stderr")
        if isinstance(stdout, str):
            both = [s for s in (stdout, stderr if isinstance(stderr, str) else "") if s]
            result.output = "\n".join(both)
            # Output too large: the CLI saved all of it to a file and printed only the start.
            size = rich.get("persistedOutputSize")
            result.truncated = isinstance(size, int) and size > len(stdout)
    elif name in ("TodoWrite", "TodoRead"):
        if isinstance(rich.get("newTodos"), list):
            result.output = rich["newTodos"]
    elif name in ("Agent", "Task"):
        result.output = _agent_output(rich, result.output)


def _binary_blocks(content: Any, path: str | None) -> list[ev.BinaryData]:
    """The base64 blocks of a tool_result's content: the image a ``Read`` of a PNG gives the model
    (``{"type": "image", "source": {"type": "base64", "media_type", "data"}}``), a document, or
    what an MCP tool returned. The line's ``tool_use_result`` repeats the same bytes; the content
    block is used because it belongs to its own result even when a line carries several."""
    if not isinstance(content, list):
        return []
    found = []
    for block in content:
        source = block.get("source") if isinstance(block, dict) else None
        if (
            isinstance(source, dict)
            and source.get("type") == "base64"
            and isinstance(source.get("data"), str)
        ):
            mime = source.get("media_type")
            found.append(
                ev.BinaryData(
                    data=source["data"],
                    mime_type=mime if isinstance(mime, str) else "application/octet-stream",
                    path=path,
                )
            )
    return found


_TOOLS_USED_TAG: Final = re.compile(
    r"<tools-used-before-summary>.*?</tools-used-before-summary>\s*"
)


def _agent_output(rich: dict[str, Any], fallback: Any) -> Any:
    """The subagent's result: its report text plus what the CLI says about the run."""
    content = rich.get("content")
    text = _TOOLS_USED_TAG.sub("", _text_of(content)) if isinstance(content, list) else fallback
    out: dict[str, Any] = {"text": text}
    for src, dst in (
        ("status", "status"),
        ("agentId", "agent_id"),
        ("agentType", "agent_type"),
        ("toolsUsed", "tools_used"),
        ("totalTokens", "total_tokens"),
        ("totalToolUseCount", "tool_use_count"),
        ("totalDurationMs", "duration_ms"),
    ):
        if rich.get(src) is not None:
            out[dst] = rich[src]
    return out


# The compaction summary sits between "Summary:" and the CLI's closing instructions.
_SUMMARY_START: Final = re.compile(r"^Summary:\s*$", re.M)
_SUMMARY_END: Final = re.compile(r"\n\s*If you need specific details from before compaction", re.S)


def _summary_of(text: str) -> str:
    start = _SUMMARY_START.search(text)
    if start is None:
        return text.strip()
    body = text[start.end() :]
    end = _SUMMARY_END.search(body)
    return (body[: end.start()] if end else body).strip()


_SECTION: Final = re.compile(r"^\s*\d+\.\s+([^:\n]+):\s*(.*)$")
_BULLET: Final = re.compile(r"^\s*[-*]\s+(.*\S)\s*$")
_PATH: Final = re.compile(r"(?:^|[\s`(])((?:/|\./|\w[\w.-]*/)[\w./-]*\w)")
# Summary section titles (Claude Code's compaction prompt) → §7.2.1 preserved_elements keys.
_PRESERVED_SECTIONS: Final = {
    "files and code sections": "files_modified",
    "errors and fixes": "errors_encountered",
    "problem solving": "decisions_made",
    "key technical concepts": "decisions_made",
    "pending tasks": "active_todos",
}


def preserved_elements(summary: str) -> dict[str, list[Any]] | None:
    """§7.2.1 ``preserved_elements`` from the sections a Claude Code summary names, if any.

    Files are the paths named in "Files and Code Sections"; errors, decisions and pending tasks are
    the bullets of their sections (tasks as ``{"content": ...}`` objects). None when the summary
    has none of those sections.
    """
    found: dict[str, list[Any]] = {}
    current: str | None = None
    for line in summary.splitlines():
        section = _SECTION.match(line)
        if section and not line.startswith((" ", "\t")):
            current = _PRESERVED_SECTIONS.get(section.group(1).strip().lower())
            rest = section.group(2).strip()
            if current and rest:
                _add_preserved(found, current, rest)
            continue
        bullet = _BULLET.match(line)
        if current and bullet:
            _add_preserved(found, current, bullet.group(1))
    return found or None


def _add_preserved(found: dict[str, list[Any]], key: str, text: str) -> None:
    items = found.setdefault(key, [])
    if key == "files_modified":
        for path in _PATH.findall(text):
            if path not in items:
                items.append(path)
    elif key == "active_todos":
        items.append({"content": text})
    else:
        items.append(text)


# Descriptions of the built-in slash commands 2.1.328 lists; others are named by the CLI only.
_COMMANDS: Final[dict[str, str]] = {
    "compact": "Compact the conversation, keeping a summary in context",
    "clear": "Clear the conversation history",
    "context": "Show the current context usage",
    "cost": "Show the cost and duration of the session",
    "usage": "Show plan usage limits",
    "model": "Set the model",
    "config": "Open the settings",
    "init": "Write a CLAUDE.md for the codebase",
    "mcp": "Manage MCP servers",
    "agents": "Manage subagent configurations",
    "review": "Review a pull request",
    "security-review": "Review the pending changes for security issues",
    "output-style": "Set the output style",
    "effort": "Set the reasoning effort",
    "fast": "Toggle fast mode",
    "rename": "Rename the session",
    "recap": "Summarise the session so far",
    "insights": "Report on the session",
    "doctor": "Diagnose the installation",
    "reload-plugins": "Reload plugins",
    "reload-skills": "Reload skills",
    "heapdump": "Write a heap dump",
    "color": "Set the prompt colour",
    "focus": "Toggle focus view",
    "autocompact": "Configure automatic compaction",
    "list-agents": "List the available subagents",
}


# --- stdin ------------------------------------------------------------------------------------------

_encode: Final = msgspec.json.encode


class ClaudeCodeInput:
    """What the gateway writes on Claude Code's stdin (``--input-format stream-json``): one JSON
    object per line."""

    accepts_images: ClassVar[bool] = True

    def prompt(self, text: str, images: Sequence[PromptImage] = ()) -> bytes | None:
        content: str | list[dict[str, Any]] = text
        if images:
            # Image blocks first, then the text (the Messages API's advice for image prompts);
            # the CLI passes them to the model as they are.
            content = [
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": image.mime_type,
                        "data": base64.b64encode(image.data).decode("ascii"),
                    },
                }
                for image in images
            ]
            content.append({"type": "text", "text": text})
        return _encode({"type": "user", "message": {"role": "user", "content": content}}) + b"\n"

    def interrupt(self, request_id: str) -> bytes | None:
        return (
            _encode(
                {
                    "type": "control_request",
                    "request_id": request_id,
                    "request": {"subtype": "interrupt"},
                }
            )
            + b"\n"
        )

    def permission(
        self,
        request_id: str,
        *,
        allow: bool,
        message: str = "",
        updated_input: dict[str, Any] | None = None,
    ) -> bytes | None:
        # The CLI requires updatedInput on allow; the original input means "run it as asked".
        answer: dict[str, Any]
        if allow:
            answer = {"behavior": "allow", "updatedInput": updated_input or {}}
        else:
            answer = {"behavior": "deny", "message": message or "Denied by the user."}
        return (
            _encode(
                {
                    "type": "control_response",
                    "response": {
                        "subtype": "success",
                        "request_id": request_id,
                        "response": answer,
                    },
                }
            )
            + b"\n"
        )

    def set_mode(self, request_id: str, mode: str) -> bytes | None:
        return (
            _encode(
                {
                    "type": "control_request",
                    "request_id": request_id,
                    "request": {"subtype": "set_permission_mode", "mode": mode},
                }
            )
            + b"\n"
        )

    def initialize(self, request_id: str) -> bytes | None:
        """Asked at spawn: the CLI answers at once with its slash commands (its ``init`` line,
        with the tools, comes only when a prompt starts a run)."""
        return (
            _encode(
                {
                    "type": "control_request",
                    "request_id": request_id,
                    "request": {"subtype": "initialize"},
                }
            )
            + b"\n"
        )


def _saved() -> SavedFormat:
    from .claude_code_saved import FORMAT  # it builds on this module's parser

    return FORMAT


SPEC: Final = ParserSpec(
    name="claude-code",
    parser=ClaudeCodeParser,
    input=ClaudeCodeInput,
    saved=_saved,
    description="Claude Code CLI (stream-json, tested with 2.1.328)",
    credentials="ANTHROPIC_API_KEY, or the login that `claude` then /login keeps in "
    "~/.claude/.credentials.json of the user running the gateway",
    # Thinking and tool input deltas (--include-partial-messages), Task subagents with their
    # context, /compact and permission modes (plan) on stdin: the CLI does all of them.
    features=frozenset(
        {
            "thinking_stream",
            "tool_streaming",
            "subagent",
            "subagent_context",
            "context_compaction",
            "plan_mode",
        }
    ),
    # What 2.1.328's init lists with --input-format stream-json and --permission-prompt-tool
    # stdio (the long-lived profile): the catalog until the CLI's own init, at the first prompt.
    tools=(
        "Task",
        "AskUserQuestion",
        "Bash",
        "CronCreate",
        "CronDelete",
        "CronList",
        "Edit",
        "EnterPlanMode",
        "EnterWorktree",
        "ExitPlanMode",
        "ExitWorktree",
        "ListAgents",
        "Monitor",
        "NotebookEdit",
        "Read",
        "ReportFindings",
        "ScheduleWakeup",
        "SendMessage",
        "Skill",
        "TaskStop",
        "ToolSearch",
        "WebFetch",
        "WebSearch",
        "Workflow",
        "Write",
    ),
)
