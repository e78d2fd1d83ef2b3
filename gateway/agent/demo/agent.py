"""`DemoAgent`, the stream-json loop: prompts from stdin become turns (queued while one runs), each
one or two streamed API messages around a tool call; control requests interrupt a turn or change
the mode; `control_response` lines answer the agent's permission questions."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import re
import sys
import time
import uuid
from typing import Any

from gateway.agent.demo import (
    ALL_TOOLS,
    COMPACT_SUMMARY,
    EDIT_TOOLS,
    HELP_TEXT,
    INTERRUPTED,
    INTERRUPTED_TOOL,
    NEEDS_PERMISSION,
    PERMISSION_MODES,
    REJECTED_BY_INTERRUPT,
    SLASH_COMMANDS,
    THOUGHT_TEXT,
)
from gateway.agent.demo.output import StreamJsonOutput, Turn, block_stream, estimate_tokens, new_id
from gateway.agent.demo.script import (
    Action,
    Prompt,
    acknowledge,
    choose_action,
    spent_usd,
    split_attachments,
)
from gateway.agent.demo.tools import ToolError, inside_workspace, run_glob, run_read, run_write


class DemoAgent(StreamJsonOutput):
    """The stream-json loop; see this module's and the package's docstrings."""

    def __init__(self, opts: argparse.Namespace, *, workspace: str, delay_sec: float) -> None:
        self.opts = opts
        self.workspace = workspace
        self.delay_sec = delay_sec
        self.session_id: str = opts.resume or opts.session_id or new_id()
        self.mode: str = "bypassPermissions" if opts.dangerously_skip_permissions else opts.mode
        self.model: str = opts.model
        self.partial: bool = opts.include_partial_messages
        self.prompt_tool: str | None = opts.permission_prompt_tool
        self.tools: tuple[str, ...] = _tool_list(opts.tools)
        self.context_tokens = 0
        self.total_in = 0
        self.total_out = 0
        self.total_cost_usd = 0.0  # what "spend N" prompts added: a model's cost, played
        self.prompts: asyncio.Queue[Prompt | None] = asyncio.Queue()
        self.turn: Turn | None = None
        self.turn_task: asyncio.Task[None] | None = None
        self.permission_waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.exit_after_turn = False
        self._out = sys.stdout.buffer

    # ------------------------------------------------------------------ one API message

    async def _pause(self) -> None:
        # Always yield, so that an interrupt read from stdin can land between two deltas.
        await asyncio.sleep(self.delay_sec)

    def _event(self, turn: Turn, kind: str, **fields: Any) -> None:
        assert turn.message_id is not None
        self._stream({"type": kind, **fields}, turn.message_id)

    async def _message(self, turn: Turn, blocks: list[dict[str, Any]], stop_reason: str) -> None:
        """Stream one assistant message the way the CLI relays the Messages API stream."""
        self._system("status", status="requesting")
        turn.messages += 1
        turn.message_id = f"msg_demo_{uuid.uuid4().hex[:24]}"
        turn.usage_in = self.context_tokens + 1
        out_tokens = 0
        message: dict[str, Any] = {
            "id": turn.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": self._usage(turn.usage_in, 1),
        }
        self._stream({"type": "message_start", "message": message}, turn.message_id, ttft_ms=1)
        for index, block in enumerate(blocks):
            start, deltas = block_stream(block)
            turn.block_index, turn.block, turn.block_announced = index, dict(start), False
            self._event(turn, "content_block_start", index=index, content_block=start)
            for delta in deltas:
                await self._pause()
                kind = delta["type"]
                if kind == "text_delta":
                    turn.block["text"] += delta["text"]
                elif kind == "thinking_delta":
                    turn.block["thinking"] += delta["thinking"]
                    self._system(
                        "thinking_tokens",
                        estimated_tokens=estimate_tokens(turn.block["thinking"]),
                        estimated_tokens_delta=estimate_tokens(delta["thinking"]),
                    )
                self._event(turn, "content_block_delta", index=index, delta=delta)
            turn.block = block
            if block["type"] == "text":
                turn.last_text = block["text"]
            out_tokens += estimate_tokens(json.dumps(block))
            # The CLI prints a block's full assistant line before its content_block_stop.
            self._assistant(turn, block)
            turn.block_announced = True
            self._event(turn, "content_block_stop", index=index)
            turn.block_index = turn.block = None
        self._event(
            turn,
            "message_delta",
            delta={"stop_reason": stop_reason, "stop_sequence": None},
            usage={"output_tokens": out_tokens},
        )
        self._event(turn, "message_stop")
        turn.usage_out += out_tokens
        self.total_in += turn.usage_in
        self.total_out += out_tokens
        self.context_tokens += out_tokens
        turn.message_id = None

    # ------------------------------------------------------------------ tools and permissions

    def _needs_permission(self, name: str) -> bool:
        if name not in NEEDS_PERMISSION or self.mode == "bypassPermissions":
            return False
        return not (self.mode == "acceptEdits" and name in EDIT_TOOLS)

    async def _ask_permission(
        self, turn: Turn, tool_id: str, name: str, tool_input: dict[str, Any]
    ) -> dict[str, Any]:
        """A `can_use_tool` control request; waits for the host's `control_response`."""
        request_id = new_id()
        request: dict[str, Any] = {
            "subtype": "can_use_tool",
            "tool_name": name,
            "display_name": name,
            "input": tool_input,
            "description": os.path.basename(str(tool_input.get("file_path", name))),
        }
        if self.mode == "plan":
            # The CLI asks (rather than refusing) in plan mode when a prompt tool is set, giving
            # the mode as the reason and no suggestions; the host is expected to deny.
            request["decision_reason_type"] = "mode"
        else:
            request["permission_suggestions"] = [
                {"type": "setMode", "mode": "acceptEdits", "destination": "session"}
            ]
        request["tool_use_id"] = tool_id
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.permission_waiters[request_id] = waiter
        turn.pending = (request_id, tool_id, name, tool_input)
        self.emit({"type": "control_request", "request_id": request_id, "request": request})
        try:
            answer = await waiter
        finally:
            self.permission_waiters.pop(request_id, None)
        # Cleared only on an answer: an interrupt needs to know what was pending.
        turn.pending = None
        return answer

    async def _use_tool(
        self, turn: Turn, tool_id: str, name: str, tool_input: dict[str, Any]
    ) -> tuple[bool, str | list[dict[str, Any]], Any]:
        """Ask if needed, run the tool, print the `user` tool_result line. (ok, content,
        `tool_use_result`); a refused or failed tool has no `tool_use_result` (None)."""
        try:
            if name in EDIT_TOOLS:
                inside_workspace(self.workspace, tool_input["file_path"])  # refuse before asking
            if self._needs_permission(name):
                if self.prompt_tool != "stdio":
                    # No one to ask: the CLI refuses and says so in a system line first.
                    self._refuse_without_asking(tool_id, name, tool_input)
                answer = await self._ask_permission(turn, tool_id, name, tool_input)
                if answer.get("behavior") != "allow":
                    raise _Denied(str(answer.get("message") or "Permission denied"))
                tool_input = answer.get("updatedInput") or tool_input
            text: str | list[dict[str, Any]]
            if name == "Glob":
                text, result = run_glob(self.workspace, tool_input.get("pattern", "**/*"))
            elif name == "Read":
                text, result = run_read(self.workspace, tool_input["file_path"])
            elif name == "Write":
                text, result = run_write(
                    self.workspace, tool_input["file_path"], tool_input["content"]
                )
            else:
                raise ToolError(f"No such tool available: {name}")
        except _Denied as exc:
            turn.denials.append(
                {"tool_name": name, "tool_use_id": tool_id, "tool_input": tool_input}
            )
            self._tool_error(tool_id, str(exc))
            return False, str(exc), None
        except ToolError as exc:
            self._tool_error(tool_id, str(exc))
            return False, str(exc), None
        self._user(
            [{"tool_use_id": tool_id, "type": "tool_result", "content": text}],
            tool_use_result=result,
        )
        self.context_tokens += estimate_tokens(text if isinstance(text, str) else json.dumps(text))
        return True, text, result

    def _refuse_without_asking(self, tool_id: str, name: str, tool_input: dict[str, Any]) -> None:
        target = tool_input.get("file_path") or tool_input.get("command") or name
        fields: dict[str, Any] = {"tool_name": name, "tool_use_id": tool_id}
        if self.mode == "plan":
            fields["decision_reason_type"] = "mode"
            message = f"Cannot write to {target} while in plan mode."
        else:
            message = f"Claude requested permissions to write to {target}, but you haven't granted it yet."
        self._system("permission_denied", **fields, message=message)
        raise _Denied(message)

    def _tool_error(self, tool_id: str, message: str, summary: str | None = None) -> None:
        self._user(
            [{"type": "tool_result", "content": message, "is_error": True, "tool_use_id": tool_id}],
            tool_use_result=f"Error: {message}" if summary is None else summary,
        )

    # ------------------------------------------------------------------ turns

    async def _turn(self, prompt: Prompt) -> None:
        turn = self.turn = Turn(started=time.monotonic())
        try:
            if prompt.text.strip().startswith("/compact"):
                self._compact(turn)
                return
            self._init_line()
            self.context_tokens += estimate_tokens(prompt.text)
            await self._answer(turn, prompt)
            self._result(turn, error=False, stop_reason="end_turn", terminal="completed")
        except asyncio.CancelledError:
            if not turn.interrupted:
                raise
            self._close_interrupted(turn)
        finally:
            self.turn = None

    async def _answer(self, turn: Turn, message: Prompt) -> None:
        prompt, attached = split_attachments(message.text)
        notes = acknowledge(self.workspace, attached, message.images)
        spend = spent_usd(prompt)
        if spend is not None:
            self.total_cost_usd += spend
            text = f"I spent ${spend:.2f}, as a model would; this session has cost ${self.total_cost_usd:.2f}."
            await self._message(turn, [{"type": "text", "text": text}], "end_turn")
            return
        action = choose_action(prompt, self.tools)
        blocks: list[dict[str, Any]] = []
        if action.think:
            gist = " ".join(prompt.split())[:80]
            blocks.append(
                {
                    "type": "thinking",
                    "thinking": f"The user wrote: {gist}. I will answer with what I can do.",
                    "signature": "demo-signature",
                }
            )
        if action.tool is None:
            answer = THOUGHT_TEXT if action.think else HELP_TEXT
            blocks.append({"type": "text", "text": " ".join(notes) if notes else answer})
            await self._message(turn, blocks, "end_turn")
            return
        tool_id = f"toolu_demo_{uuid.uuid4().hex[:24]}"
        tool_input: dict[str, Any]
        if action.tool == "Glob":
            intro, tool_input = "I'll list the files in the workspace.", {"pattern": "**/*"}
        elif action.tool == "Read":
            intro = f"I'll read {action.path}."
            tool_input = {"file_path": self._abs(action.path)}
        else:
            intro = f"I'll write {action.path}."
            tool_input = {"file_path": self._abs(action.path), "content": action.content}
        blocks.append({"type": "text", "text": " ".join([*notes, intro])})
        blocks.append({"type": "tool_use", "id": tool_id, "name": action.tool, "input": tool_input})
        await self._message(turn, blocks, "tool_use")
        ok, output, result = await self._use_tool(turn, tool_id, action.tool, tool_input)
        await self._message(
            turn, [{"type": "text", "text": self._summary(action, ok, output, result)}], "end_turn"
        )

    def _abs(self, path: str | None) -> str:
        # Claude Code passes absolute paths to its file tools.
        return os.path.normpath(os.path.join(self.workspace, os.path.expanduser(path or "")))

    @staticmethod
    def _summary(action: Action, ok: bool, output: str | list[dict[str, Any]], result: Any) -> str:
        if not ok:
            return f"That did not work: {output}"
        if action.tool == "Glob":
            names = [] if output == "No files found" else str(output).split("\n")
            if not names:
                return "The workspace has no files yet."
            shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
            return f"The workspace has {len(names)} file{'s' if len(names) != 1 else ''}: {shown}."
        if action.tool == "Read":
            if isinstance(output, list):
                # run_read_image measured the image already: no second decode of its base64
                file, size = result["file"], result["file"]["dimensions"]
                return f"{action.path} is a {size['originalWidth']}x{size['originalHeight']} {file['type']} image."
            lines = output.split("\n")
            if lines[-1].partition("\t")[2] == "":  # "2\t": the file's final newline, no line
                lines.pop()
            count = len(lines)
            return f"{action.path} has {count} line{'s' if count != 1 else ''}."
        return f"Done: I wrote {action.path}."

    def _compact(self, turn: Turn) -> None:
        """/compact as the CLI prints it (status, init, boundary, summary, stdout, result)."""
        started = time.monotonic()
        pre = self.context_tokens
        self._system("status", status="compacting")
        self._system("status", status=None, compact_result="success")
        self._init_line()
        self.context_tokens = estimate_tokens(COMPACT_SUMMARY)
        self._system(
            "compact_boundary",
            compact_metadata={
                "trigger": "manual",
                "pre_tokens": pre,
                "post_tokens": self.context_tokens,
                "duration_ms": int((time.monotonic() - started) * 1000),
            },
        )
        self._user(COMPACT_SUMMARY, isReplay=False, isSynthetic=True)
        self._user("<local-command-stdout>Compacted </local-command-stdout>", isReplay=True)
        turn.last_text = ""
        self._result(turn, error=False, stop_reason=None, terminal=None, local_command="compact")

    def _close_interrupted(self, turn: Turn) -> None:
        """Close an interrupted turn with the lines the CLI prints, in its order."""
        if turn.pending is not None:
            request_id, tool_id, name, tool_input = turn.pending
            self.emit({"type": "control_cancel_request", "request_id": request_id})
            self._ack_interrupt(turn)
            turn.denials.append(
                {"tool_name": name, "tool_use_id": tool_id, "tool_input": tool_input}
            )
            self._tool_error(tool_id, REJECTED_BY_INTERRUPT, "User rejected tool use")
            self._user([{"type": "text", "text": INTERRUPTED_TOOL}])
            turn.messages += 1
            self._result(turn, error=True, stop_reason="tool_use", terminal="aborted_tools")
            return
        self._ack_interrupt(turn)
        if turn.message_id is not None:
            if turn.block is not None and not turn.block_announced and _has_content(turn.block):
                self._assistant(turn, turn.block, aborted=True)
            self._user([{"type": "text", "text": INTERRUPTED}])
            if turn.block_index is not None:
                self._event(turn, "content_block_stop", index=turn.block_index)
            self._event(
                turn,
                "message_delta",
                context_management=None,
                delta={"stop_reason": None, "stop_sequence": None},
                usage={"output_tokens": 1},
            )
            self._event(turn, "message_stop")
        else:
            self._user([{"type": "text", "text": INTERRUPTED}])
        turn.messages += 1
        self._result(turn, error=True, stop_reason=None, terminal="aborted_streaming")

    def _ack_interrupt(self, turn: Turn) -> None:
        if turn.interrupt_request_id is not None:
            self._control_response(turn.interrupt_request_id, {"still_queued": []})

    def interrupt(self, request_id: str | None) -> None:
        """Stop the running turn; the ack is printed by the turn as it closes (CLI order)."""
        turn, task = self.turn, self.turn_task
        if turn is None or task is None or task.done() or turn.interrupted:
            if request_id is not None:
                self._control_response(request_id, {"still_queued": []})
            return
        turn.interrupted = True
        turn.interrupt_request_id = request_id
        task.cancel()

    # ------------------------------------------------------------------ stdin

    def handle_line(self, raw: bytes) -> None:
        """One stdin line: a user message, a control request, or a control response."""
        if not raw.strip():
            return
        try:
            msg = json.loads(raw)
        except ValueError:
            warn(f"ignoring a stdin line that is not JSON: {raw[:200]!r}")
            return
        kind = msg.get("type") if isinstance(msg, dict) else None
        if kind == "user":
            content = (msg.get("message") or {}).get("content", "")
            self.prompts.put_nowait(Prompt(_text_of(content), _images_of(content)))
        elif kind == "control_request":
            self._control_request(msg)
        elif kind == "control_response":
            response = msg.get("response") or {}
            # Whatever JSON value came: one that is no request id of ours finds no waiter.
            request_id: Any = response.get("request_id")
            waiter = self.permission_waiters.get(request_id)
            if waiter is None or waiter.done():
                return  # an answer to a request that was cancelled or never made
            if response.get("subtype") == "success":
                waiter.set_result(response.get("response") or {})
            else:
                waiter.set_result({"behavior": "deny", "message": str(response.get("error"))})
        else:
            warn(f"ignoring a stdin line of type {kind!r}")

    def _control_request(self, msg: dict[str, Any]) -> None:
        request_id = str(msg.get("request_id", ""))
        request = msg.get("request") or {}
        subtype = request.get("subtype")
        if subtype == "interrupt":
            self.interrupt(request_id)
        elif subtype == "set_permission_mode" and request.get("mode") in PERMISSION_MODES:
            self.mode = request["mode"]
            self._control_response(request_id, {"mode": self.mode})
            self._system("status", status=None, permissionMode=self.mode)
        elif subtype == "set_model" and isinstance(request.get("model"), str):
            self.model = request["model"]
            self._control_response(request_id, {})
        elif subtype == "initialize":
            # As the real CLI answers it: the slash commands (and more the gateway does not use).
            commands = [
                {"name": c, "description": f"/{c}", "argumentHint": ""} for c in SLASH_COMMANDS
            ]
            self._control_response(request_id, {"commands": commands, "pid": os.getpid()})
        else:
            self.emit(
                {
                    "type": "control_response",
                    "response": {
                        "subtype": "error",
                        "request_id": request_id,
                        "error": f"Unsupported control request: {subtype}",
                    },
                }
            )

    def stdin_closed(self) -> None:
        # Pending permission questions can never be answered now: deny them.
        for waiter in self.permission_waiters.values():
            if not waiter.done():
                waiter.set_result({"behavior": "deny", "message": "stdin closed"})
        self.prompts.put_nowait(None)

    async def read_stdin(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 30)
        try:
            await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", closefd=False)
            )
        except (ValueError, OSError):
            # stdin is a regular file or a terminal: read it in a thread instead.
            while line := await loop.run_in_executor(None, sys.stdin.buffer.readline):
                self.handle_line(line)
            self.stdin_closed()
            return
        while line := await reader.readline():
            self.handle_line(line)
        self.stdin_closed()

    async def run(self, prompt: str | None) -> int:
        """Serve turns until stdin closes (stream-json) or the one prompt is answered (text)."""
        if prompt is not None:
            self.prompts.put_nowait(Prompt(prompt))
            self.prompts.put_nowait(None)
        stdin_task = asyncio.create_task(self.read_stdin())
        while (next_prompt := await self.prompts.get()) is not None:
            self.turn_task = asyncio.create_task(self._turn(next_prompt))
            with contextlib.suppress(asyncio.CancelledError):
                await self.turn_task
            self.turn_task = None
            if self.exit_after_turn:
                break
        stdin_task.cancel()
        return 0


class _Denied(Exception):
    """The host (or the mode) refused a tool; the message goes to the model."""


def _has_content(block: dict[str, Any]) -> bool:
    return bool(block.get("text") or block.get("thinking") or block.get("input"))


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def _images_of(content: Any) -> tuple[tuple[str, bytes], ...]:
    """The base64 image blocks of a user message, decoded; broken ones are reported and skipped."""
    if not isinstance(content, list):
        return ()
    out = []
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "image":
            continue
        source = block.get("source")
        if not isinstance(source, dict):
            continue
        try:
            data = base64.b64decode(source.get("data", ""), validate=True)
        except (ValueError, TypeError):
            warn("ignoring an image block whose base64 is broken")
            continue
        out.append((str(source.get("media_type", "")), data))
    return tuple(out)


def _tool_list(spec: str | None) -> tuple[str, ...]:
    if not spec:
        return ALL_TOOLS
    wanted = {t.strip() for t in re.split(r"[,\s]+", spec) if t.strip()}
    return tuple(t for t in ALL_TOOLS if t in wanted)


def warn(text: str) -> None:
    print(f"demo-agent: {text}", file=sys.stderr, flush=True)
