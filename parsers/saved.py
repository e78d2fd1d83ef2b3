"""An agent's own saved conversations: where it keeps them, and what a saved one says.

Theory of operation
-------------------
Every agent CLI writes the conversations it has had to disk, and can resume one (Claude Code under
``~/.claude/projects/``, Codex under ``~/.codex/sessions/``). Reading such a store is a parser
concern, beside the agent's stdout format: a ``SavedFormat`` (``ParserSpec.saved``) knows

* where the conversations of one workspace are (``locations``: directories, from the agent's home
  and environment; pure path arithmetic, nothing is touched),
* which file names in them are conversations (``is_conversation``), which may hold a given one
  (``may_hold``), and the file of an id when the name says it (``file_name``),
* what one file says, from its bytes: a ``Summary`` for a listing, and the ``Transcript`` of its
  turns as the same normalised agent events (``parsers/events.py``) its stdout parser produces, so
  the mapper makes the frames a master would have seen live.

It never opens a file: the shell (``gateway/agent/conversations/``) walks the directories and reads the
files, safely and within bounds, and hands the bytes here (``head`` and ``tail`` when a file was too
large to read whole). A file that is truncated, cut or hostile gives a ``Transcript`` marked
``partial`` or no summary (``None``), never an exception.

An agent that lists and loads conversations over its own protocol (ACP's ``session/list`` and
``session/load``) is not a file store: it is asked instead (``parsers.acp.StoreQuery``, run by
``gateway/agent/conversations/ask_acp.py``), for the same ``Summary`` and ``Transcript``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Protocol, TypeVar

import msgspec

from .events import AgentEvent
from .json_depth import MAX_AGENT_LINE_DEPTH, too_deep

_T = TypeVar("_T")

__all__ = [
    "MAX_TITLE_CHARS",
    "Location",
    "ReplayedTurn",
    "SavedFile",
    "SavedFormat",
    "Summary",
    "Transcript",
    "agent_home",
    "decode_line",
    "head_lines",
    "iso_time",
    "lines_of",
    "listed",
    "title_of",
    "transcript_of",
]

MAX_TITLE_CHARS = 200  # a listed title (a first prompt can be a whole document)


class Location(msgspec.Struct, frozen=True):
    """A directory that may hold the workspace's conversations, how deep under it they are
    (Codex: ``YYYY/MM/DD/``, depth 3; Claude Code: in it, depth 0), and the agent's own directory,
    which it must not lead out of once resolved (None: no such check)."""

    directory: str
    root: str | None
    depth: int = 0


class SavedFile(msgspec.Struct, frozen=True):
    """What the shell read of one conversation file: all of it (``tail`` empty, ``whole``), or
    its first and last bytes when it is larger than the bound."""

    name: str
    head: bytes
    tail: bytes = b""
    whole: bool = True
    mtime: float = 0.0  # seconds since the epoch


class Summary(msgspec.Struct, frozen=True):
    """One listed conversation (``GET /v1/agents/{agent}/conversations``)."""

    id: str
    title: str | None
    updated_at: str | None  # ISO 8601
    turns: int | None  # None when not known (the file was too large to read whole)


class ReplayedTurn(msgspec.Struct):
    """One earlier turn: the user's prompt (None when the transcript begins inside a turn) and
    what the agent did, as normalised events. The turn's end is an ``ev.TurnEnded`` last."""

    prompt: str | None
    events: list[AgentEvent]


class Transcript(msgspec.Struct):
    """A saved conversation's turns, oldest first. ``partial``: something of it was not read or
    not understood (``problem`` says what), so the turns shown are not all it held."""

    turns: list[ReplayedTurn]
    partial: bool = False
    problem: str | None = None


class SavedFormat(Protocol):
    """One agent's conversation store (see the module docstring)."""

    def locations(self, env: Mapping[str, str], workspace: str) -> list[Location]: ...

    def is_conversation(self, name: str) -> bool:
        """Whether a file of that name holds a conversation (by its name alone)."""
        ...

    def may_hold(self, name: str, conversation_id: str) -> bool:
        """Whether a file of that name may hold that conversation (the content decides)."""
        ...

    def file_name(self, conversation_id: str) -> str | None:
        """The file holding a conversation when its name is fixed by the id (None: look for it
        among the files, by ``may_hold``). None too for an id of the wrong form."""
        ...

    def belongs(self, head: bytes, workspace: str) -> bool:
        """From a file's first bytes: False when they show it is another workspace's (so a
        listing reads no more of it), True otherwise (also when they cannot tell)."""
        ...

    def summary(self, saved: SavedFile, workspace: str) -> Summary | None:
        """The listing entry of a file, or None when it is not this workspace's conversation."""
        ...

    def transcript(
        self, saved: SavedFile, workspace: str, conversation_id: str
    ) -> Transcript | None:
        """The conversation's turns, or None when the file is not this workspace's conversation
        ``conversation_id``."""
        ...


def agent_home(env: Mapping[str, str], variable: str, dot_dir: str) -> str | None:
    """The agent's own directory: ``$variable`` when set (``CLAUDE_CONFIG_DIR``, ``CODEX_HOME``),
    else ``$HOME/dot_dir``; None when neither is known."""
    own = env.get(variable)
    if own:
        return own
    home = env.get("HOME")
    return f"{home.rstrip('/')}/{dot_dir}" if home else None


def head_lines(head: bytes) -> Iterator[bytes]:
    """The complete lines of a file's first bytes (the piece they were cut through is not one)."""
    return lines_of(SavedFile("", head, whole=False))


def lines_of(saved: SavedFile) -> Iterator[bytes]:
    """The complete lines of what was read: all of a whole file (a last line without its newline
    is complete too: the file ended there); of a cut one, the head's and the tail's, without the
    piece each was cut through."""
    if saved.whole:
        yield from (line for line in saved.head.split(b"\n") if line.strip())
        return
    head = saved.head.split(b"\n")[:-1]  # the last piece was cut
    yield from (line for line in head if line.strip())
    tail = saved.tail.split(b"\n")[1:]  # the first piece was cut
    yield from (line for line in tail if line.strip())


def title_of(text: str) -> str:
    """A prompt as a one-line title of at most ``MAX_TITLE_CHARS`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_TITLE_CHARS else line[: MAX_TITLE_CHARS - 1] + "…"


def decode_line(decode: Callable[[bytes], _T], raw: bytes) -> _T | None:
    """A saved line decoded, or None when it cannot be used: not JSON, the wrong shape, or nested
    deeper than an agent's stdout line may be (its values could reach a frame)."""
    try:
        line = decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    return None if too_deep(raw, MAX_AGENT_LINE_DEPTH) else line


def iso_time(mtime: float) -> str | None:
    """A file's modification time as ISO 8601 (UTC, seconds)."""
    if mtime <= 0:
        return None
    return datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def listed(conversation_id: str, title: str | None, turns: int, saved: SavedFile) -> Summary:
    """A file's listing entry: its title (a prompt, None when there is none) made one line, the
    file's time, and its turns, counted only when the whole file was read."""
    return Summary(
        id=conversation_id,
        title=None if title is None else title_of(title),
        updated_at=iso_time(saved.mtime),
        turns=turns if saved.whole else None,
    )


def transcript_of(
    turns: list[ReplayedTurn], saved: SavedFile, unreadable: int, left_out: int = 0
) -> Transcript:
    """The turns read, marked partial with what was not: the file's beginning (too large to read
    whole), lines that could not be read, items of kinds the reader does not know."""
    problems = []
    if not saved.whole:
        problems.append("the file is larger than the gateway reads: only its end is shown")
    if unreadable:
        problems.append(f"{unreadable} line(s) could not be read")
    if left_out:
        problems.append(f"{left_out} item(s) of kinds the gateway does not know were left out")
    return Transcript(turns=turns, partial=bool(problems), problem="; ".join(problems) or None)
