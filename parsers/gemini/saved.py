"""Gemini CLI's saved conversations (CLI 0.61.0): ``~/.gemini/tmp/<project>/chats/session-*.jsonl``.

Theory of operation
-------------------
Found with the real CLI (``tests/e2e/test_conversations_realcli.py``) and its source:

* The home is ``$GEMINI_CLI_HOME``, else ``$HOME``; the CLI's directory ``.gemini`` in it. A
  project's files are in ``tmp/<short id>/``, the short id being the workspace's base name made a
  slug (lower case, every run of characters other than ``a-z0-9`` one ``-``, none at the ends;
  ``project`` when empty), with ``-1``, ``-2``, ... appended when another project took it first
  (``projects.json`` records which; this reader does not need it). Older versions used the
  SHA-256 of the path instead. Both are looked in (the slug and ``MAX_SLUG_SUFFIX`` suffixes).
* Each conversation is ``chats/session-<start time>-<first 8 characters of its id>.jsonl``; the
  full id (what ``--resume`` takes) is in the file. The file is a log of a document: a header
  record ``{sessionId, projectHash, startTime, lastUpdated, kind}`` (``projectHash`` is the
  SHA-256 of the workspace's path: a file counts only when it is this workspace's), message
  records ``{id, timestamp, type, content, ...}`` (a record whose id was seen replaces it: a model
  message is written again once its tool calls are known), and ``{"$set": {...}}`` updates, of
  which ``messages`` replaces the whole list (a resumed session writes the header, a list of its
  context alone, then the whole list again). A message that ``$set`` lists keeps the richer fields
  of its own earlier record (tokens, thoughts, tool calls), if there was one.
* Messages: ``user`` (``content`` text parts, or ``functionResponse`` parts that answer tool
  calls; the first, ``<session_context>``, is the CLI's), ``gemini`` (``content`` text,
  ``thoughts`` ``[{subject, description}]``, ``toolCalls`` ``[{id, name, args, status,
  resultDisplay, result}]``, ``tokens`` ``{input, output, cached, thoughts, tool, total}``),
  ``info``, ``warning``, ``error``.

A transcript is translated by writing what a model message holds as the stream-json lines the CLI
prints (``message``, ``tool_use``, ``tool_result``) and feeding the stdout parser (``GeminiParser``);
thoughts, which stream-json does not print, become thinking directly.
"""

from __future__ import annotations

import hashlib
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
    decode_line,
    head_lines,
    lines_of,
    listed,
    transcript_of,
)
from .stdout import GeminiParser

__all__ = ["FORMAT", "GeminiSaved", "project_slug"]

MAX_SLUG_SUFFIX: Final = 9  # tmp/<slug>-1 ... -9 are looked in too
_CONTEXT: Final = "<session_context>"  # the CLI's first user message
_NOT_SLUG: Final = re.compile(r"[^a-z0-9]+")
_NAME: Final = re.compile(r"session-[0-9T:-]+-([0-9a-f]{8})\.jsonl")
_encode: Final = msgspec.json.Encoder().encode


def project_slug(workspace: str) -> str:
    base = workspace.rstrip("/").rpartition("/")[2]
    return _NOT_SLUG.sub("-", base.lower()).strip("-") or "project"


def _hash(workspace: str) -> str:
    return hashlib.sha256(workspace.encode("utf-8", "surrogateescape")).hexdigest()


def _text(content: Any) -> str | None:
    """The text of a message's content (a string, or text parts); None when it has other parts
    (a user message answering tool calls)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [p.get("text") for p in content if isinstance(p, dict)]
    if not texts or not all(isinstance(t, str) for t in texts) or len(texts) != len(content):
        return None
    return "".join(texts)  # type: ignore[arg-type]


def _prompt(message: dict[str, Any]) -> str | None:
    if message.get("type") != "user":
        return None
    text = _text(message.get("content"))
    return None if text is None or text.startswith(_CONTEXT) else text


class _Document(msgspec.Struct):
    """The file's records applied in order."""

    session_id: str | None = None
    own: bool = False
    foreign: bool = False
    messages: dict[str, dict[str, Any]] = {}
    unreadable: int = 0


def _document(saved: SavedFile, workspace: str) -> _Document:
    doc = _Document(messages={})
    project = _hash(workspace)
    seen: dict[str, dict[str, Any]] = {}  # every message record by id, the last one
    for raw in lines_of(saved):
        record = decode_line(msgspec.json.decode, raw)
        if not isinstance(record, dict):
            doc.unreadable += 1
            continue
        update = record.get("$set")
        if isinstance(update, dict):
            if isinstance(update.get("sessionId"), str):
                doc.session_id = update["sessionId"]
            listed = update.get("messages")
            if isinstance(listed, list):
                doc.messages = {
                    m["id"]: {**m, **seen.get(m["id"], {})}
                    for m in listed
                    if isinstance(m, dict) and isinstance(m.get("id"), str)
                }
        elif "projectHash" in record:
            if record.get("projectHash") != project:
                doc.foreign = True
            else:
                doc.own = True
            if isinstance(record.get("sessionId"), str):
                doc.session_id = record["sessionId"]
        elif isinstance(record.get("id"), str) and isinstance(record.get("type"), str):
            doc.messages[record["id"]] = seen[record["id"]] = record
        else:
            doc.unreadable += 1
    return doc


class GeminiSaved:
    """``parsers.saved.SavedFormat`` of Gemini CLI (see the module docstring)."""

    def locations(self, env: Mapping[str, str], workspace: str) -> list[Location]:
        home = env.get("GEMINI_CLI_HOME") or env.get("HOME")
        if not home:
            return []
        root = f"{home.rstrip('/')}/.gemini"
        slug = project_slug(workspace)
        names = [slug, *(f"{slug}-{n}" for n in range(1, MAX_SLUG_SUFFIX + 1)), _hash(workspace)]
        return [Location(f"{root}/tmp/{name}/chats", root=root) for name in names]

    def is_conversation(self, name: str) -> bool:
        return _NAME.fullmatch(name) is not None

    def may_hold(self, name: str, conversation_id: str) -> bool:
        match = _NAME.fullmatch(name)
        return match is not None and conversation_id.startswith(match.group(1))

    def file_name(self, conversation_id: str) -> str | None:
        return None  # the name has the start time too: found by the id's first characters

    def belongs(self, head: bytes, workspace: str) -> bool:
        for raw in head_lines(head):
            record = decode_line(msgspec.json.decode, raw)
            if isinstance(record, dict) and "projectHash" in record:
                return record["projectHash"] == _hash(workspace)
        return True

    def summary(self, saved: SavedFile, workspace: str) -> Summary | None:
        doc = _document(saved, workspace)
        if not doc.own or doc.foreign or doc.session_id is None:
            return None
        prompts = [p for m in doc.messages.values() if (p := _prompt(m)) is not None]
        return listed(doc.session_id, prompts[0] if prompts else None, len(prompts), saved)

    def transcript(
        self, saved: SavedFile, workspace: str, conversation_id: str
    ) -> Transcript | None:
        doc = _document(saved, workspace)
        if not doc.own or doc.foreign or doc.session_id != conversation_id:
            return None
        parser = GeminiParser()
        turns: list[ReplayedTurn] = []
        turn: ReplayedTurn | None = None
        tokens: list[dict[str, Any]] = []

        def close() -> None:
            if turn is not None:
                turn.events += parser.end()
                turn.events.append(ev.TurnEnded(stop_reason="end_turn", usage=_usage(tokens)))

        for message in doc.messages.values():
            prompt = _prompt(message)
            kind = message.get("type")
            if prompt is None and kind not in ("gemini", "error", "warning"):
                continue  # the CLI's context, tool answers (their calls have them), info
            if prompt is not None or turn is None:
                close()
                turn, tokens = ReplayedTurn(prompt=prompt, events=[]), []
                turns.append(turn)
                if prompt is not None:
                    continue
            if kind in ("error", "warning"):
                text = _text(message.get("content")) or kind
                turn.events.append(ev.Notice(severity=kind, code="AGENT_ERROR", message=text))
                continue
            turn.events += _thoughts(message)
            for line in _stdout_lines(message):
                turn.events += [
                    e for e in parser.feed(line) if not isinstance(e, ev.ParseError | ev.Unknown)
                ]
            if isinstance(message.get("tokens"), dict):
                tokens.append(message["tokens"])
        close()
        return transcript_of(turns, saved, doc.unreadable)


def _thoughts(message: dict[str, Any]) -> list[ev.AgentEvent]:
    out: list[ev.AgentEvent] = []
    thoughts = message.get("thoughts")
    for n, thought in enumerate(thoughts if isinstance(thoughts, list) else ()):
        if not isinstance(thought, dict):
            continue
        subject, description = thought.get("subject"), thought.get("description")
        parts = [p for p in (subject, description) if isinstance(p, str) and p]
        if parts:
            key = f"{message.get('id')}:thought{n}"
            out.append(ev.ThinkingDelta(block=key, text="\n".join(parts)))
            out.append(ev.ThinkingEnd(block=key))
    return out


def _stdout_lines(message: dict[str, Any]) -> list[bytes]:
    """What stream-json printed for a model message: its text, then each tool call and result."""
    lines = []
    text = _text(message.get("content"))
    if text:
        lines.append(_encode({"type": "message", "role": "assistant", "content": text}))
    calls = message.get("toolCalls")
    for call in calls if isinstance(calls, list) else ():
        if not isinstance(call, dict) or not isinstance(call.get("id"), str):
            continue
        args = call.get("args")
        use = {
            "type": "tool_use",
            "tool_name": call.get("name") if isinstance(call.get("name"), str) else "?",
            "tool_id": call["id"],
            "parameters": args if isinstance(args, dict) else {},
        }
        display = call.get("resultDisplay")
        result = {
            "type": "tool_result",
            "tool_id": call["id"],
            "status": "success" if call.get("status") == "success" else "error",
            "output": display if isinstance(display, str) else None,
        }
        if isinstance(call.get("timestamp"), str):
            result["timestamp"] = call["timestamp"]
        lines += [_encode(use), _encode(result)]
    return lines


def _usage(tokens: list[dict[str, Any]]) -> ev.UsageInfo | None:
    if not tokens:
        return None

    def total(key: str) -> int:
        return sum(t[key] for t in tokens if type(t.get(key)) is int and t[key] >= 0)

    cached = total("cached")
    return ev.UsageInfo(
        input_tokens=max(0, total("input") - cached),
        output_tokens=total("output"),
        cache_read_tokens=cached,
        thinking_tokens=total("thoughts"),
    )


FORMAT: Final = GeminiSaved()
