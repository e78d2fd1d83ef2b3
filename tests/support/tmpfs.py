"""A small real file system for a test (``tmpfs``, mounted by root), and a ballast that fills it:
what a full state disk looks like, without filling the machine's."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

PAGE = 4096


@contextlib.contextmanager
def small_tmpfs(where: Path, size_bytes: int) -> Iterator[Path]:
    """A ``tmpfs`` of ``size_bytes`` mounted at ``where`` (made), unmounted afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(where)],
        check=True,
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def fill(path: Path, *, leave: int = 0) -> int:
    """Write ``path`` until its file system is full (ENOSPC), then give back ``leave`` bytes
    (whole pages); the bytes the ballast holds."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    size = 0
    try:
        for chunk in (b"\0" * (64 * PAGE), b"\0" * PAGE):
            while True:
                try:
                    size += os.write(fd, chunk)
                except OSError as err:
                    assert err.errno == errno.ENOSPC, err
                    break
        if leave:
            size -= -(-leave // PAGE) * PAGE
            os.ftruncate(fd, size)
    finally:
        os.close(fd)
    return size


def free_bytes(where: Path) -> int:
    st = os.statvfs(where)
    return st.f_bavail * st.f_frsize
