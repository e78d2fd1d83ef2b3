"""The mapper: normalised agent events (``parsers/events.py``) → DPS frames, for any agent.

Theory of operation
-------------------
A parser says what the agent did in the agent's own terms (block keys, tool call ids); the mapper
gives those things their DPS identities and puts the frames in the order the spec requires. It is
sans-IO: ``map(event)`` returns the frames for one event; the session machine
(``gateway/protocol/machine.py``) owns turns, interactions and control acks and calls
``begin_turn`` / ``end_turn`` around them.

The machine calls the mapper once per agent event, never back and forth: what it decided about
the event (it opens a turn, its call is refused for the mode or answered by a permission rule, a
question about it goes to the masters) comes with it, as a ``Note``, to ``map_noted``. Most events
need no note and go to ``map``, the per-line path.

What it keeps, per turn unless said otherwise:

* **Blocks**: each parser block key gets the next ``content_index`` of the turn on its first delta,
  so indexes are unique in the turn however the agent numbers its blocks (DPS-4.1-text). The mapper
  keeps the text it sent, so ``agent.text.done`` ``full_text`` is exactly the deltas' concatenation;
  it stops keeping it once the block passes ``max_frame_size`` characters, since such a
  ``full_text`` could never fit its frame (it is omitted, ``metadata.full_text_omitted: true``): an
  open block holds at most one frame's worth of text, however long the agent writes.
* **Calls**: each agent call id gets a fresh UUID v4 ``invocation_id`` (the agent's id stays in
  ``metadata.agent_call_id``), the ``parallel_group_id`` of its ``group`` (one UUID per group value
  per turn; a lone call gets its own), and a record that lives until its one
  ``tool.invoke.result`` (DPS-5.3.1-result). ``output_type`` is §5.3.3 (``tools.decide_output_type``)
  from the built-in catalog plus the event's ``changed``/``listing``.
* **Subagents** (§10): a call with ``subagent_type`` (or a ``delegate`` tool) is followed by
  ``agent.subagent.started``; events whose ``parent`` is a known call get
  ``metadata.subagent_context`` with depth = the parent call's depth + 1 (DPS-10.2-context). A
  subagent's end becomes its own ``session.usage`` (DPS-10.5-usage, when the agent reported usage),
  then ``agent.subagent.ended`` right before the call's ``agent_result`` (DPS-10.3-order). A
  background subagent's call returns at once (``ToolResult.background``): that result is held until
  the subagent's ``SubagentEnded``; if the turn ends first, ``end_turn`` ends it there.
* **State**: ``agent.state.changed`` is inferred from the main agent's events (model output →
  ``thinking``, a call → ``tool_calling``, the last open call's result → ``thinking``, turn end →
  ``idle``); a subagent's events do not move it, the main agent is waiting on the call then.
* **Size**: a result whose encoded frame would exceed ``max_frame_size`` has its output cut and
  ``truncated: true``; an oversized request input is cut the same way (``metadata.input_truncated``).
  A text, thinking or tool-stream event longer than one frame is split into several deltas (or
  stream chunks) that each fit. One event carries at most ``max_frame_size`` characters: the rest is
  cut, its last frame says ``metadata.text_truncated: true`` and ``omitted_chars``, and an
  ``agent.error`` warning ``OUTPUT_TRUNCATED`` follows. So one agent line (a 20 MB line of a plain
  program) gives a bounded burst of frames, which a master that keeps reading always takes: the
  per-connection send queue is there to cut off masters that stopped reading, not this.

``Mapper`` is kept whole on purpose: it is one state machine over one turn's state. Blocks, calls
and subagents are not separate rooms: a delta moves the inferred state that a call's result moves
back, a subagent's context is read by the blocks and calls under it, and §10.3 orders a
subagent's end against its call's result. Most agent lines go through it (``map`` and the text
delta), so its parts stay methods of one class: a helper object would cost a call or an attribute
hop per line. What holds no state is beside it: the catalog in ``tools.py``, ``session.usage`` in
``usage.py``, what a result's output becomes (binary refs, cuts to fit a frame) in ``results.py``.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from gateway.protocol import frames as F
from gateway.protocol.codec import encode
from gateway.protocol.factory import FrameFactory
from gateway.protocol.results import (
    binary_refs,
    cut_input,
    cut_output,
    released_output,
    subagent_status,
)
from gateway.protocol.tools import ToolSpec, build_catalog, decide_output_type, lookup
from gateway.protocol.usage import subagent_usage_payload, usage_payload
from parsers import events as ev
from parsers.api_errors import about_credentials, credentials_hint

__all__ = ["BLOCKED_OUTPUT", "Mapper", "Note"]

BLOCKED_OUTPUT: Final = "Tool not allowed in current mode"  # DPS-6.3.2-block
_FRAME_MARGIN: Final = 256  # bytes kept free under max_frame_size when cutting
_MAX_CONTEXTS: Final = 1024  # subagent contexts remembered (for late frames of background ones)


@dataclass(slots=True)
class Note:
    """What the session machine decided about one agent event, handed over with it
    (``Mapper.map_noted``)."""

    opens: str | None = None  # the event opens this turn (the agent spoke outside one)
    blocked: bool = False  # the event's call is refused for the mode (DPS-6.3.2-block)
    tags: dict[str, Any] | None = None  # for the call's later frames (the rule that answered)
    # The question to the masters about the event's call (``agent.interaction.request``), and its
    # own metadata beside the call's (the rule that said ask).
    asks: F.InteractionRequest | None = None
    ask_metadata: dict[str, Any] | None = None


class _Block:
    __slots__ = ("cancelled", "index", "kind", "metadata", "size", "text")

    def __init__(self, index: int, kind: str, metadata: dict[str, Any] | None) -> None:
        self.index = index
        self.kind = kind
        self.metadata = metadata
        self.cancelled = False  # open when the turn was cancelled: its done says is_cancelled
        # The text sent so far, for full_text (thinking has none); None once it is too long to
        # be sent (see ``keep``). One buffer, not a list of parts: a million one-line deltas cost
        # their characters, not a million string objects.
        self.text: io.StringIO | None = io.StringIO() if kind == "text" else None
        self.size = 0

    def keep(self, text: str, limit: int) -> None:
        if self.text is None:
            return
        self.size += len(text)
        if self.size > limit:
            self.text = None  # full_text would not fit its frame: it will be omitted
        else:
            self.text.write(text)


class _Invocation:
    __slots__ = (
        "background",
        "blocked",
        "context",
        "depth",
        "ended",
        "held",
        "invocation_id",
        "main",
        "metadata",
        "sequence",
        "spec",
        "subagent_type",
        "tool_name",
    )

    def __init__(
        self,
        invocation_id: str,
        tool_name: str,
        spec: ToolSpec,
        context: F.SubagentContext | None,
        metadata: dict[str, Any],
    ) -> None:
        self.invocation_id = invocation_id
        self.tool_name = tool_name
        self.spec = spec
        self.context = context  # the subagent context of the call's own frames
        self.depth = context.depth if context is not None else 0
        self.main = context is None
        self.metadata = metadata
        self.subagent_type: str | None = None  # set when the call starts a subagent
        self.background = False
        self.blocked = False
        self.sequence = 0  # next tool.invoke.stream sequence
        self.ended: ev.SubagentEnded | None = None  # a subagent's end, waiting for the result
        self.held: ev.ToolResult | None = None  # a background subagent's early result


class Mapper:
    """Agent events → DPS frames for one Agent Session (see the module docstring)."""

    def __init__(
        self,
        factory: FrameFactory,
        *,
        max_frame_size: int = 1 << 20,
        forward_unknown: bool = False,
        agent: str = "agent",
        credentials: str = "",
    ) -> None:
        if max_frame_size < 4 * _FRAME_MARGIN:
            raise ValueError(f"max_frame_size must be at least {4 * _FRAME_MARGIN} bytes")
        self._factory = factory
        self.max_frame_size = max_frame_size
        self.forward_unknown = forward_unknown
        self.agent = agent  # named in x-rawp-gateway.agent.raw frames
        self.credentials = credentials  # where the agent reads them (ParserSpec.credentials)
        self.turn_id: str | None = None
        self.catalog: F.Frame | None = None
        # What became of the session's MCP servers (set by the machine): the catalog's
        # ``metadata.rawp_mcp_servers``, a gateway extension (docs/mcp.md#what-masters-see).
        self.mcp_servers: list[dict[str, Any]] = []
        self.commands: F.Frame | None = None
        self.agent_state: str = "idle"
        self.tool_invocation_count = 0
        # The turn runs a compaction a master asked for: its session.compacted says "requested".
        self._compaction_requested = False
        self.dropped_results = 0  # results for calls never seen (or already ended): not sent
        self._next_index = 0
        self._blocks: dict[str, _Block] = {}
        self._calls: dict[str, _Invocation] = {}
        self._groups: dict[str, str] = {}
        # Subagent contexts by parent call id; kept past the call's result so that a background
        # subagent's late frames still say where they come from.
        self._contexts: dict[str, F.SubagentContext] = {}
        self._text_chunk = max(1, max_frame_size // 8)  # chars per delta (≤ 6 bytes each escaped)
        # More characters than this cannot fit a frame: the most full_text keeps, and the most one
        # event carries (see "Size" in the module docstring).
        self._full_text_limit = max_frame_size - _FRAME_MARGIN
        self._event_text_limit = max_frame_size
        self._dispatch = {
            ev.TextDelta: self._text_delta,
            ev.ThinkingDelta: self._thinking_delta,
            ev.TextEnd: self._block_end,
            ev.ThinkingEnd: self._block_end,
            ev.ToolCall: self._tool_call,
            ev.ToolOutput: self._tool_output,
            ev.ToolResult: self._tool_result,
            ev.SubagentEnded: self._subagent_ended,
            ev.SessionStarted: self._session_started,
            ev.CommandsListed: self._commands_listed,
            ev.Notice: self._notice,
            ev.Compacted: self._compacted,
            ev.Unknown: self._unknown,
        }

    # --- the contract with the session machine ---------------------------------------------------

    def begin_turn(self, turn_id: str, *, requested_compaction: bool = False) -> None:
        """A new turn: content indexes restart, counters and groups reset. ``requested_compaction``:
        the turn is a compaction a master asked for (``session.compacted`` says ``requested``)."""
        self.turn_id = turn_id
        self._compaction_requested = requested_compaction
        self._next_index = 0
        self._blocks.clear()
        self._groups.clear()
        self.tool_invocation_count = 0

    def map(self, event: ev.AgentEvent) -> list[F.Frame]:
        """The frames for one event. ``TurnEnded``, ``PermissionRequest``, ``ControlAck`` and
        ``ParseError`` give none: the session machine (or the shell) handles them."""
        handler = self._dispatch.get(type(event))
        return handler(event) if handler is not None else []  # type: ignore[operator]

    def map_noted(self, event: ev.AgentEvent, note: Note) -> list[F.Frame]:
        """``map`` of an event the session machine decided something about (``Note``): the turn
        it opens begins, its call is marked, and a question about it comes first (the frame the
        machine keeps for masters that attach while it waits), with the ``awaiting_input`` state."""
        if note.opens is not None:
            self.begin_turn(note.opens)
        call_id = getattr(event, "call_id", None)
        call = self._calls.get(call_id) if call_id else None
        if call is not None and note.blocked:
            call.blocked = True
        if call is not None and note.tags:
            # A new dict: the frames sent so far keep theirs.
            call.metadata = {**call.metadata, **note.tags}
        out: list[F.Frame] = []
        if note.asks is not None:
            out.append(self._question(note.asks, call, getattr(event, "parent", None), note))
            out += self.set_agent_state("awaiting_input", "permission_request")
        return out + self.map(event)

    def _question(
        self,
        payload: F.InteractionRequest,
        call: _Invocation | None,
        parent: str | None,
        note: Note,
    ) -> F.Frame:
        metadata: dict[str, Any] = {}
        if call is not None:
            metadata["invocation_id"] = call.invocation_id
        if (subagent := self._context(parent)) is not None:
            metadata["subagent_context"] = subagent  # DPS-10.2-context: asked from a subagent
        metadata.update(note.ask_metadata or {})
        return self._frame(payload, metadata or None)

    def end_turn(self, stop_reason: str, ended: ev.TurnEnded | None = None) -> list[F.Frame]:
        """Close the turn: open blocks done (``is_cancelled`` when cancelled), a ``cancelled``
        result for every open call (DPS-6.1.2-cancel, DPS-7.5.3-cleanup) — a held background
        subagent is ended and its held result released instead — then ``session.turn.end``,
        ``session.usage`` right after it (DPS-7.5.2-usage) and ``idle``."""
        cancelled = stop_reason == "cancelled"
        out: list[F.Frame] = []
        for block in list(self._blocks.values()):
            out.append(self._done(block, cancelled or block.cancelled))
        self._blocks.clear()
        for call_id, call in list(self._calls.items()):
            out += self._close_call(call_id, call, cancelled)
        turn_id = self.turn_id or self._factory.new_id()
        out.append(
            self._frame(
                F.TurnEnd(
                    turn_id=turn_id,
                    stop_reason=stop_reason,  # type: ignore[arg-type]
                    tool_invocation_count=self.tool_invocation_count,
                )
            )
        )
        out.append(self.usage_frame(ended) if ended is not None else self._usage_frame(None))
        out += self.set_agent_state("idle", "turn_end")
        self.turn_id = None
        self._compaction_requested = False
        self._groups.clear()
        self.tool_invocation_count = 0
        return out

    def usage_frame(self, ended: ev.TurnEnded) -> F.Frame:
        """``session.usage`` for a ``TurnEnded`` (also one that arrives outside any turn)."""
        return self._usage_frame(ended)

    def set_agent_state(self, state: str, reason: str | None = None) -> list[F.Frame]:
        """``agent.state.changed`` when ``state`` differs from the current one."""
        if state == self.agent_state:
            return []
        previous, self.agent_state = self.agent_state, state
        return [
            self._frame(F.StateChanged(previous_state=previous, current_state=state, reason=reason))
        ]

    def invocation_id(self, call_id: str) -> str | None:
        call = self._calls.get(call_id)
        return call.invocation_id if call is not None else None

    def cancel_open_blocks(self) -> None:
        """The master cancelled the turn: every text and thinking block open now ends with
        ``is_cancelled: true`` (DPS-6.1.2-cancel), whatever the agent says when it closes it (Claude
        Code may close an interrupted block as if it were complete)."""
        for block in self._blocks.values():
            block.cancelled = True

    # --- helpers ----------------------------------------------------------------------------------

    def _frame(self, payload: F.Payload, metadata: dict[str, Any] | None = None) -> F.Frame:
        return self._factory.frame(payload, turn_id=self.turn_id, metadata=metadata)

    def _context(self, parent: str | None) -> F.SubagentContext | None:
        if parent is None:
            return None
        return self._contexts.get(parent)

    def _meta(self, parent: str | None) -> dict[str, Any] | None:
        context = self._context(parent) if parent is not None else None
        return {"subagent_context": context} if context is not None else None

    def _main_agent_state(self, parent: str | None, state: str, reason: str) -> list[F.Frame]:
        # Only the main agent moves the session's state (see the module docstring).
        if parent is not None or state == self.agent_state:
            return []
        return self.set_agent_state(state, reason)

    # --- content ----------------------------------------------------------------------------------

    def _open_block(self, key: str, kind: str, parent: str | None, role: str | None) -> _Block:
        block = self._blocks.get(key)
        if block is None:
            metadata = self._meta(parent)
            if role is not None:
                metadata = {**(metadata or {}), "content_role": role}
            block = _Block(self._next_index, kind, metadata)
            self._next_index += 1
            self._blocks[key] = block
        return block

    def _text_delta(self, event: ev.TextDelta) -> list[F.Frame]:
        text = event.text
        block = self._blocks.get(event.block)
        if (
            block is not None
            and len(text) <= self._text_chunk
            and (event.parent is not None or self.agent_state == "thinking")
        ):
            # Most deltas: an open block, one frame, no state change (what the rest would do).
            block.keep(text, self._full_text_limit)
            return [self._frame(F.TextDelta(content_index=block.index, text=text), block.metadata)]
        out = self._main_agent_state(event.parent, "thinking", "generating")
        block = self._open_block(event.block, "text", event.parent, event.role)
        chunks, omitted = self._chunks(event.text)
        for text in chunks:
            block.keep(text, self._full_text_limit)
            out.append(
                self._frame(F.TextDelta(content_index=block.index, text=text), block.metadata)
            )
        if omitted:
            out += self._truncated(out[-1], len(event.text), omitted, event.parent)
        return out

    def _thinking_delta(self, event: ev.ThinkingDelta) -> list[F.Frame]:
        out = self._main_agent_state(event.parent, "thinking", "thinking")
        block = self._open_block(event.block, "thinking", event.parent, None)
        chunks, omitted = self._chunks(event.text)
        for text in chunks:
            payload = F.ThinkingDelta(content_index=block.index, text=text, redacted=event.redacted)
            out.append(self._frame(payload, block.metadata))
        if omitted:
            out += self._truncated(out[-1], len(event.text), omitted, event.parent)
        return out

    def _chunks(self, text: str) -> tuple[list[str], int]:
        """One event's text as pieces that each fit a frame, and how many characters past
        ``_event_text_limit`` were cut."""
        size = self._text_chunk
        if len(text) <= size:
            return [text], 0
        omitted = max(0, len(text) - self._event_text_limit)
        end = len(text) - omitted
        return [text[i : min(i + size, end)] for i in range(0, end, size)], omitted

    def _truncated(
        self,
        last: F.Frame,
        length: int,
        omitted: int,
        parent: str | None,
        details: F.ErrorDetails | None = None,
    ) -> list[F.Frame]:
        """Mark the last frame of an event that was cut, and say so (see "Size" above)."""
        last.metadata = {**(last.metadata or {}), "text_truncated": True, "omitted_chars": omitted}
        payload = F.AgentError(
            error_code="OUTPUT_TRUNCATED",
            message=f"the agent wrote {length} characters at once; only the first "
            f"{length - omitted} were sent",
            severity="warning",
            recoverable=True,
            details=details,
        )
        return [self._frame(payload, self._meta(parent))]

    def _block_end(self, event: ev.TextEnd | ev.ThinkingEnd) -> list[F.Frame]:
        block = self._blocks.pop(event.block, None)
        out: list[F.Frame] = []
        if block is None:
            # A block that ends without deltas: its full text (if the agent gave one) is its delta.
            full = event.full_text if isinstance(event, ev.TextEnd) else None
            if not full:
                return []
            out += self._text_delta(ev.TextDelta(block=event.block, text=full, parent=event.parent))
            block = self._blocks.pop(event.block)
        out.append(self._done(block, event.cancelled or block.cancelled))
        return out

    def _done(self, block: _Block, cancelled: bool) -> F.Frame:
        is_cancelled = True if cancelled else None
        if block.kind != "text":
            payload = F.ThinkingDone(content_index=block.index, is_cancelled=is_cancelled)
            return self._frame(payload, block.metadata)
        metadata = block.metadata
        if block.text is None:
            return self._frame(
                F.TextDone(content_index=block.index, is_cancelled=is_cancelled),
                {**(metadata or {}), "full_text_omitted": True},
            )
        full: str | None = block.text.getvalue()
        if len(full) > self._text_chunk:  # type: ignore[arg-type]
            # full_text is optional (a check for the receiver): left out rather than making the
            # frame too large.
            probe = F.TextDone(content_index=block.index, full_text=full)
            if len(encode(self._frame(probe, metadata))) + _FRAME_MARGIN > self.max_frame_size:
                full = None
                metadata = {**(metadata or {}), "full_text_omitted": True}
        done = F.TextDone(content_index=block.index, full_text=full, is_cancelled=is_cancelled)
        return self._frame(done, metadata)

    # --- tools ------------------------------------------------------------------------------------

    def _tool_call(self, event: ev.ToolCall) -> list[F.Frame]:
        if event.call_id in self._calls:
            return []  # the same call announced again: it already has its request
        out = self._main_agent_state(event.parent, "tool_calling", "tool_call")
        spec = lookup(event.name)
        context = self._context(event.parent)
        metadata: dict[str, Any] = {"agent_call_id": event.call_id}
        if context is not None:
            metadata["subagent_context"] = context
        call = _Invocation(self._factory.new_id(), event.name, spec, context, metadata)
        call.background = event.background
        if event.group is None:
            group_id = self._factory.new_id()
        else:
            group_id = self._groups.get(event.group) or self._groups.setdefault(
                event.group, self._factory.new_id()
            )
        subagent = None
        if event.subagent_type is not None or spec.operation == "delegate":
            call.subagent_type = event.subagent_type
            subagent = F.SubagentInfo(agent_type=event.subagent_type, description=event.description)
            if len(self._contexts) >= _MAX_CONTEXTS:
                del self._contexts[next(iter(self._contexts))]  # the oldest subagent
            self._contexts[event.call_id] = F.SubagentContext(
                parent_invocation_id=call.invocation_id,
                depth=call.depth + 1,
                agent_type=event.subagent_type,
            )
        self._calls[event.call_id] = call
        self.tool_invocation_count += 1
        payload = F.InvokeRequest(
            invocation_id=call.invocation_id,
            tool_name=event.name,
            input=event.input,
            parallel_group_id=group_id,
            subagent=subagent,
        )
        out.append(self._fit_request(payload, metadata))
        if subagent is not None:
            started = F.SubagentStarted(
                parent_invocation_id=call.invocation_id,
                depth=call.depth + 1,
                agent_type=event.subagent_type,
                description=event.description,
            )
            out.append(self._frame(started, self._call_meta(call)))
        return out

    def _call_meta(self, call: _Invocation) -> dict[str, Any] | None:
        """Metadata of the frames about a call (stream, subagent life cycle, result)."""
        return call.metadata

    def _tool_output(self, event: ev.ToolOutput) -> list[F.Frame]:
        call = self._calls.get(event.call_id)
        if call is None:
            return []
        out: list[F.Frame] = []
        chunks, omitted = self._chunks(event.chunk)
        for chunk in chunks:
            payload = F.InvokeStream(
                invocation_id=call.invocation_id,
                tool_name=call.tool_name,
                stream_type=event.stream,
                chunk=chunk,
                sequence=call.sequence,
            )
            call.sequence += 1
            out.append(self._frame(payload, self._call_meta(call)))
        if omitted:
            details = F.ErrorDetails(
                related_tool=call.tool_name, related_invocation_id=call.invocation_id
            )
            out += self._truncated(out[-1], len(event.chunk), omitted, event.parent, details)
        return out

    def _tool_result(self, event: ev.ToolResult) -> list[F.Frame]:
        call = self._calls.get(event.call_id)
        if call is None:
            # Never requested, or already given its one result (e.g. cancelled at a turn's end).
            self.dropped_results += 1
            return []
        if call.subagent_type is not None and (event.background or call.background):
            call.background = True
            if call.ended is None:
                call.held = event  # released by the subagent's end (or end_turn)
                return self._after_result(call)
            return self._finish_subagent(event.call_id, call, event, call.ended)
        if call.subagent_type is not None:
            ended = call.ended or ev.SubagentEnded(
                call_id=event.call_id,
                status=subagent_status(event),
                duration_ms=event.duration_ms,
            )
            return self._finish_subagent(event.call_id, call, event, ended)
        del self._calls[event.call_id]
        out = self._transfers(call, event)
        return [*out, self._result_frame(call, event), *self._after_result(call)]

    def _transfers(self, call: _Invocation, event: ev.ToolResult) -> list[F.Frame]:
        """``agent.file.transfer`` (download) for each file the shell stored from the result, sent
        before the ``binary_ref`` result that points at them (docs/files.md)."""
        if not event.files or event.is_error or event.cancelled or call.blocked:
            return []
        out = []
        for file in event.files:
            payload = F.FileTransfer(
                transfer_id=file.transfer_id,
                direction="download",
                file_url=file.file_url,
                file_name=file.file_name,
                mime_type=file.mime_type,
                size_bytes=file.size_bytes,
                checksum=file.checksum,
                context=F.FileTransferContext(
                    workspace_relative_path=file.workspace_relative_path,
                    related_tool_invocation_id=call.invocation_id,
                ),
            )
            out.append(self._frame(payload, self._call_meta(call)))
        return out

    def _after_result(self, call: _Invocation) -> list[F.Frame]:
        if not call.main:
            return []
        waiting = any(c.main and c.held is None for c in self._calls.values())
        return self._main_agent_state(
            None, "tool_calling" if waiting else "thinking", "tool_result"
        )

    def _subagent_ended(self, event: ev.SubagentEnded) -> list[F.Frame]:
        call = self._calls.get(event.call_id)
        context = self._contexts.get(event.call_id)
        out: list[F.Frame] = []
        if event.usage is not None and context is not None:
            out.append(self._subagent_usage(event.usage, context))
        if call is None:
            return out  # its call was already closed (end_turn): only the usage is news
        if call.held is not None:
            held, call.held = call.held, None
            result = msgspec.structs.replace(
                held,
                output=released_output(held.output, event),
                is_error=event.status == "failed",
                cancelled=event.status == "cancelled",
                duration_ms=event.duration_ms
                if event.duration_ms is not None
                else held.duration_ms,
            )
            return out + self._finish_subagent(event.call_id, call, result, event)
        call.ended = event  # the call's result follows; ended goes right before it
        return out

    def _finish_subagent(
        self,
        call_id: str,
        call: _Invocation,
        result: ev.ToolResult,
        ended: ev.SubagentEnded,
        *,
        settle: bool = True,
    ) -> list[F.Frame]:
        """``agent.subagent.ended`` immediately followed by the call's result (DPS-10.3-order);
        ``settle``: then the state that follows (not while ``end_turn`` closes the turn)."""
        del self._calls[call_id]
        payload = F.SubagentEnded(
            parent_invocation_id=call.invocation_id,
            status=ended.status,
            duration_ms=ended.duration_ms,
        )
        out = [self._frame(payload, self._call_meta(call)), self._result_frame(call, result)]
        return out + self._after_result(call) if settle else out

    def _close_call(self, call_id: str, call: _Invocation, cancelled: bool) -> list[F.Frame]:
        """End of turn with the call still open (see ``end_turn``)."""
        if call.held is not None:
            # A background subagent outlives the turn: it is ended here for the master, its held
            # result released; its later frames keep their subagent_context.
            ended = ev.SubagentEnded(
                call_id=call_id, status="cancelled" if cancelled else "completed"
            )
            held = call.held
            if cancelled:
                held = msgspec.structs.replace(held, cancelled=True)
            del self._calls[call_id]
            meta = {**call.metadata, "background": True}
            frame = self._frame(
                F.SubagentEnded(parent_invocation_id=call.invocation_id, status=ended.status),
                meta,
            )
            return [frame, self._result_frame(call, held)]
        result = ev.ToolResult(
            call_id=call_id,
            is_error=False,
            cancelled=True,
            output="The turn ended before the tool finished.",
        )
        if call.subagent_type is not None:
            ended = ev.SubagentEnded(call_id=call_id, status="cancelled")
            return self._finish_subagent(call_id, call, result, ended, settle=False)
        del self._calls[call_id]
        return [self._result_frame(call, result)]

    def _result_frame(self, call: _Invocation, event: ev.ToolResult) -> F.Frame:
        if call.blocked:
            status: F.InvokeStatus = "error"
            output: Any = BLOCKED_OUTPUT
        else:
            status = "cancelled" if event.cancelled else "error" if event.is_error else "success"
            output = event.output
        spec = call.spec
        if status != "success" and isinstance(output, str) and call.subagent_type is None:
            # §5.3.3 types what a tool produces; a failed call's output is the error message.
            # (A subagent's result stays agent_result whatever happened: §10.3 pairs it with ended.)
            output_type: str = "text"
        elif status == "success" and event.files and call.subagent_type is None:
            # The bytes went to the file store; the result points at them (§4.5, binary_ref).
            output, output_type = binary_refs(event.files, output), "binary_ref"
        else:
            output_type = event.output_type or decide_output_type(
                declared=spec.output_type,
                category=spec.category,
                operation=spec.operation,
                changed=event.changed,
                listing=event.listing,
            )
        payload = F.InvokeResult(
            invocation_id=call.invocation_id,
            tool_name=call.tool_name,
            status=status,
            output=output,
            output_type=output_type,  # type: ignore[arg-type]
            duration_ms=event.duration_ms,
            truncated=True if event.truncated and not call.blocked else None,
        )
        return self._fit_result(payload, self._call_meta(call))

    # --- size limits --------------------------------------------------------------------------------

    def _fit_result(self, payload: F.InvokeResult, metadata: dict[str, Any] | None) -> F.Frame:
        frame = self._frame(payload, metadata)
        excess = len(encode(frame)) + _FRAME_MARGIN - self.max_frame_size
        if excess > 0:
            payload.output = cut_output(payload.output, excess)
            payload.truncated = True
        return frame

    def _fit_request(self, payload: F.InvokeRequest, metadata: dict[str, Any]) -> F.Frame:
        frame = self._frame(payload, metadata)
        excess = len(encode(frame)) + _FRAME_MARGIN - self.max_frame_size
        if excess > 0:
            payload.input = cut_input(payload.input, excess)
            # A copy: the call's later frames share ``metadata`` and were not cut.
            frame.metadata = {**metadata, "input_truncated": True}
        return frame

    # --- session-level events ---------------------------------------------------------------------

    def _session_started(self, event: ev.SessionStarted) -> list[F.Frame]:
        out: list[F.Frame] = []
        catalog = build_catalog(event.tools, event.mcp_servers)
        metadata = self._catalog_metadata()
        if (
            self.catalog is None
            or self.catalog.payload != catalog
            or self.catalog.metadata != metadata
        ):
            self.catalog = self._frame(catalog, metadata)
            out.append(self.catalog)
        return out + self._commands_listed(event)

    def _catalog_metadata(self) -> dict[str, Any] | None:
        return {"rawp_mcp_servers": self.mcp_servers} if self.mcp_servers else None

    def catalog_again(self) -> F.Frame | None:
        """The catalog with what is now known of the MCP servers, when that changed it."""
        metadata = self._catalog_metadata()
        if self.catalog is None or self.catalog.metadata == metadata:
            return None
        self.catalog = self._frame(self.catalog.payload, metadata)
        return self.catalog

    def _commands_listed(self, event: ev.SessionStarted | ev.CommandsListed) -> list[F.Frame]:
        commands = F.CommandsPublish(
            commands=[
                F.Command(name=c.name, description=c.description or f"/{c.name}")
                for c in event.commands
            ]
        )
        if self.commands is None or self.commands.payload != commands:
            self.commands = self._frame(commands)
            return [self.commands]
        return []

    def expect_tools(self, tools: tuple[str, ...]) -> None:
        """The tools the profile knows the agent has, before the agent reports them: the catalog
        a master gets right after ``session.capabilities``; the agent's own list replaces it (and
        is published) only where it differs."""
        self.catalog = self._frame(build_catalog(list(tools), []), self._catalog_metadata())

    def _notice(self, event: ev.Notice) -> list[F.Frame]:
        invocation_id = self.invocation_id(event.call_id) if event.call_id else None
        details = F.ErrorDetails(
            related_tool=event.tool_name,
            related_invocation_id=invocation_id,
            http_status=event.http_status,
            # A warning (a retry) is followed by the error that says it again, with the hint.
            hint=self.hint(event.code, event.message) if event.severity != "warning" else None,
        )
        payload = F.AgentError(
            error_code=event.code,
            message=event.message,
            severity=event.severity,
            recoverable=event.recoverable,
            details=details if details != F.ErrorDetails() else None,
        )
        return [self._frame(payload, self._meta(event.parent))]

    def hint(self, code: str, *texts: str | None) -> str | None:
        """``details.hint`` for an error: where the credentials go, when it is about them."""
        if self.credentials and about_credentials(code, *texts):
            return credentials_hint(self.credentials)
        return None

    def _compacted(self, event: ev.Compacted) -> list[F.Frame]:
        preserved = None
        if event.preserved:
            try:
                preserved = msgspec.convert(event.preserved, F.PreservedElements)
            except msgspec.ValidationError:
                preserved = None  # a parser's guess that does not fit §7.2.1 is left out
        payload = F.Compacted(
            summary=event.summary,
            previous_token_count=event.pre_tokens,
            current_token_count=event.post_tokens,
            trigger="requested" if self._compaction_requested else event.trigger,  # type: ignore[arg-type]
            preserved_elements=preserved,
        )
        return [self._frame(payload, self._meta(event.parent))]

    def _unknown(self, event: ev.Unknown) -> list[F.Frame]:
        if not self.forward_unknown or len(event.line) + 1024 > self.max_frame_size:
            return []
        payload = F.AgentRaw(agent=self.agent, kind=event.kind, line=msgspec.Raw(event.line))
        return [self._frame(payload, self._meta(event.parent))]

    # --- usage --------------------------------------------------------------------------------------

    def _usage_frame(self, ended: ev.TurnEnded | None) -> F.Frame:
        return self._frame(usage_payload(ended, self.turn_id))

    def _subagent_usage(self, usage: ev.UsageInfo, context: F.SubagentContext) -> F.Frame:
        """A subagent's own ``session.usage`` (DPS-10.5-usage); a total-only count goes in
        metadata."""
        metadata: dict[str, Any] = {"subagent_context": context}
        if usage.total_tokens is not None:
            metadata["total_tokens"] = usage.total_tokens
        return self._frame(subagent_usage_payload(usage, self.turn_id), metadata)
