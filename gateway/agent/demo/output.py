"""What the demo prints: the stream-json lines of the Claude Code CLI, in its shapes, field names
and order (`StreamJsonOutput`, which `DemoAgent` inherits), and `Turn`, what of the running turn
those lines report and an interrupt closes."""

from __future__ import annotations

import datetime
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from gateway.agent.demo import CONTEXT_WINDOW, DIALECT_VERSION, MAX_OUTPUT_TOKENS, SLASH_COMMANDS


def new_id() -> str:
    return str(uuid.uuid4())


def _now_iso() -> str:
    return (
        datetime.datetime.now(datetime.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def estimate_tokens(text: str) -> int:
    """A deterministic stand-in for a tokenizer: about four characters a token."""
    return len(text) // 4 + 1


def _words(text: str) -> list[str]:
    """Stream pieces: each word with its trailing space, so the pieces join to the text."""
    return re.findall(r"\S+\s*", text) or [text]


def block_stream(block: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A content block's `content_block_start` payload and its deltas, as the API streams them."""
    if block["type"] == "text":
        return {"type": "text", "text": ""}, [
            {"type": "text_delta", "text": piece} for piece in _words(block["text"])
        ]
    if block["type"] == "thinking":
        deltas = [{"type": "thinking_delta", "thinking": p} for p in _words(block["thinking"])]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
        return {"type": "thinking", "thinking": "", "signature": ""}, deltas
    # tool_use: the input as JSON text in pieces, starting with an empty one as the API does.
    raw = json.dumps(block["input"], ensure_ascii=False, separators=(",", ":"))
    pieces = ["", *(raw[i : i + 24] for i in range(0, len(raw), 24))]
    start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
    return start, [{"type": "input_json_delta", "partial_json": p} for p in pieces]


@dataclass
class Turn:
    """What an interrupt needs to know to close the turn the way the CLI does."""

    started: float
    messages: int = 0
    usage_in: int = 0
    usage_out: int = 0
    message_id: str | None = None  # an API message is open (between message_start and stop)
    block_index: int | None = None  # a content block is open
    block: dict[str, Any] | None = None  # the open block's content so far
    block_announced: bool = False  # its full assistant line was already printed
    pending: tuple[str, str, str, dict[str, Any]] | None = None  # request_id, tool id, name, input
    denials: list[dict[str, Any]] = field(default_factory=list)
    last_text: str = ""
    interrupt_request_id: str | None = None
    interrupted: bool = False


class StreamJsonOutput:
    """The lines, one flushed write each; `DemoAgent` holds the state they report."""

    _out: BinaryIO
    session_id: str
    workspace: str
    tools: tuple[str, ...]
    model: str
    mode: str
    partial: bool
    total_in: int
    total_out: int
    total_cost_usd: float

    def emit(self, obj: dict[str, Any]) -> None:
        self._out.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
        self._out.flush()

    def _system(self, subtype: str, **fields: Any) -> None:
        self.emit(
            {
                "type": "system",
                "subtype": subtype,
                **fields,
                "session_id": self.session_id,
                "uuid": new_id(),
            }
        )

    def _init_line(self) -> None:
        self.emit(
            {
                "type": "system",
                "subtype": "init",
                "cwd": self.workspace,
                "session_id": self.session_id,
                "tools": list(self.tools),
                "mcp_servers": [],
                "model": self.model,
                "permissionMode": self.mode,
                "slash_commands": SLASH_COMMANDS,
                "apiKeySource": "none",
                "claude_code_version": DIALECT_VERSION,
                "output_style": "default",
                "agents": [],
                "skills": [],
                "plugins": [],
                "uuid": new_id(),
            }
        )

    def _stream(self, event: dict[str, Any], message_id: str, **extra: Any) -> None:
        if self.partial:
            self.emit(
                {
                    "type": "stream_event",
                    "event": event,
                    "session_id": self.session_id,
                    "parent_tool_use_id": None,
                    "uuid": new_id(),
                    **extra,
                    "api_message_id": message_id,
                }
            )

    def _usage(self, input_tokens: int, output_tokens: int) -> dict[str, Any]:
        return {
            "input_tokens": input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output_tokens,
        }

    def _assistant(self, turn: Turn, block: dict[str, Any], **extra: Any) -> None:
        assert turn.message_id is not None
        self.emit(
            {
                "type": "assistant",
                "message": {
                    "id": turn.message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": [block],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": self._usage(turn.usage_in, 1),
                    "context_management": None,
                },
                "parent_tool_use_id": None,
                "session_id": self.session_id,
                "uuid": new_id(),
                "timestamp": _now_iso(),
                "request_id": f"req_demo_{turn.messages}",
                **extra,
            }
        )

    def _user(self, content: Any, **extra: Any) -> None:
        self.emit(
            {
                "type": "user",
                "message": {"role": "user", "content": content},
                "parent_tool_use_id": None,
                "session_id": self.session_id,
                "uuid": new_id(),
                "timestamp": _now_iso(),
                **extra,
            }
        )

    def _control_response(self, request_id: str, response: dict[str, Any]) -> None:
        self.emit(
            {
                "type": "control_response",
                "response": {"subtype": "success", "request_id": request_id, "response": response},
            }
        )

    def _result(
        self,
        turn: Turn,
        *,
        error: bool,
        stop_reason: str | None,
        terminal: str | None,
        **extra: Any,
    ) -> None:
        duration = int((time.monotonic() - turn.started) * 1000)
        line: dict[str, Any] = {
            "type": "result",
            "subtype": "error_during_execution" if error else "success",
            "is_error": error,
            "duration_ms": duration,
            "duration_api_ms": duration,
            "num_turns": turn.messages,
        }
        if error:
            line["errors"] = []
        else:
            line["result"] = turn.last_text
        line |= {
            "stop_reason": stop_reason,
            "session_id": self.session_id,
            "total_cost_usd": round(self.total_cost_usd, 6),
            "usage": self._usage(turn.usage_in, turn.usage_out)
            | {"server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0}},
            "modelUsage": {
                self.model: {
                    "inputTokens": self.total_in,
                    "outputTokens": self.total_out,
                    "cacheReadInputTokens": 0,
                    "cacheCreationInputTokens": 0,
                    "webSearchRequests": 0,
                    "costUSD": 0,
                    "contextWindow": CONTEXT_WINDOW,
                    "maxOutputTokens": MAX_OUTPUT_TOKENS,
                }
            },
            "permission_denials": turn.denials,
        }
        if terminal is not None:  # a local command's result (/compact) has none
            line["terminal_reason"] = terminal
        line |= extra
        line["uuid"] = new_id()
        self.emit(line)
