"""`demo`: the embedded default agent, speaking Claude Code's stream-json with no model behind it.

    python -m gateway.demo_agent [-p] [--input-format stream-json] [--output-format stream-json]
        [--verbose] [--include-partial-messages] [--permission-prompt-tool stdio]
        [--permission-mode default|acceptEdits|plan|bypassPermissions]
        [--dangerously-skip-permissions] [--model NAME] [--tools T1,T2] [--resume ID | --session-id ID]
        [PROMPT]

Theory of operation
-------------------
The gateway's whole loop (spawn, parse, map to RAWP-DPS frames, permissions, interrupts,
compaction) must run on a machine with nothing else installed, so this module plays the part of the
Claude Code CLI 2.1.328 run as `claude -p --input-format stream-json --output-format stream-json
--verbose --include-partial-messages --permission-prompt-tool stdio`. It prints the same line shapes,
field names and ordering that the real CLI prints (checked against the recordings in
tests/fixtures/claude-code), so the Claude Code parser reads it unchanged. `claude_code_version`
in `system/init` names the dialect (2.1.328), not a real CLI; `model` is "demo".

stdin carries one JSON object per line: `user` messages start turns (queued while one runs);
`control_request` `interrupt` stops the running turn; `set_permission_mode` changes the mode;
`control_response` answers our `can_use_tool` requests. When stdin closes, queued turns finish and
the process exits 0. SIGTERM exits 143 at once without a `result` (like the CLI); SIGINT interrupts
the running turn and exits 0.

The "model" is a few deterministic rules on the prompt text (see `choose_action`):
"/compact" -> the compaction sequence; "write|create <file>" -> Write (asks permission, writes
inside the workspace only); "read <file>" -> Read; "list" or "files" -> Glob over the workspace;
"think" -> a thinking block first (alone: an answer about thinking); anything else -> a short
text reply. Text is streamed word by word with `RAWP_DEMO_DELAY_MS` (default 20) between deltas,
so streaming is visible in a UI and interrupts have something to interrupt. No network, no
randomness beyond ids.

Images both ways, as the CLI does them: a Read of a .png/.jpg/.jpeg/.gif/.webp file answers with an
image block (base64) in the tool_result and `tool_use_result` `{"type": "image", "file": {...}}`
(at most `MAX_IMAGE_BYTES`, like the API's own limit; the demo never resizes). A user message's
image blocks and the "Attached files:" list the gateway appends to a prompt are acknowledged first
("I see the image dot.png (4x3).", "I see the file .rawp/uploads/app.log (12 bytes)."), so a master
can tell what reached the agent; the list is not read as part of the request.

Stdout is written with blocking writes, one flushed line at a time: the consumer is the gateway's
reader, and a demo agent that blocks while the gateway applies backpressure is what we want.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import difflib
import json
import os
import re
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Final

DIALECT_VERSION: Final = "2.1.328"  # the Claude Code CLI whose output this mirrors
DEFAULT_MODEL: Final = "demo"
CONTEXT_WINDOW: Final = 200_000
MAX_OUTPUT_TOKENS: Final = 32_000
DEFAULT_DELAY_MS: Final = 20
GLOB_LIMIT: Final = 100  # the real Glob tool truncates at 100 files too
ALL_TOOLS: Final = ("Glob", "Read", "Write")
# Tools that ask for permission (Write edits files; the real CLI asks for Bash too, not offered here).
NEEDS_PERMISSION: Final = frozenset({"Write", "Bash"})
EDIT_TOOLS: Final = frozenset({"Write", "Edit"})
PERMISSION_MODES: Final = ("default", "acceptEdits", "plan", "bypassPermissions", "dontAsk")
# Only the commands it answers as what they are: a listed /cost that answered with the greeting
# would tell the user something untrue.
SLASH_COMMANDS: Final = ["compact"]
INTERRUPTED: Final = "[Request interrupted by user]"
INTERRUPTED_TOOL: Final = "[Request interrupted by user for tool use]"
REJECTED_BY_INTERRUPT: Final = (
    "The user doesn't want to proceed with this tool use. The tool use was rejected (eg. if it was"
    " a file edit, the new_string was NOT written to the file). STOP what you are doing and wait"
    " for the user to tell you how to proceed."
)
COMPACT_SUMMARY: Final = (
    "This session is being continued from a previous conversation that ran out of context. The"
    " summary below covers the earlier portion of the conversation.\n\nSummary:\n1. Primary Request"
    " and Intent: the user talked to the RAWP demo agent.\n2. Current Work: nothing pending.\n\n"
    "Continue the conversation from where it left off without asking the user any further"
    " questions."
)
HELP_TEXT: Final = (
    "Hello! I am the RAWP demo agent, running without a model. Ask me to list the files, read a"
    " file or an image, look at files you attach, write a file (for example: write hello.txt),"
    " think first, or /compact."
)
THOUGHT_TEXT: Final = (
    "I thought it over first: the thinking above streamed as its own block, the way a model's"
    " reasoning does. Without a model that is as deep as it goes; try it with a task, for"
    " example: think, then list the files."
)
DEFAULT_FILE_CONTENT: Final = "Hello from the RAWP demo agent.\n"
# A Read of a file with one of these extensions answers with an image block, as the CLI's does.
IMAGE_EXTENSIONS: Final = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp"})
MAX_IMAGE_BYTES: Final = 5 * 1024 * 1024  # the Messages API's limit for one image
# What the gateway appends to a prompt that has context_files (gateway/protocol/prompts.py).
ATTACHED_HEADER: Final = "\n\nAttached files:\n"
_ATTACHED_IMAGE = re.compile(r"^- (.+) \((\S+), attached as an image\)$")
_ATTACHED_FILE = re.compile(r"^- (\S.*) \((\S+), (\d+) bytes\)$")


def _new_id() -> str:
    return str(uuid.uuid4())


def _now_iso() -> str:
    return (
        datetime.datetime.now(datetime.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _tokens(text: str) -> int:
    """A deterministic stand-in for a tokenizer: about four characters a token."""
    return len(text) // 4 + 1


def _words(text: str) -> list[str]:
    """Stream pieces: each word with its trailing space, so the pieces join to the text."""
    return re.findall(r"\S+\s*", text) or [text]


def _block_stream(block: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
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


# --------------------------------------------------------------------------- the "model"


@dataclass(frozen=True, slots=True)
class Action:
    """What the demo model does with a prompt: an optional tool call and whether it thinks first."""

    think: bool
    tool: str | None  # "Glob", "Read", "Write" or None
    path: str | None = None  # for Read/Write, as written in the prompt
    content: str | None = None  # for Write


_FILE_TOKEN = re.compile(r"""["'`]?([~\w./-]*[\w-]\.\w+|[~.]?/[\w./-]+)["'`]?""")
_QUOTED = re.compile(r"""["“]([^"”]+)["”]""")


def _file_after(prompt: str, verbs: str) -> str | None:
    """The first path-looking token after one of `verbs` (e.g. "write hello.txt" -> "hello.txt")."""
    m = re.search(rf"\b(?:{verbs})\b(.*)", prompt, re.IGNORECASE | re.DOTALL)
    if not m:
        return None
    for tok in _FILE_TOKEN.finditer(m.group(1)):
        path = tok.group(1).rstrip(".")
        if path and path not in (".", ".."):
            return path
    return None


@dataclass(frozen=True, slots=True)
class Prompt:
    """One user message: its text and the bytes of its image blocks (media type, data)."""

    text: str
    images: tuple[tuple[str, bytes], ...] = ()


def split_attachments(text: str) -> tuple[str, list[str]]:
    """The request without the gateway's "Attached files:" list, and that list's lines."""
    at = text.rfind(ATTACHED_HEADER)
    if at < 0:
        return text, []
    lines = text[at + len(ATTACHED_HEADER) :].split("\n")
    if not all(line.startswith("- ") for line in lines):
        return text, []
    return text[:at], lines


def acknowledge(
    workspace: str, attached: list[str], images: tuple[tuple[str, bytes], ...]
) -> list[str]:
    """What the demo says it got: each image block (named from the list, in order) with its size,
    and each file the gateway put into the workspace."""
    names = [m.group(1) for line in attached if (m := _ATTACHED_IMAGE.match(line))]
    notes = []
    for i, (_, data) in enumerate(images):
        name = names[i] if i < len(names) else f"number {i + 1}"
        info = image_info(data)
        if info is None:
            notes.append(f"I got an image {name} that I cannot read.")
        else:
            notes.append(f"I see the image {name} ({info[1]}x{info[2]}).")
    for line in attached:
        m = _ATTACHED_FILE.match(line)
        if m is None:
            continue
        path = m.group(1)
        try:
            size = os.path.getsize(_inside(workspace, path))
        except (ToolError, OSError):
            notes.append(f"I cannot find the attached file {path}.")
        else:
            notes.append(f"I see the file {path} ({size} bytes).")
    return notes


def choose_action(prompt: str, tools: tuple[str, ...] = ALL_TOOLS) -> Action:
    """Deterministic rules standing in for a model. Pure."""
    low = prompt.lower()
    think = "think" in low
    if "Write" in tools and re.search(r"\b(write|create)\b", low):
        path = _file_after(prompt, "write|create") or "hello.txt"
        quoted = _QUOTED.search(prompt)
        content = quoted.group(1) + "\n" if quoted else DEFAULT_FILE_CONTENT
        return Action(think, "Write", path, content)
    if "Read" in tools and re.search(r"\bread\b", low):
        target = _file_after(prompt, "read")
        if target:
            return Action(think, "Read", target)
    if "Glob" in tools and ("list" in low or "files" in low):
        return Action(think, "Glob")
    return Action(think, None)


# --------------------------------------------------------------------------- tools


class ToolError(Exception):
    """A tool failed; the message goes to the model as an error tool_result."""


def _inside(workspace: str, path: str) -> str:
    """The absolute path of `path` if it is inside `workspace` (symlinks resolved), else ToolError."""
    full = os.path.realpath(os.path.join(workspace, os.path.expanduser(path)))
    root = os.path.realpath(workspace)
    if full != root and not full.startswith(root + os.sep):
        raise ToolError(
            f"Path is outside the workspace: {path}. The demo agent only touches files under {root}."
        )
    return full


def run_glob(workspace: str, pattern: str) -> tuple[str, dict[str, Any]]:
    """List the workspace's files (relative, sorted; hidden and cache directories skipped)."""
    t0 = time.monotonic()
    names: list[str] = []
    total = 0
    skip = {"node_modules", "__pycache__"}
    for root, dirs, files in os.walk(workspace):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in skip)
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(root, f), workspace)
            if pattern not in ("**/*", "*", "**") and not _glob_match(rel, pattern):
                continue
            total += 1
            if len(names) < GLOB_LIMIT:
                names.append(rel)
    result = {
        "filenames": names,
        "durationMs": int((time.monotonic() - t0) * 1000),
        "numFiles": len(names),
        "truncated": total > len(names),
        "totalMatches": total,
        "countIsComplete": True,
    }
    return ("\n".join(names) if names else "No files found"), result


def _glob_match(rel: str, pattern: str) -> bool:
    # "**/" also matches the top level, as in the real tool.
    return PurePosixPath(rel).match(pattern) or PurePosixPath(rel).match(
        pattern.removeprefix("**/")
    )


def run_read(workspace: str, file_path: str) -> tuple[str | list[dict[str, Any]], dict[str, Any]]:
    full = _inside(workspace, file_path)
    if os.path.splitext(full)[1].lower() in IMAGE_EXTENSIONS and os.path.isfile(full):
        return run_read_image(file_path, full)
    try:
        with open(full, encoding="utf-8", errors="replace") as f:
            content = f.read()
    except FileNotFoundError:
        raise ToolError(
            f"File does not exist. Note: your current working directory is {workspace}."
        ) from None
    except IsADirectoryError:
        raise ToolError(f"EISDIR: illegal operation on a directory, read '{full}'") from None
    # As the CLI does: "a\n" is numbered "1\ta\n2\t" and counted as 2 (numLines).
    lines = content.split("\n")
    numbered = "\n".join(f"{i}\t{line}" for i, line in enumerate(lines, 1))
    file_info = {
        "filePath": full,
        "content": content,
        "numLines": len(lines),
        "startLine": 1,
        "totalLines": len(lines),
    }
    return numbered, {"type": "text", "file": file_info}


def image_info(data: bytes) -> tuple[str, int, int] | None:
    """(MIME type, width, height) of a PNG, JPEG, GIF or WebP, read from its header; else None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR" and len(data) >= 24:
        return "image/png", int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data.startswith((b"GIF87a", b"GIF89a")) and len(data) >= 10:
        return (
            "image/gif",
            int.from_bytes(data[6:8], "little"),
            int.from_bytes(data[8:10], "little"),
        )
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_info(data)
    if data.startswith(b"\xff\xd8"):
        return _jpeg_info(data)
    return None


def _webp_info(data: bytes) -> tuple[str, int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30:
        w = int.from_bytes(data[26:28], "little") & 0x3FFF
        h = int.from_bytes(data[28:30], "little") & 0x3FFF
        return "image/webp", w, h
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return "image/webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        w = int.from_bytes(data[24:27], "little") + 1
        return "image/webp", w, int.from_bytes(data[27:30], "little") + 1
    return None


def _jpeg_info(data: bytes) -> tuple[str, int, int] | None:
    # Walk the segments to the first start-of-frame marker (SOF0..SOF15 but DHT, JPG, DAC).
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h = int.from_bytes(data[i + 5 : i + 7], "big")
            return "image/jpeg", int.from_bytes(data[i + 7 : i + 9], "big"), h
        i += 2 + length
    return None


def run_read_image(file_path: str, full: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A Read of an image, as the CLI answers it: an image block for the model and the file's
    base64, type, size and dimensions in `tool_use_result`."""
    try:
        size = os.path.getsize(full)
        if size > MAX_IMAGE_BYTES:
            raise ToolError(
                f"Image {file_path} is {size} bytes; the demo agent reads images of at most"
                f" {MAX_IMAGE_BYTES} bytes."
            )
        with open(full, "rb") as f:
            data = f.read(MAX_IMAGE_BYTES + 1)
    except OSError as exc:
        raise ToolError(str(exc)) from None
    info = image_info(data)
    if info is None:
        raise ToolError(f"{file_path} is not a PNG, JPEG, GIF or WebP image.")
    mime, width, height = info
    b64 = base64.b64encode(data).decode("ascii")
    content = [{"type": "image", "source": {"type": "base64", "data": b64, "media_type": mime}}]
    dimensions = {
        "originalWidth": width,
        "originalHeight": height,
        "displayWidth": width,
        "displayHeight": height,
    }
    file_info = {"base64": b64, "type": mime, "originalSize": len(data), "dimensions": dimensions}
    return content, {"type": "image", "file": file_info}


def _structured_patch(old: str, new: str) -> list[dict[str, Any]]:
    """Hunks in the shape of the CLI's `structuredPatch` (what Edit/Write report)."""
    a, b = old.splitlines(), new.splitlines()
    hunks = []
    for group in difflib.SequenceMatcher(None, a, b).get_grouped_opcodes(3):
        lines: list[str] = []
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines += [" " + x for x in a[i1:i2]]
            else:
                lines += ["-" + x for x in a[i1:i2]] + ["+" + x for x in b[j1:j2]]
        first, last = group[0], group[-1]
        hunks.append(
            {
                "oldStart": first[1] + 1,
                "oldLines": last[2] - first[1],
                "newStart": first[3] + 1,
                "newLines": last[4] - first[3],
                "lines": lines,
            }
        )
    return hunks


def run_write(workspace: str, file_path: str, content: str) -> tuple[str, dict[str, Any]]:
    full = _inside(workspace, file_path)
    try:
        with open(full, encoding="utf-8") as f:
            original: str | None = f.read()
    except FileNotFoundError:
        original = None
    except OSError as exc:
        raise ToolError(str(exc)) from None
    try:
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(content)
    except OSError as exc:
        raise ToolError(str(exc)) from None
    if original is None:
        text = f"File created successfully at: {full}"
        result: dict[str, Any] = {
            "type": "create",
            "filePath": full,
            "content": content,
            "structuredPatch": [],
            "originalFile": None,
        }
    else:
        text = f"The file {full} has been updated successfully."
        result = {
            "type": "update",
            "filePath": full,
            "content": content,
            "structuredPatch": _structured_patch(original, content),
            "originalFile": original,
        }
    return text, result


# --------------------------------------------------------------------------- the agent


@dataclass
class _Turn:
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


class DemoAgent:
    """The stream-json loop; see the module docstring."""

    def __init__(self, opts: argparse.Namespace, *, workspace: str, delay_s: float) -> None:
        self.opts = opts
        self.workspace = workspace
        self.delay_s = delay_s
        self.session_id: str = opts.resume or opts.session_id or _new_id()
        self.mode: str = "bypassPermissions" if opts.dangerously_skip_permissions else opts.mode
        self.model: str = opts.model
        self.partial: bool = opts.include_partial_messages
        self.prompt_tool: str | None = opts.permission_prompt_tool
        self.tools: tuple[str, ...] = _tool_list(opts.tools)
        self.context_tokens = 0
        self.total_in = 0
        self.total_out = 0
        self.prompts: asyncio.Queue[Prompt | None] = asyncio.Queue()
        self.turn: _Turn | None = None
        self.turn_task: asyncio.Task[None] | None = None
        self.permission_waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.exit_after_turn = False
        self._out = sys.stdout.buffer

    # ------------------------------------------------------------------ output

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
                "uuid": _new_id(),
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
                "uuid": _new_id(),
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
                    "uuid": _new_id(),
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

    def _assistant(self, turn: _Turn, block: dict[str, Any], **extra: Any) -> None:
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
                "uuid": _new_id(),
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
                "uuid": _new_id(),
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
        turn: _Turn,
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
            "total_cost_usd": 0,
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
        line["uuid"] = _new_id()
        self.emit(line)

    # ------------------------------------------------------------------ one API message

    async def _pause(self) -> None:
        # Always yield, so that an interrupt read from stdin can land between two deltas.
        await asyncio.sleep(self.delay_s)

    def _event(self, turn: _Turn, kind: str, **fields: Any) -> None:
        assert turn.message_id is not None
        self._stream({"type": kind, **fields}, turn.message_id)

    async def _message(self, turn: _Turn, blocks: list[dict[str, Any]], stop_reason: str) -> None:
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
            start, deltas = _block_stream(block)
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
                        estimated_tokens=_tokens(turn.block["thinking"]),
                        estimated_tokens_delta=_tokens(delta["thinking"]),
                    )
                self._event(turn, "content_block_delta", index=index, delta=delta)
            turn.block = block
            if block["type"] == "text":
                turn.last_text = block["text"]
            out_tokens += _tokens(json.dumps(block))
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
        self, turn: _Turn, tool_id: str, name: str, tool_input: dict[str, Any]
    ) -> dict[str, Any]:
        """A `can_use_tool` control request; waits for the host's `control_response`."""
        request_id = _new_id()
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
        self, turn: _Turn, tool_id: str, name: str, tool_input: dict[str, Any]
    ) -> tuple[bool, str | list[dict[str, Any]], Any]:
        """Ask if needed, run the tool, print the `user` tool_result line. (ok, content,
        `tool_use_result`); a refused or failed tool has no `tool_use_result` (None)."""
        try:
            if name in EDIT_TOOLS:
                _inside(self.workspace, tool_input["file_path"])  # refuse before asking
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
        self.context_tokens += _tokens(text if isinstance(text, str) else json.dumps(text))
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
        turn = self.turn = _Turn(started=time.monotonic())
        try:
            if prompt.text.strip().startswith("/compact"):
                self._compact(turn)
                return
            self._init_line()
            self.context_tokens += _tokens(prompt.text)
            await self._answer(turn, prompt)
            self._result(turn, error=False, stop_reason="end_turn", terminal="completed")
        except asyncio.CancelledError:
            if not turn.interrupted:
                raise
            self._close_interrupted(turn)
        finally:
            self.turn = None

    async def _answer(self, turn: _Turn, message: Prompt) -> None:
        prompt, attached = split_attachments(message.text)
        notes = acknowledge(self.workspace, attached, message.images)
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

    def _compact(self, turn: _Turn) -> None:
        """/compact as the CLI prints it (status, init, boundary, summary, stdout, result)."""
        started = time.monotonic()
        pre = self.context_tokens
        self._system("status", status="compacting")
        self._system("status", status=None, compact_result="success")
        self._init_line()
        self.context_tokens = _tokens(COMPACT_SUMMARY)
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

    def _close_interrupted(self, turn: _Turn) -> None:
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

    def _ack_interrupt(self, turn: _Turn) -> None:
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
            _warn(f"ignoring a stdin line that is not JSON: {raw[:200]!r}")
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
            _warn(f"ignoring a stdin line of type {kind!r}")

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
            _warn("ignoring an image block whose base64 is broken")
            continue
        out.append((str(source.get("media_type", "")), data))
    return tuple(out)


def _tool_list(spec: str | None) -> tuple[str, ...]:
    if not spec:
        return ALL_TOOLS
    wanted = {t.strip() for t in re.split(r"[,\s]+", spec) if t.strip()}
    return tuple(t for t in ALL_TOOLS if t in wanted)


def _warn(text: str) -> None:
    print(f"demo-agent: {text}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The claude flags that matter; unknown flags are reported on stderr and ignored."""
    ap = argparse.ArgumentParser(prog="python -m gateway.demo_agent", description=__doc__)
    ap.add_argument("prompt", nargs="?", help="text input: answer this one prompt and exit")
    ap.add_argument("-p", "--print", action="store_true", help="accepted; always non-interactive")
    ap.add_argument("--input-format", choices=("text", "stream-json"), default=None)
    ap.add_argument("--output-format", choices=("stream-json",), default="stream-json")
    ap.add_argument("--verbose", action="store_true", help="accepted; output is always verbose")
    ap.add_argument("--include-partial-messages", action="store_true")
    ap.add_argument("--permission-prompt-tool", choices=("stdio",), default=None)
    ap.add_argument("--permission-mode", dest="mode", choices=PERMISSION_MODES, default="default")
    ap.add_argument("--dangerously-skip-permissions", action="store_true")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--tools", "--allowedTools", dest="tools", default=None)
    ap.add_argument("--resume", "-r", default=None, metavar="SESSION_ID")
    ap.add_argument("--session-id", default=None)
    return ap.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts, unknown = parse_args(argv)
    if unknown:
        _warn(f"ignoring unsupported arguments: {' '.join(unknown)}")
    prompt: str | None = None
    if opts.input_format == "text" or (opts.input_format is None and opts.prompt is not None):
        prompt = opts.prompt if opts.prompt is not None else sys.stdin.read()
    try:
        delay_ms = float(os.environ.get("RAWP_DEMO_DELAY_MS", DEFAULT_DELAY_MS))
    except ValueError:
        delay_ms = DEFAULT_DELAY_MS
    agent = DemoAgent(opts, workspace=os.getcwd(), delay_s=max(0.0, delay_ms) / 1000)

    async def amain() -> int:
        loop = asyncio.get_running_loop()
        # Like the CLI: SIGTERM ends at once with 143 and no result; SIGINT interrupts and exits 0.
        loop.add_signal_handler(signal.SIGTERM, _exit_now, 143)

        def on_sigint() -> None:
            agent.exit_after_turn = True
            agent.interrupt(None)
            if agent.turn is None:
                agent.prompts.put_nowait(None)

        loop.add_signal_handler(signal.SIGINT, on_sigint)
        return await agent.run(prompt)

    try:
        return asyncio.run(amain())
    except BrokenPipeError:
        # The reader went away; nobody is left to tell.
        _exit_now(0)
        return 0


def _exit_now(code: int) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(code)
