"""Codex's saved conversations (CLI 0.171.0): ``<codex home>/sessions/YYYY/MM/DD/rollout-*.jsonl``.

Theory of operation
-------------------
Found with the real CLI (``tests/e2e/test_conversations_realcli.py``):

* The Codex home is ``$CODEX_HOME``, else ``$HOME/.codex``. Every thread (conversation) is one file
  ``sessions/<year>/<month>/<day>/rollout-<local time>-<thread id>.jsonl``, under the day it began,
  whatever the workspace; the thread id is what ``codex exec resume <id>`` takes. A resumed thread
  is appended to the same file.
* Each line is ``{"timestamp", "type", "payload"}``. The first, ``session_meta``, holds the thread
  ``id`` and its ``cwd``: a file counts only when that is the workspace. A turn runs from
  ``event_msg`` ``task_started`` to ``task_complete`` (or ``turn_aborted``); what happened in it is
  in ``event_msg`` ``item_completed`` lines, whose ``item`` is the app-server's ``ThreadItem``:
  ``UserMessage`` (the prompt), ``AgentMessage``, ``Reasoning``, ``CommandExecution``,
  ``FileChange``, ``McpToolCall``, ``WebSearch``, ``TodoList``. The turn's token usage is the last
  ``token_usage_record``'s ``turn_token_usage``. The ``response_item`` lines repeat the model's
  input and output in the API's shape (with the CLI's own instructions): they are not read.

A transcript is translated by writing each item in the shape ``codex exec --json`` prints it
(``item.completed``: type names in snake case, the command as one shell string, file changes as
``{path, kind}``) and feeding the stdout parser (``CodexParser``), so a saved turn gives the events a
live one gave.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from .. import events as ev
from ..file_changes import new_file_diff
from ..saved import (
    Location,
    ReplayedTurn,
    SavedFile,
    Summary,
    Transcript,
    agent_home,
    decode_line,
    head_lines,
    lines_of,
    listed,
    transcript_of,
)
from .stdout import CodexParser

__all__ = ["FORMAT", "CodexSaved"]

_NAME: Final = re.compile(
    r"rollout-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-"
    r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl"
)
# ThreadItem type → the item type of `codex exec --json`
_ITEM_TYPES: Final = {
    "AgentMessage": "agent_message",
    "Reasoning": "reasoning",
    "CommandExecution": "command_execution",
    "FileChange": "file_change",
    "McpToolCall": "mcp_tool_call",
    "WebSearch": "web_search",
    "TodoList": "todo_list",
}


class _Line(msgspec.Struct):
    type: str = ""
    timestamp: str | None = None
    payload: dict[str, Any] = {}


_decode: Final = msgspec.json.Decoder(_Line).decode
_encode: Final = msgspec.json.Encoder().encode


def _texts(content: Any) -> str:
    if not isinstance(content, list):
        return ""
    return "".join(
        part["text"]
        for part in content
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    )


def _item(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The ``item`` of an ``item_completed`` event, or None."""
    if payload.get("type") != "item_completed":
        return None
    item = payload.get("item")
    return item if isinstance(item, dict) else None


class CodexSaved:
    """``parsers.saved.SavedFormat`` of Codex (see the module docstring)."""

    def locations(self, env: Mapping[str, str], workspace: str) -> list[Location]:
        home = agent_home(env, "CODEX_HOME", ".codex")
        if home is None:
            return []
        home = home.rstrip("/")
        return [Location(f"{home}/sessions", root=home, depth=3)]

    @staticmethod
    def _id(name: str) -> str | None:
        match = _NAME.fullmatch(name)
        return match.group(1) if match else None

    def is_conversation(self, name: str) -> bool:
        return self._id(name) is not None

    def may_hold(self, name: str, conversation_id: str) -> bool:
        return self._id(name) == conversation_id

    def file_name(self, conversation_id: str) -> str | None:
        return None  # the name has the thread's start time too: found by its id

    def belongs(self, head: bytes, workspace: str) -> bool:
        for raw in head_lines(head):
            line = decode_line(_decode, raw)
            if line is not None and line.type == "session_meta":
                return line.payload.get("cwd") == workspace
        return True

    def summary(self, saved: SavedFile, workspace: str) -> Summary | None:
        conversation_id = self._id(saved.name)
        if conversation_id is None:
            return None
        own = False
        title = None
        turns = 0
        for raw in lines_of(saved):
            line = decode_line(_decode, raw)
            if line is None:
                continue
            if line.type == "session_meta":
                if line.payload.get("cwd") != workspace:
                    return None
                own = True
            elif line.type == "event_msg":
                item = _item(line.payload)
                if item is not None and item.get("type") == "UserMessage":
                    turns += 1
                    title = title or _texts(item.get("content"))
        if not own:
            return None
        return listed(conversation_id, title or None, turns, saved)

    def transcript(
        self, saved: SavedFile, workspace: str, conversation_id: str
    ) -> Transcript | None:
        parser = CodexParser()
        turns: list[ReplayedTurn] = []
        turn: ReplayedTurn | None = None
        usage: ev.UsageInfo | None = None
        own = False
        unreadable = untranslated = 0

        def close(stop: str) -> None:
            if turn is not None:
                turn.events += parser.end()
                turn.events.append(ev.TurnEnded(stop_reason=stop, usage=usage))  # type: ignore[arg-type]

        for raw in lines_of(saved):
            line = decode_line(_decode, raw)
            if line is None:
                unreadable += 1
                continue
            payload = line.payload
            if line.type == "session_meta":
                if payload.get("cwd") != workspace:
                    return None
                own = True
                continue
            if line.type == "token_usage_record":
                usage = _usage(payload.get("turn_token_usage")) or usage
                continue
            if line.type != "event_msg":
                continue
            kind = payload.get("type")
            if kind == "task_started":
                close("end_turn")
                turn, usage = ReplayedTurn(prompt=None, events=[]), None
                turns.append(turn)
            elif kind in ("task_complete", "turn_aborted"):
                close("end_turn" if kind == "task_complete" else "cancelled")
                turn = None
            elif (item := _item(payload)) is not None:
                if turn is None:  # the file was read from its middle
                    turn, usage = ReplayedTurn(prompt=None, events=[]), None
                    turns.append(turn)
                if item.get("type") == "UserMessage":
                    if turn.prompt is None:
                        turn.prompt = _texts(item.get("content"))
                    continue
                stdout = _stdout_line(item)
                if stdout is None:
                    untranslated += 1
                    continue
                events = parser.feed(stdout)
                kept = [e for e in events if not isinstance(e, ev.ParseError | ev.Unknown)]
                if item.get("type") == "FileChange":
                    _with_saved_diff(kept, item.get("changes"))
                untranslated += len(events) - len(kept)
                turn.events += kept
        close("end_turn")
        if not own and turns:
            return None
        return transcript_of(turns, saved, unreadable, untranslated)


def _stdout_line(item: dict[str, Any]) -> bytes | None:
    """The ``item.completed`` line ``codex exec --json`` prints for a saved item."""
    kind = _ITEM_TYPES.get(item.get("type"))  # type: ignore[arg-type]
    if kind is None:
        return None
    out = {k: v for k, v in item.items() if k not in ("type", "content", "summary_text")}
    out["type"] = kind
    if kind == "agent_message":
        out["text"] = _texts(item.get("content"))
    elif kind == "reasoning":
        summary = item.get("summary_text")
        out["text"] = (
            "\n\n".join(s for s in summary if isinstance(s, str))
            if isinstance(summary, list)
            else ""
        )
    elif kind == "command_execution" and isinstance(item.get("command"), list):
        out["command"] = shlex.join(str(a) for a in item["command"])
    elif kind == "file_change" and isinstance(item.get("changes"), dict):
        out["changes"] = [
            {
                "path": path,
                "kind": change.get("type", "update") if isinstance(change, dict) else "update",
            }
            for path, change in item["changes"].items()
        ]
    return _encode({"type": "item.completed", "item": out})


def _with_saved_diff(events: list[ev.AgentEvent], changes: Any) -> None:
    """A file change's result as the diff the thread saved (the stdout parser, told no workspace,
    can only list the files), when it saved one for every file."""
    if not isinstance(changes, dict) or not changes:
        return
    diffs = []
    for path, change in changes.items():
        kind = change.get("type") if isinstance(change, dict) else None
        if kind == "update" and isinstance(change.get("unified_diff"), str):
            diffs.append(f"--- {path}\n+++ {path}\n{change['unified_diff']}")
        elif kind == "add" and isinstance(change.get("content"), str):
            diffs.append(new_file_diff(path, change["content"]))
        else:
            return
    for event in events:
        if isinstance(event, ev.ToolResult) and not event.is_error:
            event.output, event.output_type, event.changed = "".join(diffs), "diff", True


def _usage(usage: Any) -> ev.UsageInfo | None:
    if not isinstance(usage, dict):
        return None

    def count(key: str) -> int:
        value = usage.get(key)
        return value if type(value) is int and value >= 0 else 0

    return ev.UsageInfo(
        input_tokens=count("input_tokens"),
        output_tokens=count("output_tokens"),
        cache_read_tokens=count("cached_input_tokens"),
        cache_write_tokens=count("cache_write_input_tokens"),
        thinking_tokens=count("reasoning_output_tokens"),
    )


FORMAT: Final = CodexSaved()
