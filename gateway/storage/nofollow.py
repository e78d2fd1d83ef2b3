"""Files in directories that the agent can write too: opened, written and removed without following
links, and read only when they are regular files of a bounded size.

Theory of operation
-------------------
The agent runs as the gateway's user, so whatever lies under ``state_dir``, a file store's directory
or the workspace's ``.rawp/uploads`` may have been planted there: a symlink or hard link to a file
outside, a FIFO that blocks whoever opens it, a sparse file of a terabyte. Every operation here
therefore works relative to a directory descriptor opened ``O_DIRECTORY | O_NOFOLLOW`` (the
``*at`` system calls, ``dir_fd=`` in Python), so no path component is looked up twice and none is
a link:

* files are opened ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO does not block the open) and ``fstat``-ed:
  anything but a regular file is refused, and its size is checked against the caller's limit
  *before* a byte is read;
* a file is replaced by writing a new temporary file (``O_CREAT | O_EXCL | O_NOFOLLOW``, so never
  a file someone else made) and renaming it over the name: a link at the name is replaced, never
  written through;
* a directory is removed by ``shutil.rmtree`` relative to its parent's descriptor, which walks by
  descriptors and refuses a top that is a link.

Errors are ``OSError``; ``NotRegular`` and ``TooLarge`` say why a file was refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator, Sequence
from typing import Final

__all__ = [
    "NotRegular",
    "TooLarge",
    "append_fd",
    "create_fd",
    "open_dir",
    "open_dirs",
    "read_file",
    "regular_fd",
    "remove_tree",
    "replace_file",
    "subdirectories",
]

DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND_FLAGS: Final = (
    os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
)
_READ_CHUNK: Final = 1024 * 1024


class NotRegular(OSError):
    """The name is there but is not a regular file (a FIFO, a device, a directory, a socket)."""

    def __init__(self, name: str) -> None:
        super().__init__(errno.EINVAL, "not a regular file", name)


class TooLarge(OSError):
    """The file is larger than the caller reads."""

    def __init__(self, name: str, limit: int) -> None:
        super().__init__(errno.EFBIG, f"larger than {limit} bytes", name)


def open_dir(
    name: str | os.PathLike[str],
    *,
    dir_fd: int | None = None,
    create: bool = False,
    mode: int = 0o700,
) -> int:
    """A descriptor of the directory ``name`` (relative to ``dir_fd``), never through a link at
    ``name`` (``ELOOP``/``ENOTDIR``); made first (``mode``, less the umask) when ``create`` and
    missing."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, mode, dir_fd=dir_fd)
    return os.open(name, DIR_FLAGS, dir_fd=dir_fd)


def open_dirs(fd: int, dirs: Sequence[str]) -> int:
    """A new descriptor of the directory ``dirs`` names below ``fd`` (one name each), never
    through a link on the way (``open_dir`` for each); ``fd`` itself stays open."""
    current = os.dup(fd)
    try:
        for part in dirs:
            inner = open_dir(part, dir_fd=current)
            os.close(current)
            current = inner
    except BaseException:
        os.close(current)
        raise
    return current


def regular_fd(fd: int, name: str) -> os.stat_result:
    """``fstat`` of an opened ``name``; ``NotRegular`` (the descriptor closed) unless a regular
    file."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegular(name)
    return st


def read_file(dir_fd: int, name: str, limit: int) -> bytes:
    """The whole content of the regular file ``name``, refused (``TooLarge``) without reading it
    when its size is over ``limit``; at most ``limit`` bytes are ever read, even if it grows."""
    fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    st = regular_fd(fd, name)
    try:
        if st.st_size > limit:
            raise TooLarge(name, limit)
        parts: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(_READ_CHUNK, left))
            if not chunk:
                break
            parts.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise TooLarge(name, limit)
        return b"".join(parts)
    finally:
        os.close(fd)


def create_fd(dir_fd: int, name: str, mode: int = 0o600) -> int:
    """A new file ``name`` for writing: never one that exists, nor a link (``FileExistsError``)."""
    return os.open(name, _NEW_FLAGS, mode, dir_fd=dir_fd)


def append_fd(dir_fd: int, name: str) -> int:
    """``name`` opened for appending (made 0600 if missing); ``NotRegular`` unless a regular file
    (a FIFO there would otherwise block the open or swallow the writes), ``ELOOP`` if a link."""
    fd = os.open(name, _APPEND_FLAGS, 0o600, dir_fd=dir_fd)
    regular_fd(fd, name)
    return fd


def replace_file(dir_fd: int, name: str, data: bytes, *, fsync: bool, mode: int = 0o600) -> None:
    """Give ``name`` the content ``data`` whole or not at all: a new temporary file beside it,
    then a rename over the name (what was there, a link included, is replaced, not written)."""
    tmp = f".{name}.tmp" if len(name) < 200 else ".replace.tmp"
    try:
        fd = create_fd(dir_fd, tmp, mode)
    except FileExistsError:  # left by a crash, or planted: it is not ours to write through
        os.unlink(tmp, dir_fd=dir_fd)
        fd = create_fd(dir_fd, tmp, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.close(fd)
    try:
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def remove_tree(parent_fd: int, name: str) -> bool:
    """Remove the directory ``name`` of ``parent_fd`` and everything in it, walking by
    descriptors; nothing is removed through a link (a link at ``name`` is refused and left).
    Whether the directory is gone."""
    try:
        st = os.lstat(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return True
    if not stat.S_ISDIR(st.st_mode):
        return False
    shutil.rmtree(name, ignore_errors=True, dir_fd=parent_fd)
    try:
        os.lstat(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return True
    return False


def subdirectories(dir_fd: int) -> Iterator[tuple[str, bool]]:
    """The names in a directory, each with whether it is a directory (a link never is)."""
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            yield entry.name, is_dir
