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
injectable, so tests decide what the "workspace" holds.

What is read
------------
The paths come from the agent, which may be confused or hostile, and the diffs go to every master.
So a parser reads them as the agent sees them and no further: ``workspace_reader(workspace)``
resolves a relative path against the session's workspace (the agent's cwd, not the gateway's) and
reads only a regular file inside it once symlinks are resolved. A path outside (absolute, through
``..``, through a link that leads out), a directory, a FIFO or a device reads as None: no diff, the
change is still reported. A FIFO or device is refused before it is opened (opening a FIFO would
block the gateway, a device may do anything); a file that does not exist inside the workspace is a
file to be created. A parser never told its workspace (``no_files``: a recorded transcript, whose
paths are not on this machine) reads nothing.

After the check the file is opened from the workspace one name at a time, following no link: a
directory swapped for a link between the check and the open is refused, not followed. Left as they
are: a directory on the way moved out of the workspace while it is being walked (microseconds),
and hard links (a hard link is the file itself; an agent can only link files it could print).

A diff is not made either when making it would take difflib too long: its time grows with the
lines between the first and the last difference times the lines that differ (quadratically for a
file changed in many places: seconds for a 1 MiB file with every seventh line changed, with the
gateway's event loop held all that time). ``MAX_DIFF_WORK`` bounds that product, estimated in
linear time first.

What waits for a report is bounded (``MAX_PENDING`` changes, ``MAX_PENDING_CHARS`` of their text):
past that, the oldest announcement is forgotten and its change is reported without a diff. A parser
calls ``clear()`` when its agent's stdout closes: the next process reports its own changes.

Making diffs
------------
Every unified diff a parser reports is made here, so they all look alike (diff(1)'s
``\\ No newline at end of file``): ``text_diff`` from two texts (ACP's ``diff`` items; a
``FileChanges`` diff is made the same way, and is None where ``text_diff`` would replace every
line), ``new_file_diff`` for a file created with a given text (Claude Code's
``Write``, Codex's saved ``add``), ``unified_diff`` from hunks already made (Claude Code's
``structuredPatch``).
"""

from __future__ import annotations

import difflib
import functools
import os
import stat
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Final

__all__ = [
    "FileChanges",
    "new_file_diff",
    "no_files",
    "read_text_file",
    "text_diff",
    "too_costly",
    "unified_diff",
    "workspace_reader",
]

MAX_FILE_BYTES: Final = 1 << 20  # larger files are not diffed (nor kept)
MAX_PENDING: Final = 256  # announced changes waiting for their report
MAX_PENDING_CHARS: Final = 16 << 20  # the text of those changes' files together
# Lines between the first and the last difference, times the lines that differ: past this, no diff
# (a few tenths of a second of difflib at most).
MAX_DIFF_WORK: Final = 2_000_000
# A longer path names no file (Linux's PATH_MAX), and resolving one costs quadratic time in its parts.
MAX_PATH_CHARS: Final = 4096

# A reader returns a file's text, None when it cannot be read as text, and raises
# FileNotFoundError when there is no such file (a new file's "before" is then known: nothing).
Reader = Callable[[str], "str | None"]


class _Absent:
    __slots__ = ()


_ABSENT: Final = _Absent()
_Content = str | None | _Absent


def no_files(path: str) -> str | None:
    """The reader of a parser that does not know its workspace: nothing is read (no diff)."""
    return None


def workspace_reader(workspace: str | os.PathLike[str]) -> Reader:
    """A reader of the paths an agent names, as the agent sees them: a relative path from
    ``workspace`` (its cwd), and only a regular file inside it (see "What is read" above)."""
    return functools.partial(_read_in, os.path.realpath(workspace))


_WALK: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: should a FIFO be swapped in after the check, opening it does not wait for a writer.
_OPEN: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _read_in(root: str, path: str) -> str | None:
    if not path or len(path) > MAX_PATH_CHARS:
        return None
    try:
        real = os.path.realpath(os.path.join(root, path))  # an absolute ``path`` stays itself
    except ValueError:  # a NUL, or text no file name can hold
        return None
    if real == root or os.path.commonpath((root, real)) != root:
        return None  # outside the workspace, or the workspace itself
    *dirs, name = os.path.relpath(real, root).split(os.sep)
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None  # no workspace: nothing can be inside it
    try:
        for part in dirs:
            inner = os.open(part, _WALK, dir_fd=fd)
            os.close(fd)
            fd = inner
        # Looked at before it is opened: a FIFO or a device is never opened at all.
        if not stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            return None
        file = os.open(name, _OPEN, dir_fd=fd)
    except FileNotFoundError:
        raise  # inside the workspace, and not there (yet): a file to be created
    except OSError:
        return None  # a link where a directory was checked (ELOOP, ENOTDIR), no permission, ...
    finally:
        os.close(fd)
    return _read_regular(file)


def read_text_file(path: str) -> str | None:
    """The file's text; None when it is unreadable, binary, over the size limit or not a regular
    file; raises FileNotFoundError when it does not exist. Any path: an agent's paths are read
    through ``workspace_reader``."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None
    return _read_regular(fd)


def _read_regular(fd: int) -> str | None:
    """The text of the file open as ``fd`` (closed here), or None (see ``read_text_file``)."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with open(fd, "rb", closefd=False) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES or b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


class FileChanges:
    """Before/after reads of files an agent changes, turned into unified diffs."""

    __slots__ = ("_before", "_chars", "_read")

    def __init__(self, read: Reader = no_files) -> None:
        self._read = read
        # Per path announced and not yet reported: its content then (bounded: see ``before``).
        self._before: OrderedDict[str, _Content] = OrderedDict()
        self._chars = 0  # the length of the texts in _before

    def before(self, paths: Iterable[str]) -> None:
        """The agent announced a change of ``paths``: read them now."""
        for path in paths:
            if path in self._before:
                self._pop(path)
            content = self._before[path] = self._content(path)
            if isinstance(content, str):
                self._chars += len(content)
        while len(self._before) > MAX_PENDING or self._chars > MAX_PENDING_CHARS:
            self._pop(next(iter(self._before)))  # the oldest: never reported (the agent died)

    def clear(self) -> None:
        """Forget every announcement (the agent's stdout closed: no report will come)."""
        self._before.clear()
        self._chars = 0

    def diff(self, path: str, *, deleted: bool = False) -> str | None:
        """A unified diff of ``path`` since ``before``, or None when none can be told for sure."""
        if path not in self._before:
            return None
        old = self._pop(path)
        new = _ABSENT if deleted else self._content(path)
        if isinstance(new, _Absent):
            return _unified(path, old, None) if isinstance(old, str) else None
        if new is None or old is None or old == new:
            # Unreadable, or the announcement was read after the write: nothing sure to show.
            return None
        if isinstance(old, _Absent):
            return _unified(path, None, new)
        return _unified(path, old, new) if not too_costly(old, new) else None

    def created(self, path: str) -> str | None:
        """A diff that creates ``path`` with what it holds now (an added file), or None."""
        if path in self._before:
            self._pop(path)
        new = self._content(path)
        return _unified(path, None, new) if isinstance(new, str) else None

    def _pop(self, path: str) -> _Content:
        old = self._before.pop(path)
        if isinstance(old, str):
            self._chars -= len(old)
        return old

    def _content(self, path: str) -> _Content:
        try:
            return self._read(path)
        except FileNotFoundError:
            return _ABSENT


def too_costly(old: str, new: str) -> bool:
    """True when diffing ``old`` and ``new`` would pass ``MAX_DIFF_WORK``."""
    a, b = old.splitlines(), new.splitlines()
    same, n = 0, min(len(a), len(b))
    while same < n and a[same] == b[same]:
        same += 1
    tail = 0
    while tail < n - same and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    a, b = a[same : len(a) - tail], b[same : len(b) - tail]
    only_a, only_b = Counter(a), Counter(b)
    only_a.subtract(b)
    only_b.subtract(a)
    differing = sum(c for c in only_a.values() if c > 0) + sum(c for c in only_b.values() if c > 0)
    return (len(a) + len(b)) * differing > MAX_DIFF_WORK


def text_diff(path: str, old: str | None, new: str) -> str:
    """A unified diff of ``path`` from ``old`` to ``new`` (``old`` None: a new file). A change too
    costly to diff (``MAX_DIFF_WORK``) is one hunk replacing every line."""
    if old is None or not too_costly(old, new):
        return _unified(path, old, new)
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    lines = [f"--- {path}\n", f"+++ {path}\n", f"@@ -1,{len(a)} +1,{len(b)} @@\n"]
    return _terminated([*lines, *("-" + x for x in a), *("+" + x for x in b)])


def _unified(path: str, old: str | None, new: str | None) -> str:
    """``old`` None: the file is created; ``new`` None: it is deleted."""
    return _terminated(
        difflib.unified_diff(
            (old or "").splitlines(keepends=True),
            (new or "").splitlines(keepends=True),
            fromfile="/dev/null" if old is None else path,
            tofile="/dev/null" if new is None else path,
        )
    )


def _terminated(lines: Iterable[str]) -> str:
    # difflib leaves a last line without newline unterminated; say so as diff(1) does.
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def unified_diff(path: str, hunks: list[dict[str, Any]]) -> str:
    """A unified diff from Claude Code's ``structuredPatch`` (difflib's hunk shape)."""
    out = [f"--- {path}", f"+++ {path}"]
    for h in hunks:
        old_start, old_lines = h.get("oldStart", 0), h.get("oldLines", 0)
        new_start, new_lines = h.get("newStart", 0), h.get("newLines", 0)
        out.append(f"@@ -{old_start},{old_lines} +{new_start},{new_lines} @@")
        out.extend(str(line) for line in h.get("lines") or ())
    return "\n".join(out) + "\n"


def new_file_diff(path: str, content: str) -> str:
    """A unified diff that creates ``path`` with ``content``."""
    lines = content.splitlines()
    out = ["--- /dev/null", f"+++ {path}"]
    if lines:
        out.append(f"@@ -0,0 +1,{len(lines)} @@")
        out.extend("+" + line for line in lines)
        if not content.endswith("\n"):
            out.append("\\ No newline at end of file")
    return "\n".join(out) + "\n"
