"""``ClaudeCodeParser``: Claude Code's stream-json stdout, one line at a time, into agent events.

What it keeps between lines (open streamed blocks, messages seen streamed, open tool calls, a
compaction waiting for its summary, the permission mode) and what each line kind does to it; the
theory of operation is the package's (``parsers/claude_code/__init__.py``), the line kinds are
``wire.py``, the shaping of what a line carries ``content.py``.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from .. import events as ev
from .. import numbers
from ..base import JsonLinesParser
from ..json_depth import MAX_AGENT_LINE_DEPTH, too_deep
from .content import (
    COMMANDS,
    LOCAL_OUTPUT,
    binary_blocks,
    context_of,
    context_window_of,
    count,
    duration,
    foreground_subagent_end,
    interrupted_meta,
    mcp_servers_of,
    nonempty_str,
    paths_of,
    preserved_elements,
    shape_output,
    stop_reason_of,
    strip_error_tags,
    summary_of,
    text_of,
    usage_of,
)
from .wire import (
    LINE_KINDS,
    AssistantLine,
    Block,
    CompactMeta,
    ControlRequestLine,
    ControlResponseLine,
    ResultLine,
    StreamEventLine,
    SystemLine,
    UserBlock,
    UserLine,
    line_decoder,
)

__all__ = ["MAX_OPEN_BLOCKS", "MAX_STREAMED_MESSAGES", "ClaudeCodeParser"]

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


# System subtypes that are understood and deliberately produce nothing: their information reaches
# the master another way (task_updated and background_tasks_changed: task_notification;
# thinking_tokens: the result's usage; status: compact_boundary reports the compaction).
# task_started produces nothing either but is read first (it says whether a subagent runs in the
# background).
_QUIET_SYSTEM: Final = frozenset(
    {"task_updated", "background_tasks_changed", "thinking_tokens", "status"}
)


class _ToolUse(msgspec.Struct):
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
    """Claude Code's stream-json stdout, one line at a time (see the package docstring)."""

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
    KNOWN_KINDS = LINE_KINDS

    def __init__(self) -> None:
        super().__init__()
        # Streamed blocks still open: (message id, index) → (block key, kind, parent).
        self._blocks: dict[tuple[str, int], tuple[str, str, str | None]] = {}
        # API message ids seen through stream_event → the subagent that streamed them (None: main)
        self._streamed: dict[str, str | None] = {}
        self._aborted_streams: set[str] = set()
        self._whole_counts: dict[str, int] = {}  # message id → whole blocks seen (for keys)
        self._calls: dict[str, _ToolUse] = {}  # open tool calls by tool_use id
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
            msg = line_decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as err:
            return self._refused(line, err)
        # The hot path first: a streamed text delta.
        if type(msg) is StreamEventLine and self._compaction is None:
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
        if type(msg) is StreamEventLine:
            return out + self._stream_event(msg)
        if type(msg) is AssistantLine:
            return out + self._assistant(msg)
        if type(msg) is UserLine:
            return out + self._user(msg)
        if type(msg) is SystemLine:
            return out + self._system(msg, line)
        if type(msg) is ResultLine:
            return out + self._result(msg)
        if type(msg) is ControlRequestLine:
            return out + self._control_request(msg, line)
        if type(msg) is ControlResponseLine:
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

    def _stream_event(self, msg: StreamEventLine) -> list[ev.AgentEvent]:
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

    def _assistant(self, msg: AssistantLine) -> list[ev.AgentEvent]:
        message = msg.message
        parent = msg.parent_tool_use_id
        if msg.is_api_error_message:
            return self._api_error_message(msg)
        if parent is None and message.usage is not None:
            self._context_used = context_of(message.usage)
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

    def _tool_use(self, msg: AssistantLine, block: Block) -> list[ev.AgentEvent]:
        call_id = block.id or ""
        name = block.name or "?"
        tool_input = block.input or {}
        parent = msg.parent_tool_use_id
        subagent = name in ("Agent", "Task")
        background = subagent and bool(tool_input.get("run_in_background"))
        if len(self._calls) >= _MAX_OPEN_CALLS:
            # Calls whose result never came (the CLI died, an interrupt lost it): forget the oldest.
            del self._calls[next(iter(self._calls))]
        self._calls[call_id] = _ToolUse(name, tool_input, parent, msg.timestamp, background)
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
            call.subagent_type = nonempty_str(tool_input.get("subagent_type")) or "general-purpose"
            call.description = nonempty_str(tool_input.get("description"))
        elif name == "ExitPlanMode" and isinstance(tool_input.get("plan"), str):
            # The plan document is content for the user, marked as such (Appendix A.3).
            key = f"{call_id}:plan"
            out.append(ev.TextDelta(block=key, text=tool_input["plan"], parent=parent, role="plan"))
            out.append(ev.TextEnd(block=key, parent=parent))
        out.append(call)
        return out

    def _api_error_message(self, msg: AssistantLine) -> list[ev.AgentEvent]:
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

    def _user(self, msg: UserLine) -> list[ev.AgentEvent]:
        content = msg.message.content
        if self._compaction is not None and msg.isSynthetic:
            return self._flush_compaction(text_of(content))
        if isinstance(content, str) or (content and all(b.type == "text" for b in content)):
            # A prompt (replayed) is what the master sent; a slash command's output is news.
            return self._local_command_output(text_of(content), msg.parent_tool_use_id)
        out: list[ev.AgentEvent] = []
        results = [b for b in content if b.type == "tool_result"]
        for block in results:
            out += self._tool_result(msg, block, len(results) == 1)
        return out

    def _local_command_output(self, text: str, parent: str | None) -> list[ev.AgentEvent]:
        found = LOCAL_OUTPUT.findall(text)
        if not found:
            return []
        self._local_outputs += 1
        key = f"local:{self._local_outputs}"
        body = "\n".join(part for part in found if part)
        return [
            ev.TextDelta(block=key, text=body, parent=parent, role="command_output"),
            ev.TextEnd(block=key, parent=parent),
        ]

    def _tool_result(self, msg: UserLine, block: UserBlock, only: bool) -> list[ev.AgentEvent]:
        call_id = block.tool_use_id or ""
        call = self._calls.pop(call_id, None)
        name = call.name if call is not None else None
        parent = msg.parent_tool_use_id
        is_error = bool(block.is_error)
        # tool_use_result belongs to the line; with several results on one line it cannot be
        # told apart, so it is used only when the line has one.
        rich = msg.tool_use_result if only else None
        text = strip_error_tags(text_of(block.content))
        cancelled = is_error and (
            rich == _INTERRUPT_RESULT or interrupted_meta(msg.tool_result_meta, call_id)
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
            shape_output(result, call.name, call.input, rich)
        if not is_error:
            path = call.input.get("file_path") if call is not None else None
            result.binary = binary_blocks(block.content, path if isinstance(path, str) else None)
        if call is not None:
            result.duration_ms = duration(rich, call.started, msg.timestamp)
        out: list[ev.AgentEvent] = []
        if name in ("Agent", "Task") and call is not None:
            if isinstance(rich, dict) and rich.get("isAsync"):
                call.background = True
            if call.background:
                result.background = True
            else:
                self._forget_subagent(call_id)
                out.append(foreground_subagent_end(call_id, result, rich, parent))
        out.append(result)
        return out

    def _forget_subagent(self, call_id: str) -> None:
        """The subagent ended: its streamed messages have printed their assistant lines."""
        if call_id in self._streamed.values():
            self._streamed = {m: p for m, p in self._streamed.items() if p != call_id}

    # --- system lines -----------------------------------------------------------------------------

    def _system(self, msg: SystemLine, line: bytes) -> list[ev.AgentEvent]:
        sub = msg.subtype
        if sub == "init":
            return [self._init(msg)]
        if sub == "compact_boundary":
            meta = msg.compact_metadata or CompactMeta()
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

    def _init(self, msg: SystemLine) -> ev.SessionStarted:
        self.mode = msg.permissionMode
        return ev.SessionStarted(
            agent_session_id=msg.session_id,
            model=msg.model,
            tools=list(msg.tools),
            mcp_servers=mcp_servers_of(msg),
            commands=[
                ev.SlashCommand(name=c, description=self._describe(c)) for c in msg.slash_commands
            ],
            permission_mode=msg.permissionMode,
        )

    def _task_notification(self, msg: SystemLine) -> list[ev.AgentEvent]:
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
        total = count(usage.get("total_tokens"))
        return [
            ev.SubagentEnded(
                call_id=call_id,
                status=status,  # type: ignore[arg-type]
                duration_ms=count(usage.get("duration_ms")),
                summary=msg.summary,
                usage=ev.UsageInfo(total_tokens=total) if total is not None else None,
            )
        ]

    def _flush_compaction(self, text: str) -> list[ev.AgentEvent]:
        pending = self._compaction
        assert pending is not None
        self._compaction = None
        summary = summary_of(text)
        trigger: Literal["auto", "manual"] = "manual" if pending.trigger == "manual" else "auto"
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

    def _result(self, msg: ResultLine) -> list[ev.AgentEvent]:
        noticed = self._api_error_noticed
        self._forget_turn()
        if self._blocks:
            # The main agent's blocks still open were cut off (an interrupt, a stream error): its
            # turn is over, and the mapper closes them with it. A background subagent's may still
            # stream after the result: they stay.
            self._blocks = {k: b for k, b in self._blocks.items() if b[2] is not None}
        out: list[ev.AgentEvent] = []
        stop = stop_reason_of(msg)
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
        error = None
        if msg.is_error:
            error = msg.result or "; ".join(str(e) for e in msg.errors or ()) or msg.subtype
        # Odd numbers are dropped, not the line: a result line refused would never end the turn.
        odd = numbers.OddFields()
        usage = usage_of(msg.usage, odd)
        cost = odd.cost(msg.total_cost_usd, "total_cost_usd")
        num_turns = odd.count(msg.num_turns, "num_turns")
        if odd.names:
            out.append(ev.OddNumbers(kind="result", fields=odd.names))
        out.append(
            ev.TurnEnded(
                stop_reason=stop,  # type: ignore[arg-type]
                usage=usage,
                cost_usd=cost,
                num_turns=num_turns,
                context_window=context_window_of(msg),
                context_used=self._context_used,
                is_error=msg.is_error,
                error=error,
            )
        )
        return out

    def _control_request(self, msg: ControlRequestLine, line: bytes) -> list[ev.AgentEvent]:
        req = msg.request
        if req.subtype != "can_use_tool":
            return self._unknown(f"control_request/{req.subtype}", line)
        paths = paths_of(req.input)
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

    def _control_response(self, msg: ControlResponseLine) -> list[ev.AgentEvent]:
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
            name = nonempty_str(item.get("name")) if isinstance(item, dict) else None
            if name is None:
                continue
            description = nonempty_str(item.get("description"))
            remembered = len(self._command_descriptions) < _MAX_COMMANDS
            if description is not None and name not in COMMANDS and remembered:
                first = description.split("\n", 1)[0].strip()
                if len(first) > _MAX_COMMAND_DESCRIPTION:
                    first = first[: _MAX_COMMAND_DESCRIPTION - 1].rstrip() + "…"
                self._command_descriptions[name] = first
            commands.append(ev.SlashCommand(name=name, description=self._describe(name)))
        return ev.CommandsListed(commands=commands)

    def _describe(self, command: str) -> str | None:
        return COMMANDS.get(command) or self._command_descriptions.get(command)


# --- pure helpers ---------------------------------------------------------------------------------


def _continues_compaction(msg: object) -> bool:
    """Lines that may sit between compact_boundary and its summary without ending the wait."""
    return type(msg) is UserLine or (
        type(msg) is SystemLine and msg.subtype in ("init", "status")  # type: ignore[attr-defined]
    )
