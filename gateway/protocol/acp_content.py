"""What the parts of a DPS frame become in ACP (gateway/protocol/acp_master.py's): a tool's ACP
``kind`` and title, its locations, a result's content (diffs as ACP wants them: path, old and new
text), a todo or plan tool's entries, a command, a permission option's kind. Pure functions.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from gateway.protocol import frames as F
from gateway.protocol.tools import lookup

__all__ = [
    "MAX_PLAN_ENTRIES",
    "MAX_TITLE_CHARS",
    "PLAN_TOOLS",
    "command",
    "kind",
    "locations",
    "option_kind",
    "plan_entries",
    "result_content",
    "text_content",
    "title",
]

MAX_TITLE_CHARS: Final = 200
MAX_PLAN_ENTRIES: Final = 200
_encode = msgspec.json.encode

_ACP_KINDS: Final = frozenset(
    (
        "read",
        "edit",
        "delete",
        "move",
        "search",
        "execute",
        "think",
        "fetch",
        "switch_mode",
        "other",
    )
)
PLAN_TOOLS: Final = frozenset(("TodoWrite", "update_plan", "write_todos"))
_PATH_KEYS: Final = ("file_path", "path", "notebook_path")
_DETAIL_KEYS: Final = ("command", "file_path", "path", "pattern", "url", "query", "description")
_OPTION_KINDS: Final = {
    "allow": "allow_once",
    "deny": "reject_once",
    "allow_once": "allow_once",
    "allow_always": "allow_always",
    "reject_once": "reject_once",
    "reject_always": "reject_always",
}


def kind(name: str) -> str:
    if name in _ACP_KINDS:
        return name  # an ACP agent's call named by its kind
    spec = lookup(name)
    operation = spec.operation
    if spec.category == "shell" or operation == "exec":
        return "execute"
    if operation == "read":
        return "read"
    if operation == "write":
        return "edit"
    if operation in ("search", "list"):
        return "search"
    if spec.category == "web":
        return "fetch"
    if operation == "delegate" or spec.category == "planning":
        return "think"
    return "other"


def title(name: str, tool_input: dict[str, Any]) -> str:
    for key in _DETAIL_KEYS:
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            line = value.strip().splitlines()[0] if value.strip() else value
            return f"{name}: {line}"[:MAX_TITLE_CHARS]
    return name[:MAX_TITLE_CHARS] or "tool"


def locations(tool_input: dict[str, Any]) -> list[dict[str, Any]]:
    for key in _PATH_KEYS:
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            return [{"path": value}]
    return []


def text_content(text: str) -> dict[str, Any]:
    return {"type": "content", "content": {"type": "text", "text": text}}


def command(cmd: F.Command) -> dict[str, Any]:
    out: dict[str, Any] = {"name": cmd.name, "description": cmd.description}
    if cmd.parameters:
        hint = " ".join(p.name for p in cmd.parameters)
        out["input"] = {"hint": hint}
    return out


def option_kind(option: F.InteractionOption) -> str:
    kind = _OPTION_KINDS.get(option.value)
    if kind is not None:
        return kind
    return "reject_once" if option.risk_level == "safe" else "allow_once"


_STATUS: Final = {"completed": "completed", "in_progress": "in_progress", "pending": "pending"}


def plan_entries(tool_input: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The entries of a todo or plan tool's input (Claude's ``todos``, ACP's and Codex's
    ``entries``/``plan``), as ACP ``PlanEntry`` objects; None when it has no list."""
    items = next(
        (
            v
            for k in ("todos", "entries", "plan", "items")
            if isinstance(v := tool_input.get(k), list)
        ),
        None,
    )
    if items is None:
        return None
    entries = []
    for item in items[:MAX_PLAN_ENTRIES]:
        if not isinstance(item, dict):
            continue
        text = next(
            (v for k in ("content", "step", "text") if isinstance(v := item.get(k), str)), ""
        )
        status = _STATUS.get(
            str(item.get("status")), "completed" if item.get("completed") is True else "pending"
        )
        priority = item.get("priority")
        entries.append(
            {
                "content": text,
                "status": status,
                "priority": priority if priority in ("high", "medium", "low") else "medium",
            }
        )
    return entries


def result_content(result: F.InvokeResult, tool_input: dict[str, Any]) -> list[Any] | None:
    output = result.output
    kind = result.output_type
    if kind == "empty" or output is None:
        return None
    if kind == "diff":
        diffs = _input_diff(tool_input) or _unified_diffs(output if isinstance(output, str) else "")
        if diffs:
            return diffs
    if kind == "file_list" and isinstance(output, list):
        return [text_content("\n".join(str(p) for p in output))]
    if isinstance(output, str):
        return [text_content(output)]
    return [text_content(_encode(output).decode())]


def _input_diff(tool_input: dict[str, Any]) -> list[dict[str, Any]]:
    """A diff from what an edit tool was given (Claude's Edit and Write, their kin): the path and
    the old and new text, as ACP wants them."""
    path = tool_input.get("file_path") or tool_input.get("path")
    if not isinstance(path, str):
        return []
    old, new = tool_input.get("old_string"), tool_input.get("new_string")
    if isinstance(old, str) and isinstance(new, str):
        return [{"type": "diff", "path": path, "oldText": old, "newText": new}]
    content = tool_input.get("content")
    if isinstance(content, str):
        return [{"type": "diff", "path": path, "oldText": None, "newText": content}]
    return []


_FILE_HEADER: Final = re.compile(r"^\+\+\+ (?:b/)?(.*?)\s*$")


def _unified_diffs(text: str) -> list[dict[str, Any]]:
    """The files of a unified diff, each as the lines its hunks held before and after (what a
    unified diff knows of the files: their changed parts with context)."""
    diffs: list[dict[str, Any]] = []
    old: list[str] = []
    new: list[str] = []
    path: str | None = None
    created = False

    def close() -> None:
        if path is not None:
            diffs.append(
                {
                    "type": "diff",
                    "path": path,
                    "oldText": None if created else "\n".join(old),
                    "newText": "\n".join(new),
                }
            )

    for line in text.splitlines():
        if line.startswith("--- "):
            close()
            path, old, new = None, [], []
            created = line.strip() == "--- /dev/null"
        elif line.startswith("+++ ") and path is None:
            match = _FILE_HEADER.match(line)
            path = match.group(1) if match else line[4:]
        elif line.startswith("@@") or path is None:
            continue
        elif line.startswith("+"):
            new.append(line[1:])
        elif line.startswith("-"):
            old.append(line[1:])
        elif line.startswith(" "):
            old.append(line[1:])
            new.append(line[1:])
    close()
    return diffs
