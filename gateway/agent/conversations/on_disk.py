"""Saved conversations read from the agent's own files: listed for a workspace, one loaded to
resume, without following links and within bounds.

Theory of operation
-------------------
What an agent's store looks like is its parser's business (``ParserSpec.saved``, a
``parsers.saved.SavedFormat``: where, which names, what the bytes say). This module is the I/O
around it, and where the bounds are kept (docs/limits.md):

* **Where.** The agent's environment is the gateway's own with the profile's ``env`` over it, so
  the agent's ``HOME`` (and ``CLAUDE_CONFIG_DIR``, ``CODEX_HOME``) is the gateway's unless the
  profile sets it. Each directory the format names is resolved once and must stay inside the
  agent's own directory (a ``projects/<slug>`` that is a link to elsewhere is not followed);
  below it nothing is followed at all: subdirectories and files are opened with ``O_NOFOLLOW``
  relative to their parent, files only when they are regular files (looked at before they are
  opened, and again once open, with ``O_NONBLOCK`` so a FIFO swapped in between never blocks).
* **How much.** A listing looks at no more than ``MAX_ENTRIES`` directory entries, reads a
  conversation file whole up to ``LIST_FILE_BYTES`` (else its first and last ``LIST_EDGE_BYTES``,
  and its turn count is then unknown), and no more than ``LIST_TOTAL_BYTES`` in all; a listing cut
  by any bound says ``complete: false``. A file larger than ``LIST_EDGE_BYTES`` whose first bytes
  show it is another workspace's (``SavedFormat.belongs``; Codex keeps every workspace's threads in
  one tree) is read no further. A conversation loaded to resume is read whole up to
  ``TRANSCRIPT_BYTES``, else its last ``TRANSCRIPT_BYTES`` (its history is then marked partial).
* **Off the loop.** Reading and translating run in a worker thread (they are pure but for the
  reads); the session machine then turns the translated turns into frames on the loop.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from gateway.agent.conversations.common import ConversationError, saved_format
from gateway.agent.environment import agent_environment
from gateway.agent.profiles import AgentProfile
from gateway.storage.nofollow import READ_FLAGS, open_dir, open_dirs, regular_fd
from parsers.saved import SavedFile, SavedFormat, Summary, Transcript

_T = TypeVar("_T")

__all__ = [
    "LIST_EDGE_BYTES",
    "LIST_FILE_BYTES",
    "LIST_TOTAL_BYTES",
    "MAX_ENTRIES",
    "TRANSCRIPT_BYTES",
    "list_saved",
    "load_saved",
]

MAX_ENTRIES: Final = 20_000  # directory entries looked at for one listing or lookup
LIST_FILE_BYTES: Final = 1 << 20  # read whole for a listing up to this size
LIST_EDGE_BYTES: Final = 64 << 10  # else its first and last this many bytes
LIST_TOTAL_BYTES: Final = 32 << 20  # read for one listing, at most
TRANSCRIPT_BYTES: Final = 16 << 20  # of one conversation loaded to resume (its end, if larger)


async def _in_worker(
    profile: AgentProfile, read: Callable[..., _T], workspace: str, *args: Any, home: str | None
) -> _T:
    """``read(fmt, env, workspace, *args)`` of the profile's store, in a worker thread: it walks
    directories and reads files, which would block the event loop. ``home``: the HOME of a
    sandboxed session's agent, instead of the gateway's."""
    fmt = saved_format(profile)
    env = agent_environment(profile.env)
    if home is not None:
        env["HOME"] = home
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, read, fmt, env, workspace, *args)


@dataclass(slots=True)
class _Candidate:
    directory: str  # resolved, inside the agent's own directory
    parts: tuple[str, ...]  # subdirectories below it, then the file's name
    mtime: float
    size: int

    @property
    def name(self) -> str:
        return self.parts[-1]


# --- listing -----------------------------------------------------------------------------------


async def list_saved(
    profile: AgentProfile, workspace: str, limit: int, home: str | None = None
) -> dict[str, Any]:
    """``{"conversations": [...], "complete": bool}`` of the files the profile's store holds for
    the workspace, newest first (``home``: in that HOME)."""
    return await _in_worker(profile, _list, workspace, limit, home=home)


def _list(fmt: SavedFormat, env: Mapping[str, str], workspace: str, limit: int) -> dict[str, Any]:
    candidates, complete = _candidates(fmt, env, workspace)
    candidates.sort(key=lambda c: c.mtime, reverse=True)
    listed: list[Summary] = []
    budget = LIST_TOTAL_BYTES
    for candidate in candidates:
        if len(listed) >= limit or budget <= 0:
            complete = False
            break
        saved = _read(
            candidate,
            whole_up_to=LIST_FILE_BYTES,
            edge=LIST_EDGE_BYTES,
            belongs=lambda head: fmt.belongs(head, workspace),
        )
        if saved is None:  # unreadable, or another workspace's: its first bytes at most were read
            budget -= min(candidate.size, LIST_EDGE_BYTES)
            continue
        budget -= len(saved.head) + len(saved.tail)
        summary = fmt.summary(saved, workspace)
        if summary is not None:
            listed.append(summary)
    conversations = [
        {"id": s.id, "title": s.title, "updated_at": s.updated_at, "turns": s.turns} for s in listed
    ]
    return {"conversations": conversations, "complete": complete}


# --- loading one to resume ---------------------------------------------------------------------


async def load_saved(
    profile: AgentProfile, workspace: str, conversation_id: str, home: str | None = None
) -> Transcript:
    """The saved conversation ``conversation_id`` of the workspace, translated; 404
    ``CONVERSATION_NOT_FOUND`` when the store holds none of that id for this workspace."""
    transcript = await _in_worker(profile, _load, workspace, conversation_id, home=home)
    if transcript is None:
        raise ConversationError(
            404,
            "CONVERSATION_NOT_FOUND",
            f"agent {profile.name!r} has no saved conversation {conversation_id!r} for this "
            "workspace",
        )
    return transcript


def _load(
    fmt: SavedFormat, env: Mapping[str, str], workspace: str, conversation_id: str
) -> Transcript | None:
    name = fmt.file_name(conversation_id)
    candidates, _ = _candidates(fmt, env, workspace, only=name)
    for candidate in candidates:
        if not fmt.may_hold(candidate.name, conversation_id):
            continue
        saved = _read(candidate, whole_up_to=TRANSCRIPT_BYTES, edge=0)
        if saved is None:
            continue
        transcript = fmt.transcript(saved, workspace, conversation_id)
        if transcript is not None:
            return transcript
    return None


# --- the file system, carefully -------------------------------------------------------------------


def _candidates(
    fmt: SavedFormat, env: Mapping[str, str], workspace: str, only: str | None = None
) -> tuple[list[_Candidate], bool]:
    """The regular files of the workspace's locations whose names are conversations (``only``:
    that name alone, in the top directory), and whether every entry was looked at."""
    found: list[_Candidate] = []
    seen = 0
    complete = True
    for location in fmt.locations(env, workspace):
        directory = _inside(location.directory, location.root)
        if directory is None:
            continue
        try:
            fd = open_dir(directory)
        except OSError:
            continue
        try:
            if only is not None:
                candidate = _regular(fd, directory, (only,))
                if candidate is not None:
                    found.append(candidate)
                continue
            stack: list[tuple[int, tuple[str, ...]]] = [(os.dup(fd), ())]
            while stack:
                dir_fd, parts = stack.pop()
                try:
                    with os.scandir(dir_fd) as entries:
                        for entry in entries:
                            seen += 1
                            if seen > MAX_ENTRIES:
                                complete = False
                                break
                            if len(parts) < location.depth:
                                try:
                                    inner = open_dir(entry.name, dir_fd=dir_fd)
                                except OSError:
                                    continue  # not a directory, or a link to one
                                stack.append((inner, (*parts, entry.name)))
                            elif fmt.is_conversation(entry.name):
                                candidate = _regular(fd, directory, (*parts, entry.name))
                                if candidate is not None:
                                    found.append(candidate)
                except OSError:
                    pass
                finally:
                    os.close(dir_fd)
                if not complete:
                    for rest, _ in stack:
                        os.close(rest)
                    break
        finally:
            os.close(fd)
    return found, complete


def _inside(directory: str, root: str | None) -> str | None:
    """``directory`` resolved, when it lies inside ``root`` (resolved too)."""
    try:
        real = os.path.realpath(directory)
        if root is None:
            return real
        real_root = os.path.realpath(root)
    except (OSError, ValueError):
        return None
    if real != real_root and os.path.commonpath((real_root, real)) != real_root:
        return None
    return real


def _regular(fd: int, directory: str, parts: tuple[str, ...]) -> _Candidate | None:
    """The file at ``parts`` below ``fd`` when it is a regular file (not a link, FIFO, ...)."""
    try:
        parent = open_dirs(fd, parts[:-1])
    except OSError:
        return None
    try:
        info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
    except (OSError, ValueError):
        return None
    finally:
        os.close(parent)
    if not stat.S_ISREG(info.st_mode):
        return None
    return _Candidate(directory, parts, info.st_mtime, info.st_size)


def _read(
    candidate: _Candidate,
    *,
    whole_up_to: int,
    edge: int,
    belongs: Callable[[bytes], bool] | None = None,
) -> SavedFile | None:
    """The file's bytes: whole up to ``whole_up_to``; else its first and last ``edge`` bytes, or
    (``edge`` 0) its last ``whole_up_to`` bytes. None when it cannot be opened as a regular file,
    or when its first ``edge`` bytes are not what ``belongs`` wants (nothing more is read)."""
    try:
        dir_fd = open_dir(candidate.directory)
    except OSError:
        return None
    try:
        parent = open_dirs(dir_fd, candidate.parts[:-1])
        try:
            file = os.open(candidate.name, READ_FLAGS, dir_fd=parent)
        finally:
            os.close(parent)
        info = regular_fd(file, candidate.name)  # closed, and NotRegular, unless a regular file
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    try:
        size = info.st_size
        if belongs is not None and size > edge and not belongs(_pread(file, edge, 0)):
            return None
        if size <= whole_up_to:
            data = _pread(file, size + 1, 0)  # one more: a file that grew is read as far as allowed
            if len(data) <= whole_up_to:
                return SavedFile(candidate.name, data, whole=True, mtime=info.st_mtime)
            size = len(data)
        if edge:
            head = _pread(file, edge, 0)
            tail = _pread(file, edge, max(0, size - edge))
            return SavedFile(candidate.name, head, tail, whole=False, mtime=info.st_mtime)
        tail = _pread(file, whole_up_to, max(0, size - whole_up_to))
        return SavedFile(candidate.name, b"", tail, whole=False, mtime=info.st_mtime)
    except OSError:
        return None
    finally:
        os.close(file)


def _pread(fd: int, size: int, offset: int) -> bytes:
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.pread(fd, min(size, 1 << 20), offset)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)
