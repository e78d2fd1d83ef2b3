"""What an agent leaves running: the registry of the process groups that may still have members,
and the descendants that left their agent's group, found in /proc (Linux) and reaped by the gateway
as their subreaper. `AgentProcess` registers itself here and signals its group and descendants
through it.

No agent may outlive the gateway: every group that may still have members is kept in a module-level
registry. The server's shutdown awaits `terminate_all()`; an `atexit` hook SIGKILLs whatever is left
when the interpreter exits some other way. (A SIGKILLed gateway runs no code at all; then the agent
sees EOF on stdin and Claude Code exits by itself, but its grandchildren may survive; a gateway
that restores its sessions kills them with `kill_left_behind()`.)
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Collection
from typing import Final, NamedTuple, Protocol

__all__ = [
    "DEFAULT_GRACE_SEC",
    "Proc",
    "adopted",
    "all_processes",
    "become_subreaper",
    "kill_all_groups",
    "kill_left_behind",
    "killpg",
    "live_groups",
    "live_process_groups",
    "running_pids",
    "schedule_reaps",
    "session_id_of",
    "signal_pids",
    "subtree",
    "terminate_all",
]

DEFAULT_GRACE_SEC: Final = 5.0


class _Group(Protocol):
    """What the registry asks of a registered agent (an `AgentProcess`)."""

    @property
    def returncode(self) -> int | None: ...

    async def terminate(self, grace: float = ...) -> object: ...

    def _signal_all(self, sig: int, procs: dict[int, Proc] | None = None) -> bool: ...


# --------------------------------------------------------------------------- group registry

# pgid -> process; groups that may still have members. Kept at module level so that shutdown and
# atexit can reach every agent no matter which session owns it.
live_process_groups: dict[int, _Group] = {}


def live_groups() -> list[int]:
    """Process-group ids the gateway may still have to kill (for tests and diagnostics)."""
    return list(live_process_groups)


def killpg(pgid: int, sig: int) -> bool:
    """Signal a group; False when it has no members any more."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        # A member changed credentials (setuid helper); the rest of the group was still signalled.
        return True
    return True


def kill_all_groups(sig: int = signal.SIGKILL) -> None:
    """Send `sig` to every registered group and every descendant that left one, now,
    synchronously. The last resort (atexit)."""
    procs = all_processes()
    for pgid, owner in list(live_process_groups.items()):
        owner._signal_all(sig, procs)
        if sig == signal.SIGKILL:
            live_process_groups.pop(pgid, None)
    # Orphans of agents already forgotten (adopted by the gateway as their subreaper).
    signal_pids(_adopted_from_agents(procs), sig, procs)
    _reap(procs)


async def terminate_all(grace: float = DEFAULT_GRACE_SEC) -> None:
    """Terminate every live agent concurrently (DPS-17.2.3); for the server's shutdown."""
    procs = [p for p in live_process_groups.values() if p.returncode is None]
    if procs:
        await asyncio.gather(*(p.terminate(grace) for p in procs), return_exceptions=True)
    # Stragglers in groups whose leader is gone are killed now rather than at their own deadline:
    # shutdown does not wait for them.
    kill_all_groups(signal.SIGKILL)


def kill_left_behind(session_ids: Collection[str]) -> int:
    """SIGKILL what the agents of these sessions left running under an earlier gateway that was
    itself killed (SIGKILL, OOM: no shutdown ran, and an agent that ignores its closed stdin goes
    on): every process carrying one of their ``RAWP_SESSION_ID``s, and its subtree. For a gateway
    that restores those sessions, so that the next prompt's agent does not run beside the old one
    in the same workspace. Linux (``/proc``); returns how many processes were signalled."""
    wanted = set(session_ids)
    if not wanted:
        return 0
    procs = all_processes()
    me = os.getpid()
    roots = {p.pid for p in procs.values() if p.pid != me and session_id_of(p.pid) in wanted}
    found = subtree(roots, procs) - {me} if roots else set()
    # No procs: they are init's children since their gateway died, not ours to reap.
    signal_pids(found, signal.SIGKILL)
    return len(found)


# --------------------------------------------------------------------------- descendants (Linux)
#
# A descendant may leave the agent's process group and session (setsid(), as Gemini CLI does for
# its shell tool, or a daemon's double fork); signals to the group miss it then. The gateway makes
# itself a child subreaper, so such orphans are re-parented to the gateway instead of init and stay
# in its process tree; /proc tells who they are: members of the agent's group or session, the
# agent's subtree, and orphans adopted by the gateway that carry the agent's RAWP_SESSION_ID (or
# that an earlier look saw under the agent). Elsewhere than Linux only the group is signalled.

_PR_SET_CHILD_SUBREAPER: Final = 36
_subreaper_tried = False
# pid -> start time of processes the gateway signalled that may become its zombies to reap.
_to_reap: dict[int, int] = {}
# Agents whose exit the event loop has not reported yet (registered or not): never adopted orphans,
# never reaped here (their exit status is the loop's child watcher's).
running_pids: set[int] = set()


class Proc(NamedTuple):
    pid: int
    ppid: int
    pgrp: int
    sid: int
    start: int  # clock ticks since boot: tells a recycled pid apart
    zombie: bool


def become_subreaper() -> None:
    global _subreaper_tried
    if _subreaper_tried or not sys.platform.startswith("linux"):
        return
    _subreaper_tried = True
    # Without prctl only the group is signalled.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _stat(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields follow its last ")".
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return Proc(
            pid, int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]), fields[0] in b"ZX"
        )
    except (IndexError, ValueError):
        return None


def all_processes() -> dict[int, Proc]:
    """Every process of the machine, from /proc (empty where there is none)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    procs = {}
    for name in names:
        if name.isdigit() and (p := _stat(int(name))) is not None:
            procs[p.pid] = p
    return procs


def session_id_of(pid: int) -> str | None:
    """The RAWP_SESSION_ID a process inherited, if its environment is readable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return None
    for item in env.split(b"\0"):
        if item.startswith(b"RAWP_SESSION_ID="):
            return item[16:].decode(errors="replace")
    return None


def subtree(roots: set[int], procs: dict[int, Proc]) -> set[int]:
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, ())
    return found


def adopted(procs: dict[int, Proc]) -> list[Proc]:
    """Children of the gateway that it did not start: orphans of agents' descendants."""
    me = os.getpid()
    return [
        p
        for p in procs.values()
        if p.ppid == me and p.pid not in live_process_groups and p.pid not in running_pids
    ]


def _adopted_from_agents(procs: dict[int, Proc]) -> set[int]:
    # An adopted orphan carrying a session id came from an agent; not the gateway's own id, which
    # it has when it runs under another gateway and passes on to what else it starts.
    own = os.environ.get("RAWP_SESSION_ID")
    roots = {p.pid for p in adopted(procs) if session_id_of(p.pid) not in (None, own)}
    return subtree(roots, procs) if roots else set()


def signal_pids(pids: set[int], sig: int, procs: dict[int, Proc] | None = None) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:  # gone already, or not ours to signal
            continue
        if procs is not None and pid in procs:
            _to_reap[pid] = procs[pid].start


def _reap(procs: dict[int, Proc] | None = None) -> None:
    """Collect signalled orphans that died as the gateway's children (it is their subreaper). Only
    pids the gateway signalled and that are still the same processes: never an agent, whose exit
    status belongs to the event loop's child watcher."""
    if not _to_reap:
        return
    me = os.getpid()
    for pid, start in list(_to_reap.items()):
        p = procs.get(pid) if procs is not None else _stat(pid)
        if p is None or p.start != start or pid in live_process_groups or pid in running_pids:
            del _to_reap[pid]
        elif p.ppid == me and p.zombie:
            del _to_reap[pid]
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def schedule_reaps(loop: asyncio.AbstractEventLoop) -> None:
    # Signalled processes die a moment later; collect them then.
    if loop.is_closed():  # atexit
        return
    for delay in (0.1, 1.0, 5.0):
        loop.call_later(delay, _reap)


atexit.register(kill_all_groups)
