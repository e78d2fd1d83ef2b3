"""Claude Code's saved conversations (CLI 2.1.328): ``<config dir>/projects/<slug>/<id>.jsonl``.

Theory of operation
-------------------
Found with the real CLI (``tests/e2e/test_conversations_realcli.py``):

* The config dir is ``$CLAUDE_CONFIG_DIR``, else ``$HOME/.claude``. A workspace's conversations are
  in ``projects/<slug>/``, the slug being the workspace's absolute path with every character that is
  not an ASCII letter or digit replaced by ``-`` (``/tmp/a.b_c`` → ``-tmp-a-b-c``). Different paths
  can share a slug (``a.b`` and ``a-b``), so a file counts only when its lines' ``cwd`` is the
  workspace itself. A slug longer than 200 characters is shortened by the CLI with a hash this
  reader does not compute: such workspaces list nothing.
* Each conversation is one file named ``<session id>.jsonl`` (the id ``--resume`` takes), one JSON
  object per line, appended as the conversation goes on. The lines that matter have the same shape
  as the stream-json stdout lines: ``user`` (a prompt: ``message.content`` a string or text blocks;
  or tool results: ``tool_result`` blocks, with the richer ``toolUseResult`` where stdout says
  ``tool_use_result``) and ``assistant`` (one content block per line, the API message's usage
  repeated on each). ``isSidechain`` lines are a subagent's own conversation; ``isMeta`` user lines
  and ``isCompactSummary`` ones are the CLI's, not the user's. Besides: ``custom-title``
  (``customTitle``, set by the user) and ``ai-title`` (``aiTitle``), ``cost-state``
  (``totalCostUSD`` so far), and many kinds of bookkeeping (``attachment``, ``queue-operation``,
  ``api-request``, ...) that say nothing a master shows.

A transcript is translated by feeding the stdout parser (``ClaudeCodeParser``) lines in its stdout
shape, so a saved turn gives the events a live one gave: text, thinking, tool calls and their
results in the shape their ``output_type`` promises. The transcript has no ``result`` lines: a turn
ends where the next prompt begins (or the file ends), with the usage of its API messages summed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from .. import events as ev
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
from .stdout import ClaudeCodeParser

__all__ = ["FORMAT", "ClaudeCodeSaved", "slug"]

MAX_SLUG_CHARS: Final = 200  # longer ones the CLI shortens with a hash of its own
_ID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NOT_ALNUM: Final = re.compile(r"[^A-Za-z0-9]")


def slug(workspace: str) -> str:
    """The CLI's directory name for a workspace path (each UTF-16 unit of JavaScript's string
    that is not an ASCII letter or digit becomes ``-``)."""
    return "".join(
        "-" * (2 if ord(c) > 0xFFFF else 1) if _NOT_ALNUM.match(c) else c for c in workspace
    )


class _Usage(msgspec.Struct):
    input_tokens: int | None = 0
    output_tokens: int | None = 0
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class _Message(msgspec.Struct):
    id: str = ""
    content: Any = None
    usage: _Usage | None = None
    stop_reason: str | None = None


class _Line(msgspec.Struct):
    type: str = ""
    cwd: str | None = None
    timestamp: str | None = None
    message: _Message | None = None
    isSidechain: bool = False  # the CLI's camelCase names
    isMeta: bool = False
    isCompactSummary: bool = False
    toolUseResult: Any = None
    customTitle: str | None = None
    aiTitle: str | None = None
    totalCostUSD: float | None = None


_decode: Final = msgspec.json.Decoder(_Line).decode
_encode: Final = msgspec.json.Encoder().encode


def _prompt(line: _Line) -> str | None:
    """The user's prompt a ``user`` line carries, or None (tool results, the CLI's own lines)."""
    if line.isMeta or line.isCompactSummary or line.isSidechain or line.message is None:
        return None
    content = line.message.content
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"]
        if len(texts) == len(content) and all(isinstance(t, str) for t in texts):
            return "\n".join(texts)  # type: ignore[arg-type]
    return None


class ClaudeCodeSaved:
    """``parsers.saved.SavedFormat`` of Claude Code (see the module docstring)."""

    def locations(self, env: Mapping[str, str], workspace: str) -> list[Location]:
        home = agent_home(env, "CLAUDE_CONFIG_DIR", ".claude")
        name = slug(workspace)
        if home is None or len(name) > MAX_SLUG_CHARS:
            return []
        home = home.rstrip("/")
        return [Location(f"{home}/projects/{name}", root=home)]

    @staticmethod
    def _id(name: str) -> str | None:
        stem, dot, ext = name.partition(".")
        return stem if dot and ext == "jsonl" and _ID.fullmatch(stem) else None

    def is_conversation(self, name: str) -> bool:
        return self._id(name) is not None

    def may_hold(self, name: str, conversation_id: str) -> bool:
        return self._id(name) == conversation_id

    def file_name(self, conversation_id: str) -> str | None:
        return f"{conversation_id}.jsonl" if _ID.fullmatch(conversation_id) else None

    def belongs(self, head: bytes, workspace: str) -> bool:
        for raw in head_lines(head):
            line = decode_line(_decode, raw)
            if line is not None and line.cwd is not None:
                return line.cwd == workspace
        return True

    def summary(self, saved: SavedFile, workspace: str) -> Summary | None:
        conversation_id = self._id(saved.name)
        if conversation_id is None:
            return None
        own = False
        first_prompt = custom = ai = None
        turns = 0
        for raw in lines_of(saved):
            line = decode_line(_decode, raw)
            if line is None:
                continue
            if line.cwd is not None:
                if line.cwd != workspace:
                    return None  # another workspace's conversation with the same slug
                own = True
            if line.type == "custom-title" and line.customTitle:
                custom = line.customTitle
            elif line.type == "ai-title" and line.aiTitle:
                ai = line.aiTitle
            elif line.type == "user" and (prompt := _prompt(line)) is not None:
                turns += 1
                if first_prompt is None:
                    first_prompt = prompt
        if not own:
            return None
        return listed(conversation_id, custom or ai or first_prompt or None, turns, saved)

    def transcript(
        self, saved: SavedFile, workspace: str, conversation_id: str
    ) -> Transcript | None:
        parser = ClaudeCodeParser()
        turns: list[ReplayedTurn] = []
        turn: ReplayedTurn | None = None
        usage: dict[str, ev.UsageInfo] = {}  # API message id → its usage (repeated per block)
        stop: str | None = None
        cost: float | None = None
        own = False
        unreadable = 0

        def close() -> None:
            if turn is not None:
                turn.events += parser.end()
                turn.events.append(_turn_ended(usage, stop, cost))

        for raw in lines_of(saved):
            line = decode_line(_decode, raw)
            if line is None:
                unreadable += 1
                continue
            if line.cwd is not None:
                if line.cwd != workspace:
                    return None
                own = True
            if line.type == "cost-state" and line.totalCostUSD is not None:
                cost = line.totalCostUSD
                continue
            if line.type not in ("user", "assistant") or line.isSidechain:
                continue
            prompt = _prompt(line) if line.type == "user" else None
            if prompt is not None or turn is None:
                close()
                turn = ReplayedTurn(prompt=prompt, events=[])
                turns.append(turn)
                usage, stop, cost = {}, None, None
                if prompt is not None:
                    continue
            message = line.message
            if line.type == "assistant" and message is not None:
                if message.usage is not None and message.id:
                    usage[message.id] = _usage_info(message.usage)
                stop = message.stop_reason or stop
            events = parser.feed(_stdout_line(line, raw))
            turn.events += [e for e in events if not isinstance(e, ev.ParseError | ev.Unknown)]
        close()
        if not own and turns:
            return None
        return transcript_of(turns, saved, unreadable)


def _stdout_line(line: _Line, raw: bytes) -> bytes:
    """The line as the stdout parser knows it: the same but for the rich tool result's name."""
    if line.type != "user" or line.toolUseResult is None:
        return raw
    return _encode(
        {
            "type": "user",
            "message": msgspec.to_builtins(line.message),
            "tool_use_result": line.toolUseResult,
            "timestamp": line.timestamp,
        }
    )


def _usage_info(usage: _Usage) -> ev.UsageInfo:
    return ev.UsageInfo(
        input_tokens=usage.input_tokens or 0,
        output_tokens=usage.output_tokens or 0,
        cache_read_tokens=usage.cache_read_input_tokens,
        cache_write_tokens=usage.cache_creation_input_tokens,
    )


def _turn_ended(
    usage: dict[str, ev.UsageInfo], stop: str | None, cost: float | None
) -> ev.TurnEnded:
    total = None
    if usage:
        total = ev.UsageInfo(
            input_tokens=sum(u.input_tokens for u in usage.values()),
            output_tokens=sum(u.output_tokens for u in usage.values()),
            cache_read_tokens=sum(u.cache_read_tokens or 0 for u in usage.values()),
            cache_write_tokens=sum(u.cache_write_tokens or 0 for u in usage.values()),
        )
    reason = "max_tokens" if stop in ("max_tokens", "model_context_window_exceeded") else "end_turn"
    return ev.TurnEnded(stop_reason=reason, usage=total, cost_usd=cost)  # type: ignore[arg-type]


FORMAT: Final = ClaudeCodeSaved()
