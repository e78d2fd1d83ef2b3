"""Diffs of the files an agent changed, for agents that say *which* files changed but not *how*.

Theory of operation
-------------------
Codex's ``file_change`` item lists paths and a kind (add, update, delete) and no diff; Gemini's
``write_file``/``replace`` results carry no diff either. §5.3.3 wants a write's output to be a diff
when something changed, so the parser reads the files itself: ``FileChanges.before(paths)`` when
the agent announces the change (Codex ``item.started``, Gemini ``tool_use``), ``diff(path)`` when it
reports it done (``created(path)`` for a file the agent says it added: its "before" is nothing).
The agent prints the announcement *before* it writes, but the gateway reads stdout a little later,
so the "before" read may already see the new content; then before equals after and no diff is
claimed. A change reported without an announcement has no baseline at all.

A diff is only ever made from contents read for that change, never guessed: when none can be made
(the race was lost, no announcement, a binary or oversized file) the diff is None and the parser
reports the change without one. This is the one place parsers touch the file system; ``read`` is
injectable, so tests (and replays of recordings, whose paths are not on this machine) decide what
the "workspace" holds.
"""

from __future__ import annotations

import difflib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Final

__all__ = ["FileChanges", "read_text_file"]

MAX_FILE_BYTES: Final = 1 << 20  # larger files are not diffed (nor kept)
MAX_PENDING: Final = 256  # announced changes waiting for their report

# A reader returns a file's text, None when it cannot be read as text, and raises
# FileNotFoundError when there is no such file (a new file's "before" is then known: nothing).
Reader = Callable[[str], "str | None"]


class _Absent:
    __slots__ = ()


_ABSENT: Final = _Absent()
_Content = str | None | _Absent


def read_text_file(path: str) -> str | None:
    """The file's text; None when it is unreadable, binary or over the size limit; raises
    FileNotFoundError when it does not exist."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise
    except OSError:
        return None
    if len(data) > MAX_FILE_BYTES or b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


class FileChanges:
    """Before/after reads of files an agent changes, turned into unified diffs."""

    __slots__ = ("_before", "_read")

    def __init__(self, read: Reader = read_text_file) -> None:
        self._read = read
        # Per path announced and not yet reported: its content then (bounded: see ``before``).
        self._before: OrderedDict[str, _Content] = OrderedDict()

    def before(self, paths: Iterable[str]) -> None:
        """The agent announced a change of ``paths``: read them now."""
        for path in paths:
            self._before[path] = self._content(path)
            self._before.move_to_end(path)
        while len(self._before) > MAX_PENDING:
            self._before.popitem(last=False)  # announced, never reported (the agent died)

    def diff(self, path: str, *, deleted: bool = False) -> str | None:
        """A unified diff of ``path`` since ``before``, or None when none can be told for sure."""
        if path not in self._before:
            return None
        old = self._before.pop(path)
        new = _ABSENT if deleted else self._content(path)
        if isinstance(new, _Absent):
            return _unified(path, old, None) if isinstance(old, str) else None
        if new is None or old is None or old == new:
            # Unreadable, or the announcement was read after the write: nothing sure to show.
            return None
        return _unified(path, None if isinstance(old, _Absent) else old, new)

    def created(self, path: str) -> str | None:
        """A diff that creates ``path`` with what it holds now (an added file), or None."""
        self._before.pop(path, None)
        new = self._content(path)
        return _unified(path, None, new) if isinstance(new, str) else None

    def _content(self, path: str) -> _Content:
        try:
            return self._read(path)
        except FileNotFoundError:
            return _ABSENT


def _unified(path: str, old: str | None, new: str | None) -> str:
    """``old`` None: the file is created; ``new`` None: it is deleted."""
    lines = difflib.unified_diff(
        (old or "").splitlines(keepends=True),
        (new or "").splitlines(keepends=True),
        fromfile="/dev/null" if old is None else path,
        tofile="/dev/null" if new is None else path,
    )
    out = []
    for line in lines:
        # difflib leaves a last line without newline unterminated; say so as diff(1) does.
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)
