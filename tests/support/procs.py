"""Processes as /proc shows them: which belong to a session, which are alive, which are gone.

A session's agent and everything it starts carry ``RAWP_SESSION_ID`` in their environment; that is
how the tests find them, whichever gateway (in-process or a ``serve`` process) spawned them.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

DEAD = ("Z", "X")  # a zombie has exited: dead for every test here


def pids() -> Iterator[int]:
    """Every process id /proc lists now."""
    return (int(entry) for entry in os.listdir("/proc") if entry.isdigit())


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (an orphan may wait a while to be reaped)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in DEAD


def gone(pid: int) -> bool:
    """Not even a zombie: exited and reaped."""
    return not os.path.exists(f"/proc/{pid}")


def started(pid: int) -> float | None:
    """When ``pid`` started, in seconds since boot (``since_boot``'s clock), or None if gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # stat field 22, starttime, in ticks


def since_boot() -> float:
    """Now, on the clock ``started`` reads."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def cmdline(pid: int) -> str:
    """The command line joined by spaces ("" once the process is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def session_processes(session_id: str, marker: str = "") -> list[int]:
    """Live processes whose environment carries ``RAWP_SESSION_ID=<session_id>`` and whose
    command line holds ``marker``."""
    wanted = f"RAWP_SESSION_ID={session_id}".encode()
    found = []
    for pid in pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if wanted in environ and marker in cmdline(pid) and alive(pid):
            found.append(pid)
    return found


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, by parent pid."""
    children: dict[int, list[int]] = {}
    for child in pids():
        fields = _stat_fields(child)
        if fields is not None and fields[0] not in DEAD:
            children.setdefault(int(fields[1]), []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def group_alive(pgid: int) -> bool:
    """True while the process group has a member (a zombie leader counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - not ours, but there
        return True
    return True


async def reap(proc: asyncio.subprocess.Process, grace: float = 10.0) -> None:
    """Wait for ``proc`` (told to end already) at most ``grace`` seconds, then SIGKILL it: a
    helper process never outlives its test."""
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        proc.kill()
        await proc.wait()
