"""What the parts of a Claude Code line become: pure functions from the CLI's free-form JSON to
event fields, for ``stdout.py``.

A tool's ``tool_use_result`` shaped into the output its ``output_type`` promises (Edit/Write
``structuredPatch`` → unified diff, Read → file text, Glob → paths, ...), base64 blocks, a
subagent's report, usage and stop reasons, the text of content blocks, compaction summaries and
their §7.2.1 ``preserved_elements``, the descriptions of the built-in slash commands.
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal

import msgspec

from .. import events as ev
from .. import numbers
from ..base import elapsed_ms
from ..file_changes import new_file_diff, unified_diff
from .wire import ApiUsage, ResultLine, SystemLine, UserBlock

_STOP_REASONS: Final = {
    "end_turn": "end_turn",
    "max_tokens": "max_tokens",
    "model_context_window_exceeded": "max_tokens",
    "stop_sequence": "end_turn",
    "tool_use": "tool_use",
    "pause_turn": "end_turn",
    "refusal": "end_turn",
}


def nonempty_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def count(value: Any) -> int | None:
    """A count or a duration from free-form JSON: a whole number, not negative (JSON ``true`` is
    an int to Python, and would make a frame field of type integer invalid)."""
    return value if type(value) is int and value >= 0 else None


def _mcp_name(name: str) -> str:
    # Claude Code names MCP tools mcp__<server>__<tool> with the server name's other characters
    # replaced by underscores.
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def text_of(content: Any) -> str:
    """Text of a message or tool_result content: a string, or a list of blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, UserBlock):
                parts.append(block.text or "")
            elif isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
        return "".join(parts)
    return ""


# What a slash command run by the CLI itself (/compact, /cost, /context, ...) printed.
LOCAL_OUTPUT: Final = re.compile(
    r"<local-command-(?:stdout|stderr)>(.*?)</local-command-(?:stdout|stderr)>", re.S
)

_ERROR_TAGS: Final = re.compile(r"^<tool_use_error>(.*)</tool_use_error>$", re.S)


def strip_error_tags(text: str) -> str:
    m = _ERROR_TAGS.match(text)
    return m.group(1) if m else text


def interrupted_meta(meta: list[dict[str, Any]] | None, call_id: str) -> bool:
    """An interrupted call: "user-rejected" with no permission decision behind it (a refused
    permission says ``permission_decision: reject``)."""
    for entry in meta or ():
        if entry.get("id") == call_id:
            return entry.get("non_execution_kind") == "user-rejected" and not entry.get(
                "permission_decision"
            )
    return False


def context_of(usage: ApiUsage) -> int:
    return (
        (numbers.count(usage.input_tokens) or 0)
        + (numbers.count(usage.cache_read_input_tokens) or 0)
        + (numbers.count(usage.cache_creation_input_tokens) or 0)
        + (numbers.count(usage.output_tokens) or 0)
    )


_USAGE_COUNTS: Final = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


def usage_of(usage: Any, odd: numbers.OddFields | None = None) -> ev.UsageInfo | None:
    """The counts of an API usage object; an odd one is dropped (0 or None), its name in ``odd``."""
    if isinstance(usage, dict):
        # Free-form JSON (a subagent's tool_use_result): one that is not numbers is no usage.
        if any(usage.get(k) is not None and count(usage[k]) is None for k in _USAGE_COUNTS):
            return None
        try:
            usage = msgspec.convert(usage, ApiUsage)
        except msgspec.ValidationError:
            return None
    if not isinstance(usage, ApiUsage):
        return None
    o = odd if odd is not None else numbers.OddFields()
    details = usage.output_tokens_details or {}
    return ev.UsageInfo(
        input_tokens=o.count(usage.input_tokens, "usage.input_tokens") or 0,
        output_tokens=o.count(usage.output_tokens, "usage.output_tokens") or 0,
        cache_read_tokens=o.count(usage.cache_read_input_tokens, "usage.cache_read_input_tokens"),
        cache_write_tokens=o.count(
            usage.cache_creation_input_tokens, "usage.cache_creation_input_tokens"
        ),
        thinking_tokens=o.count(
            details.get("thinking_tokens"), "usage.output_tokens_details.thinking_tokens"
        ),
    )


def stop_reason_of(msg: ResultLine) -> str:
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


def foreground_subagent_end(
    call_id: str, result: ev.ToolResult, rich: Any, parent: str | None
) -> ev.SubagentEnded:
    """A foreground subagent's end, told from its ``Agent`` result (status, usage, duration)."""
    status: Literal["completed", "failed", "cancelled"] = (
        "cancelled" if result.cancelled else "failed" if result.is_error else "completed"
    )
    usage = None
    if isinstance(rich, dict):
        if rich.get("status") not in (None, "completed") and status == "completed":
            status = "failed"
        usage = usage_of(rich.get("usage"))
        if usage is not None and count(rich.get("totalTokens")) is not None:
            usage.total_tokens = rich["totalTokens"]
    return ev.SubagentEnded(
        call_id=call_id,
        status=status,
        duration_ms=result.duration_ms,
        usage=usage,
        parent=parent,
    )


def mcp_servers_of(msg: SystemLine) -> list[ev.McpServer]:
    """The MCP servers an ``init`` line names, each with its tools (``mcp__<server>__<tool>``)."""
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
    return servers


def context_window_of(msg: ResultLine) -> int | None:
    """The largest context window of the models a result line's turn used."""
    capacity = None
    for model in (msg.modelUsage or {}).values():
        window = count(model.get("contextWindow"))
        if window is not None:
            capacity = max(capacity or 0, window)
    return capacity


def duration(rich: Any, started: str | None, ended: str | None) -> int | None:
    """The tool's own duration when it reports one, else the time between the CLI's timestamps of
    the call and of its result (the lines carry them; the core reads no clock)."""
    if isinstance(rich, dict):
        for key in ("durationMs", "totalDurationMs", "duration_ms"):
            if (own := count(rich.get(key))) is not None:
                return own
    return elapsed_ms(started, ended)


def paths_of(tool_input: dict[str, Any]) -> list[str]:
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


def shape_output(
    result: ev.ToolResult, name: str, tool_input: dict[str, Any], rich: dict[str, Any]
) -> None:
    """Fill ``output`` (and ``changed``/``listing``) from the tool's ``tool_use_result``."""
    if name in ("Edit", "MultiEdit", "Write", "NotebookEdit"):
        path = str(rich.get("filePath") or rich.get("notebook_path") or tool_input.get("file_path"))
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


def binary_blocks(content: Any, path: str | None) -> list[ev.BinaryData]:
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
    text = _TOOLS_USED_TAG.sub("", text_of(content)) if isinstance(content, list) else fallback
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


def summary_of(text: str) -> str:
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
COMMANDS: Final[dict[str, str]] = {
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
