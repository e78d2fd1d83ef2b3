"""The agent process: spawn, stdout lines, stdin, stderr tail, signals, exit status (§17, §18).

Theory of operation
-------------------
`AgentProcess.start()` launches the agent CLI from an argv list (never through a shell) with
`loop.subprocess_exec`, in a new session so that the agent and everything it starts (Bash tool
commands, MCP servers, subagents) share one process group whose id is the agent's pid. Every signal
the gateway sends goes to that group (`os.killpg`), so a SIGTERM or SIGKILL also reaches the
grandchildren. The three `RAWP_*` variables of DPS-17.2.1 are added to the environment. The agent
gets exactly fds 0, 1 and 2 (uvloop needs help there, see `start`): no descendant can hold the
agent's pipes through a descriptor it did not know it had.

Descendants that leave the group (setsid(), as Gemini CLI's shell tool does, or a daemon's double
fork) are found too: the gateway is a child subreaper (Linux), so they stay in its process tree, and
/proc says which came from which agent (see "descendants" below). Terminating an agent signals them
with its group.

The pipes are driven by a `SubprocessProtocol` of our own instead of `asyncio.StreamReader`:

* stdout is split on b"\\n" as chunks arrive. A partial line is kept as a list of chunks and joined
  once, so a line costs memory proportional to its own size and nothing else, up to `max_line_bytes`
  (32 MiB by default). A longer line is cut as it streams, never held whole: its first
  `CUT_HEAD_BYTES` are kept, the rest is counted and dropped chunk by chunk, and at its b"\\n" it is
  queued as a `StdoutLine` whose `cut` is its full size (the session turns it into a warning for the
  masters; never fatal). The 64 KiB default limit of `StreamReader.readline` would raise on Claude
  Code's large lines (a Read of a big file, an image block) and kill the session.
* Each complete line is queued with the `time.perf_counter_ns()` of the chunk that completed it, for
  latency metrics.
* Backpressure is on *complete* lines: when the queued lines exceed `high_water` bytes the stdout pipe
  is paused, and resumed below `high_water // 4`. A partial line never pauses reading (that would
  deadlock on a line longer than the mark). `StreamReader` ties its pause threshold to its line
  limit (it pauses at 2 * limit), so a huge limit there means no backpressure at all.
  `bench/bench_process_lines.py` measures the two readers.
* stderr is drained continuously into a ring of the last `stderr_limit` bytes (`stderr_tail()`),
  for `agent.error.details`; a chatty stderr can never fill the pipe and stall the agent.
* stdin: `write()` + `await drain()` with the transport's flow control, `close_stdin()`. What the
  agent has not read yet waits in the transport (`stdin_backlog`); `write(data, limit=N)` refuses
  (`AgentStdinFull`, nothing written) a write that would take it past N bytes, so an agent that
  never reads stdin cannot make the gateway grow.

Exit statuses are classified by the pure `classify_exit()` (DPS-17.2.2), usable by the sans-IO core:
0 is "ok", 1-127 "error", a negative return code (killed by signal N) or 128+N "signal".

The agent's exit is seen when the agent itself exits, not at stdout EOF: its exit status is
reported at once, what it left behind gets SIGTERM, and SIGKILL when the grace ends; stdout (and
stderr) are read on until EOF or for `EXIT_DRAIN_S` at most (up to five times that while the
consumer is behind and reading is paused: the pipe then holds the agent's own output), then closed,
so a descendant still holding the pipe cannot keep the consumer waiting. Lines already read are
still handed out.

`terminate(grace)` follows DPS-17.2.3: SIGTERM to the group and the descendants, SIGKILL to them
when the agent has not exited after `grace` seconds. If the agent exits in time but descendants
linger, they get SIGKILL when the grace period ends (a timer, so `terminate` returns as soon as the
agent itself is gone), and its output is not read past that deadline.

`readlines()` hands over every queued line per await (one coroutine round trip per burst).
`deliver(consumer)` hands the same batches to a plain function instead, called from the pipe's own
callback as the lines are read: no task wake-up, coroutine or future per batch, which at a few
lines a second per session is most of what a line costs apart from its own work (and young objects
that every collection of the garbage collector would walk). At high
line rates it also gathers lines: an agent like Claude Code writes each line on its own, and each
line read alone is a wake-up of the event loop (a pipe read, the consumer's turn, a socket write per
master) costing several times the line's own work. When lines come faster than one per
`NAP_BELOW_GAP_NS` (smoothed over recent batches) and the batches are small, stdout is left unread
for `NAP_S` after each batch (a `FineTimer`: uvloop's timers count whole milliseconds), so the lines
of that half millisecond are read, mapped and sent together. No line waits longer than that; at
1,000 lines/s nothing waits.
`close()` / `aclose()` drop an agent without reading it to the end (SIGKILL to the group, then the
pipes are released). Otherwise the transport is closed by itself once the agent has exited and its output is
drained.

No agent may outlive the gateway: every group that may still have members is kept in a module-level
registry. The server's shutdown awaits `terminate_all()`; an `atexit` hook SIGKILLs whatever is left
when the interpreter exits some other way. (A SIGKILLed gateway runs no code at all; then the agent
sees EOF on stdin and Claude Code exits by itself, but its grandchildren may survive.)
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import errno
import os
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple, cast

from gateway.agent.fine_timer import FineTimer

__all__ = [
    "RAWP_DPS_VERSION",
    "AgentExecutableNotFound",
    "AgentProcess",
    "AgentProcessError",
    "AgentStartError",
    "AgentStdinFull",
    "ExitKind",
    "ExitStatus",
    "StdoutLine",
    "classify_exit",
    "kill_all_groups",
    "kill_left_behind",
    "live_groups",
    "missing_executable",
    "terminate_all",
]

RAWP_DPS_VERSION: Final = "rawp-dps-1.0"
DEFAULT_GRACE_S: Final = 5.0
DEFAULT_HIGH_WATER: Final = 4 * 1024 * 1024
DEFAULT_MAX_LINE_BYTES: Final = 32 * 1024 * 1024
CUT_HEAD_BYTES: Final = 1024  # what is kept of a line over the limit, for the diagnostic
DEFAULT_STDERR_LIMIT: Final = 64 * 1024
# After the agent exits, what is left on its stdout is read for at most this long: its own output is
# already in the pipe; only a descendant still holding the pipe open could make it longer.
EXIT_DRAIN_S: Final = 2.0
# Gathering lines at high rates (see the module docstring): when the time between lines, smoothed
# over the recent batches, is under NAP_BELOW_GAP_NS and a batch holds fewer than NAP_MAX_BATCH
# lines, stdout is not read for NAP_S after it, so that the next batch brings several lines for one
# wake-up. The smoothing keeps one pair of close lines at a moderate rate from making anyone wait.
NAP_S: Final = 0.0005
NAP_BELOW_GAP_NS: Final = 250_000  # i.e. above 4,000 lines/s
NAP_MAX_BATCH: Final = 32  # a batch this big (a burst) already shares its wake-up
_GAP_CAP_NS: Final = 10_000_000  # an idle pause counts as this much: the rate is found again soon
_STDOUT_FD: Final = 1
_STDERR_FD: Final = 2
_STDIN_FD: Final = 0

ExitKind = Literal["ok", "error", "signal"]


# --------------------------------------------------------------------------- exit status (pure)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExitStatus:
    """How an agent process ended, classified per DPS-17.2.2.

    `returncode` is as reported by the OS layer: negative -N when killed by signal N, else the exit
    code. `signal` is N for both "killed by N" and "exited with 128+N" (a shell or a runtime that
    re-raises as an exit code), else None.
    """

    returncode: int
    signal: int | None
    kind: ExitKind

    @property
    def signal_name(self) -> str | None:
        """`"SIGTERM"` and so on, or None when no signal was involved or the number is unknown."""
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return None

    def describe(self) -> str:
        """A short human sentence for `agent.error.message`."""
        if self.kind == "ok":
            return "agent exited normally (code 0)"
        if self.kind == "signal":
            name = self.signal_name or f"signal {self.signal}"
            if self.returncode < 0:
                return f"agent was killed by {name}"
            return f"agent exited with code {self.returncode} ({name})"
        return f"agent exited with code {self.returncode}"


def classify_exit(returncode: int) -> ExitStatus:
    """Classify a return code per DPS-17.2.2. Pure; the sans-IO core calls it too.

    0 -> ok; 1-127 -> error; -N (killed by signal N) or 128+N for a real signal number N -> signal.
    Codes above 128 that are not 128 + a signal number (128 itself, 255) are plain errors.
    """
    if returncode == 0:
        return ExitStatus(returncode=0, signal=None, kind="ok")
    if returncode < 0:
        return ExitStatus(returncode=returncode, signal=-returncode, kind="signal")
    if 128 < returncode < 128 + signal.NSIG:
        return ExitStatus(returncode=returncode, signal=returncode - 128, kind="signal")
    return ExitStatus(returncode=returncode, signal=None, kind="error")


# --------------------------------------------------------------------------- errors and values


class AgentProcessError(Exception):
    """Base class of the errors this module raises."""


class AgentStdinFull(AgentProcessError):
    """The agent has left too much of its input unread: the write was refused."""


class AgentStartError(AgentProcessError):
    """The agent could not be started (bad cwd, not executable, ...)."""


class AgentExecutableNotFound(AgentStartError, FileNotFoundError):
    """argv[0] does not name an executable file (the agent CLI is not installed or not on PATH)."""

    def __init__(self, program: str) -> None:
        super().__init__(
            errno.ENOENT,
            f"agent executable not found: {program!r} (not installed, or not on PATH)",
            program,
        )

    def __str__(self) -> str:
        # The message names the file already; OSError's own form would add "[Errno 2]" and the
        # file name a second time.
        return self.strerror or super().__str__()


def missing_executable(program: str, env: Mapping[str, str]) -> AgentExecutableNotFound | None:
    """Why ``program`` cannot be started, told before anything is created: a name that is not on
    ``env``'s PATH, or an absolute path that is not an executable file. A relative path with a
    ``/`` is the workspace's (the agent's cwd): that is left to the start itself."""
    if "{" in program or (os.sep in program and not os.path.isabs(program)):
        return None  # a template, filled in per session, or relative to the workspace
    if os.sep in program:
        found = os.path.isfile(program) and os.access(program, os.X_OK)
    else:
        found = shutil.which(program, path=env.get("PATH", os.defpath)) is not None
    return None if found else AgentExecutableNotFound(program)


class StdoutLine(NamedTuple):
    """One stdout line without its b"\\n", and the perf_counter_ns() when it was read.

    A line over `max_line_bytes` is not kept: `line` is its first `CUT_HEAD_BYTES` and `cut` its
    full size in bytes (0 for every line that is whole).
    """

    line: bytes
    t_ns: int
    cut: int = 0


# --------------------------------------------------------------------------- group registry

# pgid -> process; groups that may still have members. Kept at module level so that shutdown and
# atexit can reach every agent no matter which session owns it.
_live_groups: dict[int, AgentProcess] = {}


def live_groups() -> list[int]:
    """Process-group ids the gateway may still have to kill (for tests and diagnostics)."""
    return list(_live_groups)


def _killpg(pgid: int, sig: int) -> bool:
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
    procs = _processes()
    for pgid, owner in list(_live_groups.items()):
        owner._signal_all(sig, procs)
        if sig == signal.SIGKILL:
            _live_groups.pop(pgid, None)
    # Orphans of agents already forgotten (adopted by the gateway as their subreaper).
    _signal_pids(_adopted_from_agents(procs), sig, procs)
    _reap(procs)


async def terminate_all(grace: float = DEFAULT_GRACE_S) -> None:
    """Terminate every live agent concurrently (DPS-17.2.3); for the server's shutdown."""
    procs = [p for p in _live_groups.values() if p.returncode is None]
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
    procs = _processes()
    me = os.getpid()
    roots = {p.pid for p in procs.values() if p.pid != me and _session_id_of(p.pid) in wanted}
    found = _subtree(roots, procs) - {me} if roots else set()
    # No procs: they are init's children since their gateway died, not ours to reap.
    _signal_pids(found, signal.SIGKILL)
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
_running: set[int] = set()


class _Proc(NamedTuple):
    pid: int
    ppid: int
    pgrp: int
    sid: int
    start: int  # clock ticks since boot: tells a recycled pid apart
    zombie: bool


def _become_subreaper() -> None:
    global _subreaper_tried
    if _subreaper_tried or not sys.platform.startswith("linux"):
        return
    _subreaper_tried = True
    # Without prctl only the group is signalled.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _stat(pid: int) -> _Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields follow its last ")".
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return _Proc(
            pid, int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]), fields[0] in b"ZX"
        )
    except (IndexError, ValueError):
        return None


def _processes() -> dict[int, _Proc]:
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


def _session_id_of(pid: int) -> str | None:
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


def _subtree(roots: set[int], procs: dict[int, _Proc]) -> set[int]:
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


def _adopted(procs: dict[int, _Proc]) -> list[_Proc]:
    """Children of the gateway that it did not start: orphans of agents' descendants."""
    me = os.getpid()
    return [
        p
        for p in procs.values()
        if p.ppid == me and p.pid not in _live_groups and p.pid not in _running
    ]


def _adopted_from_agents(procs: dict[int, _Proc]) -> set[int]:
    # An adopted orphan carrying a session id came from an agent; not the gateway's own id, which
    # it has when it runs under another gateway and passes on to what else it starts.
    own = os.environ.get("RAWP_SESSION_ID")
    roots = {p.pid for p in _adopted(procs) if _session_id_of(p.pid) not in (None, own)}
    return _subtree(roots, procs) if roots else set()


def _signal_pids(pids: set[int], sig: int, procs: dict[int, _Proc] | None = None) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:  # gone already, or not ours to signal
            continue
        if procs is not None and pid in procs:
            _to_reap[pid] = procs[pid].start


def _reap(procs: dict[int, _Proc] | None = None) -> None:
    """Collect signalled orphans that died as the gateway's children (it is their subreaper). Only
    pids the gateway signalled and that are still the same processes: never an agent, whose exit
    status belongs to the event loop's child watcher."""
    if not _to_reap:
        return
    me = os.getpid()
    for pid, start in list(_to_reap.items()):
        p = procs.get(pid) if procs is not None else _stat(pid)
        if p is None or p.start != start or pid in _live_groups or pid in _running:
            del _to_reap[pid]
        elif p.ppid == me and p.zombie:
            del _to_reap[pid]
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _cloexec_above_2() -> None:
    """In the child between fork and exec: every fd but 0, 1 and 2 closes at exec. (Closing them
    here would be too early: uvloop moves the stdio pipes onto 0-2 after this runs.)"""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, os.sysconf("SC_OPEN_MAX")))
    for fd in fds:
        if fd > 2:
            with contextlib.suppress(OSError):
                os.set_inheritable(fd, False)


def _schedule_reaps(loop: asyncio.AbstractEventLoop) -> None:
    # Signalled processes die a moment later; collect them then.
    if loop.is_closed():  # atexit
        return
    for delay in (0.1, 1.0, 5.0):
        loop.call_later(delay, _reap)


atexit.register(kill_all_groups)


# --------------------------------------------------------------------------- the protocol


class _Protocol(asyncio.SubprocessProtocol):
    """Forwards transport callbacks to the AgentProcess; keeps the public class free of them."""

    __slots__ = ("_owner",)

    def __init__(self, owner: AgentProcess) -> None:
        self._owner = owner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Called before any data or exit callback, possibly before subprocess_exec() returns to
        # start(): the owner needs its transport and pid from here on.
        # uvloop's transport does not subclass asyncio.SubprocessTransport, but has its methods.
        self._owner._on_connected(cast(asyncio.SubprocessTransport, transport))

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == _STDOUT_FD:
            self._owner._on_stdout(data)
        elif fd == _STDERR_FD:
            self._owner._on_stderr(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == _STDOUT_FD:
            self._owner._on_stdout_eof()
        elif fd == _STDERR_FD:
            self._owner._on_stderr_eof()
        elif fd == _STDIN_FD:
            self._owner._on_stdin_lost(exc)

    def process_exited(self) -> None:
        self._owner._on_exit()

    def pause_writing(self) -> None:
        self._owner._stdin_paused = True

    def resume_writing(self) -> None:
        self._owner._on_stdin_resume()


# --------------------------------------------------------------------------- AgentProcess


class AgentProcess:
    """One agent child process in its own process group. Create with `await AgentProcess.start()`."""

    # Private state, declared up front (as aiohttp's own web_ws does).
    _loop: asyncio.AbstractEventLoop
    _transport: asyncio.SubprocessTransport
    _pid: int
    _argv: tuple[str, ...]
    _high_water: int
    _low_water: int
    _max_line_bytes: int
    _lines: deque[StdoutLine]
    _queued_bytes: int
    _partial: list[bytes]
    _partial_len: int
    _cut_head: bytes
    _cut_len: int
    _stdout_eof: bool
    _stdout_paused: bool  # by backpressure: the consumer is behind
    _napping: bool  # stdout left unread for NAP_S to gather lines
    _nap_timer: FineTimer | None
    _last_batch_ns: int
    _line_gap_ns: float  # between lines, smoothed over the batches handed out
    _line_waiter: asyncio.Future[None] | None
    _consumer: Callable[[list[StdoutLine]], object] | None  # deliver()'s, while it runs
    _batch_max: int
    _delivered: asyncio.Future[None] | None  # done when deliver() has handed out the last line
    _delivery_scheduled: bool  # the rest of a burst is handed out in the next loop iteration
    _stderr: bytearray
    _stderr_limit: int
    _stderr_eof: bool
    _closing: bool
    _stdin_paused: bool
    _stdin_closed: bool
    _stdin_exc: BaseException | None
    _drain_waiter: asyncio.Future[None] | None
    _exit: asyncio.Future[ExitStatus]
    _straggler_timer: asyncio.TimerHandle | None
    _drain_timer: asyncio.TimerHandle | None
    _session_id: str
    _grace: float
    _kill_at: float | None  # loop time when terminate() gives up waiting
    _drain_by: float  # loop time after which output is not read, consumer behind or not
    _seen: dict[int, int]  # descendants seen so far: pid -> start time

    #: Counters for metrics (read by the shell; never reset).
    lines_read: int
    bytes_read: int
    lines_cut: int
    stdout_pauses: int
    naps: int
    stderr_bytes: int

    def __init__(self) -> None:
        raise TypeError("use 'await AgentProcess.start(...)'")

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | os.PathLike[str] | None = None,
        session_id: str,
        workspace: str | os.PathLike[str],
        high_water: int = DEFAULT_HIGH_WATER,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        stderr_limit: int = DEFAULT_STDERR_LIMIT,
        grace: float = DEFAULT_GRACE_S,
    ) -> AgentProcess:
        """Spawn `argv` (no shell) in a new process group, with exactly fds 0, 1 and 2.

        `env` is the complete base environment (None: inherit the gateway's); `RAWP_SESSION_ID`,
        `RAWP_WORKSPACE_PATH` (absolute) and `RAWP_DPS_VERSION` are added (DPS-17.2.1). `cwd`
        defaults to the workspace. `grace`: how long descendants left behind by the agent's own
        exit get between SIGTERM and SIGKILL. Raises `AgentExecutableNotFound` or
        `AgentStartError`.
        """
        if isinstance(argv, str | bytes) or not argv:
            raise ValueError("argv must be a non-empty list of strings (no shell is used)")
        if high_water < 1 or max_line_bytes < 1 or stderr_limit < 0:
            raise ValueError("high_water, max_line_bytes must be >= 1 and stderr_limit >= 0")
        workspace_abs = os.path.abspath(os.fspath(workspace))
        child_env = dict(os.environ if env is None else env)
        child_env["RAWP_SESSION_ID"] = session_id
        child_env["RAWP_WORKSPACE_PATH"] = workspace_abs
        child_env["RAWP_DPS_VERSION"] = RAWP_DPS_VERSION

        self = object.__new__(cls)
        self._init_state(high_water, max_line_bytes, stderr_limit)
        self._argv = tuple(argv)
        self._session_id = session_id
        self._grace = grace
        loop = self._loop = asyncio.get_running_loop()
        self._exit = loop.create_future()
        _become_subreaper()
        # The stdlib loop spawns with close_fds=True. uvloop leaves the child the original numbers
        # of its stdio socket pairs (and whatever the gateway holds without O_CLOEXEC) besides
        # 0-2: a descendant that puts 0-2 on /dev/null would still hold the agent's stdout.
        # Passed on to Popen's keywords, which subprocess_exec's stub types one by one.
        extra: dict[str, Any] = (
            {} if isinstance(loop, asyncio.BaseEventLoop) else {"preexec_fn": _cloexec_above_2}
        )
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: _Protocol(self),
                *self._argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=child_env,
                cwd=os.fspath(cwd) if cwd is not None else workspace_abs,
                start_new_session=True,
                **extra,
            )
        except FileNotFoundError as exc:
            # FileNotFoundError covers a missing cwd too; say which one it was.
            target = cwd if cwd is not None else workspace_abs
            if not os.path.isdir(target):
                raise AgentStartError(f"agent working directory does not exist: {target}") from exc
            raise AgentExecutableNotFound(argv[0]) from exc
        except OSError as exc:
            raise AgentStartError(f"cannot start agent {argv[0]!r}: {exc}") from exc
        assert self._transport is transport
        return self

    def _on_connected(self, transport: asyncio.SubprocessTransport) -> None:
        self._transport = transport
        pid = transport.get_pid()
        assert pid is not None
        self._pid = pid
        _live_groups[pid] = self
        _running.add(pid)

    def _init_state(self, high_water: int, max_line_bytes: int, stderr_limit: int) -> None:
        self._high_water = high_water
        self._low_water = high_water // 4
        self._max_line_bytes = max_line_bytes
        self._lines = deque()
        self._queued_bytes = 0
        self._partial = []
        self._partial_len = 0
        self._cut_head = b""
        self._cut_len = 0
        self._stdout_eof = False
        self._stdout_paused = False
        self._napping = False
        self._nap_timer = None
        self._last_batch_ns = 0
        self._line_gap_ns = float(_GAP_CAP_NS)
        self._line_waiter = None
        self._consumer = None
        self._batch_max = 0
        self._delivered = None
        self._delivery_scheduled = False
        self._stderr = bytearray()
        self._stderr_limit = stderr_limit
        self._stderr_eof = False
        self._closing = False
        self._stdin_paused = False
        self._stdin_closed = False
        self._stdin_exc = None
        self._drain_waiter = None
        self._straggler_timer = None
        self._drain_timer = None
        self._kill_at = None
        self._drain_by = float("inf")
        self._seen = {}
        self.lines_read = 0
        self.bytes_read = 0
        self.lines_cut = 0
        self.stdout_pauses = 0
        self.naps = 0
        self.stderr_bytes = 0

    # ------------------------------------------------------------------ properties

    @property
    def pid(self) -> int:
        """The agent's pid, which is also its process-group id."""
        return self._pid

    @property
    def argv(self) -> tuple[str, ...]:
        return self._argv

    @property
    def returncode(self) -> int | None:
        """None while running; else as in `ExitStatus.returncode`."""
        return self._exit.result().returncode if self._exit.done() else None

    @property
    def exit_status(self) -> ExitStatus | None:
        return self._exit.result() if self._exit.done() else None

    # ------------------------------------------------------------------ stdout

    def _on_stdout(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        self.bytes_read += len(data)
        if b"\n" not in data:
            self._add_partial(data)
            return
        lines = data.split(b"\n")
        tail = lines.pop()  # what follows the last b"\n": the start of the next line, maybe b""
        limit = self._max_line_bytes
        done: list[StdoutLine] = []
        if self._cut_len:
            # The rest of an overlong line ends here.
            self._cut_len += len(lines[0])
            done.append(self._cut_line(now))
            del lines[0]
        elif self._partial:
            first = lines.pop(0)
            if self._partial_len + len(first) > limit:
                self._partial.append(first[:CUT_HEAD_BYTES])
                self._start_cut(self._partial_len + len(first))
                done.append(self._cut_line(now))
            else:
                self._partial.append(first)
                done.append(StdoutLine(b"".join(self._partial), now))
                self._partial = []
                self._partial_len = 0
        if lines and limit < len(data) and max(map(len, lines)) > limit:
            for ln in lines:
                if len(ln) > limit:
                    self._cut_head, self._cut_len = ln[:CUT_HEAD_BYTES], len(ln)
                    done.append(self._cut_line(now))
                else:
                    done.append(StdoutLine(ln, now))
            lines = []
        n = len(done) + len(lines)
        # tuple.__new__ directly: a NamedTuple's own __new__ is a Python function
        new = tuple.__new__
        read = [new(StdoutLine, (ln, now, 0)) for ln in lines]
        if (
            n
            and self._consumer is not None
            and not (self._lines or self._delivery_scheduled)
            and n <= self._batch_max
        ):
            # deliver() with nothing queued: the lines go straight to the consumer, as the batch
            # _deliver() would have taken from the queue.
            self.lines_read += n
            if tail:
                self._add_partial(tail)
            self._batch_taken(n, now)
            self._hand_over(done + read if done else read)
            return
        if done:
            self._lines.extend(done)
            self._queued_bytes += sum(len(item.line) for item in done) + len(done)
        if read:
            self._lines.extend(read)
            # Each line counts its b"\n" too, so that a flood of empty lines is bounded as well.
            self._queued_bytes += sum(map(len, lines)) + len(lines)
        if n:
            self.lines_read += n
            waiter = self._line_waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            if not self._stdout_paused and self._queued_bytes > self._high_water:
                self._pause_stdout()
        if tail:
            self._add_partial(tail)
        if n and self._consumer is not None and not self._delivery_scheduled:
            self._deliver()

    def _add_partial(self, data: bytes) -> None:
        if self._cut_len:
            self._cut_len += len(data)
            return
        self._partial_len += len(data)
        if self._partial_len > self._max_line_bytes:
            # Keep the head, count the rest as it comes: memory stays bounded by the limit.
            self._partial.append(data[:CUT_HEAD_BYTES])
            self._start_cut(self._partial_len)
            return
        self._partial.append(data)

    def _start_cut(self, size: int) -> None:
        head = b""
        for chunk in self._partial:
            head += chunk[: CUT_HEAD_BYTES - len(head)]
            if len(head) == CUT_HEAD_BYTES:
                break
        self._cut_head = head
        self._cut_len = size
        self._partial = []
        self._partial_len = 0

    def _cut_line(self, now: int) -> StdoutLine:
        item = StdoutLine(self._cut_head, now, self._cut_len)
        self._cut_head = b""
        self._cut_len = 0
        self.lines_cut += 1
        return item

    def _on_stdout_eof(self) -> None:
        item = None
        if self._cut_len:
            item = self._cut_line(time.perf_counter_ns())
        elif self._partial:
            # A last line without b"\n" (an agent that crashed mid-write) is still a line.
            item = StdoutLine(b"".join(self._partial), time.perf_counter_ns())
            self._partial = []
            self._partial_len = 0
        if item is not None:
            self._lines.append(item)
            self.lines_read += 1
            self._queued_bytes += len(item.line) + 1
        self._stdout_eof = True
        waiter = self._line_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self._consumer is not None and not self._delivery_scheduled:
            self._deliver()
        self._maybe_close_transport()

    def _pause_stdout(self) -> None:
        pipe = self._transport.get_pipe_transport(_STDOUT_FD)
        if pipe is not None and not pipe.is_closing():
            pipe.pause_reading()  # type: ignore[attr-defined]
            self._stdout_paused = True
            self.stdout_pauses += 1

    def _resume_stdout(self) -> None:
        self._stdout_paused = False
        if not self._napping:
            self._resume_pipe()

    def _resume_pipe(self) -> None:
        pipe = self._transport.get_pipe_transport(_STDOUT_FD)
        if pipe is not None and not pipe.is_closing():
            pipe.resume_reading()  # type: ignore[attr-defined]

    def _nap(self) -> None:
        """Leave stdout unread for NAP_S (see the module docstring)."""
        pipe = self._transport.get_pipe_transport(_STDOUT_FD)
        if pipe is None or pipe.is_closing():
            return
        if self._nap_timer is None:
            try:
                self._nap_timer = FineTimer(self._loop, self._end_nap)
            except OSError:  # no timerfd (not Linux) or no descriptor left: read as it comes
                self._line_gap_ns = float("inf")  # and never try again
                return
        if not self._stdout_paused:
            pipe.pause_reading()  # type: ignore[attr-defined]
        self._napping = True
        self._nap_timer.start(NAP_S)
        self.naps += 1

    def _end_nap(self) -> None:
        self._napping = False
        if not self._stdout_paused:
            self._resume_pipe()

    async def readline(self) -> StdoutLine | None:
        """The next complete stdout line (without b"\\n") and when it was read; None at EOF."""
        while not self._lines:
            if self._stdout_eof:
                return None
            self._line_waiter = self._loop.create_future()
            try:
                await self._line_waiter
            finally:
                self._line_waiter = None
        item = self._lines.popleft()
        self._queued_bytes -= len(item.line) + 1
        if self._stdout_paused and self._queued_bytes <= self._low_water:
            self._resume_stdout()
        return item

    async def readlines(self, max_lines: int = 1024) -> list[StdoutLine]:
        """Between 1 and `max_lines` queued lines, waiting for the first; [] at EOF.

        Same lines as `readline()`, but one await per batch: a consumer that maps a burst of
        stream_event lines to frames pays the coroutine round trip once per burst.
        """
        while not self._lines:
            if self._stdout_eof:
                return []
            self._line_waiter = self._loop.create_future()
            try:
                await self._line_waiter
            finally:
                self._line_waiter = None
        return self._take_batch(max_lines)

    async def deliver(
        self, consumer: Callable[[list[StdoutLine]], object], max_lines: int = 1024
    ) -> None:
        """Hands every line to ``consumer``, in the batches `readlines(max_lines)` would return,
        until EOF; returns when the last line has been handed over (or raises what ``consumer``
        raised, and hands it nothing more). A batch of ``max_lines`` is followed by a turn of
        the event loop before the next one, as an ``await`` between two `readlines()` would be.
        Cancelled, nothing more is handed over. Not to be mixed with `readlines()`/`readline()`."""
        self._consumer, self._batch_max = consumer, max_lines
        self._delivered = done = self._loop.create_future()
        if self._lines or self._stdout_eof:  # read before deliver() was called
            self._delivery_scheduled = True
            self._loop.call_soon(self._deliver)
        try:
            await done
        finally:
            self._consumer = self._delivered = None

    def _deliver(self) -> None:
        self._delivery_scheduled = False
        done = self._delivered
        if self._consumer is None or done is None or done.done():
            return
        if self._lines:
            batch = self._take_batch(self._batch_max)
            if not self._hand_over(batch):
                return
            if len(batch) == self._batch_max and self._lines:
                self._delivery_scheduled = True
                self._loop.call_soon(self._deliver)
                return
        if self._stdout_eof and not self._lines:
            done.set_result(None)

    def _hand_over(self, batch: list[StdoutLine]) -> bool:
        """``batch`` to deliver()'s consumer; False when nothing more is to be handed."""
        consumer, done = self._consumer, self._delivered
        if consumer is None or done is None or done.done():
            return False
        try:
            consumer(batch)
        except BaseException as err:  # to deliver()'s caller, as readlines' caller would
            self._consumer = None
            done.set_exception(err)
            return False
        return True

    def _take_batch(self, max_lines: int) -> list[StdoutLine]:
        """Up to ``max_lines`` queued lines (at least one is queued), and the bookkeeping of a batch
        handed out: backpressure released, the line rate smoothed, a nap when lines come fast."""
        q = self._lines
        if len(q) <= max_lines:
            batch = list(q)
            q.clear()
        else:
            batch = [q.popleft() for _ in range(max_lines)]
        self._queued_bytes -= sum(len(item.line) for item in batch) + len(batch)
        if self._stdout_paused and self._queued_bytes <= self._low_water:
            self._resume_stdout()
        self._batch_taken(len(batch), time.perf_counter_ns())
        return batch

    def _batch_taken(self, n: int, now: int) -> None:
        """The line rate smoothed over the batches handed out, and a nap when lines come fast."""
        gap = min((now - self._last_batch_ns) / n, _GAP_CAP_NS)
        self._last_batch_ns = now
        self._line_gap_ns = gap = 0.75 * self._line_gap_ns + 0.25 * gap
        if (
            n < NAP_MAX_BATCH
            and gap < NAP_BELOW_GAP_NS
            and not (self._lines or self._napping or self._stdout_eof)
        ):
            self._nap()

    def at_eof(self) -> bool:
        """True when stdout is closed and every line has been read."""
        return self._stdout_eof and not self._lines

    async def __aiter__(self) -> AsyncIterator[StdoutLine]:
        while (item := await self.readline()) is not None:
            yield item

    @property
    def queued_bytes(self) -> int:
        """Bytes of complete lines (one per newline included) waiting for the consumer (a gauge)."""
        return self._queued_bytes

    # ------------------------------------------------------------------ stderr

    def _on_stderr(self, data: bytes) -> None:
        self.stderr_bytes += len(data)
        buf = self._stderr
        buf += data
        excess = len(buf) - self._stderr_limit
        if excess > 0:
            del buf[:excess]

    def _on_stderr_eof(self) -> None:
        self._stderr_eof = True
        self._maybe_close_transport()

    def stderr_tail(self) -> str:
        """The last `stderr_limit` bytes of stderr, decoded leniently (for agent.error.details)."""
        return self._stderr.decode("utf-8", errors="replace")

    @property
    def stderr_truncated(self) -> bool:
        """True when stderr produced more than the ring keeps."""
        return self.stderr_bytes > len(self._stderr)

    # ------------------------------------------------------------------ stdin

    def write(self, data: bytes, *, limit: int | None = None) -> None:
        """Queue bytes for the agent's stdin. Raises if stdin is closed or the pipe broke, and
        `AgentStdinFull` (writing nothing) if the bytes the agent has not read yet would pass
        `limit` with these; a write into an empty backlog always goes."""
        if self._stdin_closed:
            raise AgentProcessError("agent stdin is closed")
        if self._stdin_exc is not None:
            raise AgentProcessError("agent stdin pipe is broken") from self._stdin_exc
        pipe = self._transport.get_pipe_transport(_STDIN_FD)
        if pipe is None or pipe.is_closing():
            raise AgentProcessError("agent stdin pipe is closed")
        if limit is not None:
            backlog = pipe.get_write_buffer_size()  # type: ignore[attr-defined]
            if backlog and backlog + len(data) > limit:
                raise AgentStdinFull(
                    f"the agent has not read {backlog} bytes of its input (limit {limit})"
                )
        pipe.write(data)  # type: ignore[attr-defined]

    @property
    def stdin_backlog(self) -> int:
        """Bytes written to stdin that the agent has not taken yet (beyond the pipe's own buffer)."""
        pipe = self._transport.get_pipe_transport(_STDIN_FD)
        if pipe is None or pipe.is_closing():
            return 0
        return pipe.get_write_buffer_size()  # type: ignore[attr-defined]

    async def drain(self) -> None:
        """Wait until the stdin buffer is below the transport's high-water mark."""
        if self._stdin_exc is not None:
            raise AgentProcessError("agent stdin pipe is broken") from self._stdin_exc
        if not self._stdin_paused:
            return
        self._drain_waiter = self._loop.create_future()
        try:
            await self._drain_waiter
        finally:
            self._drain_waiter = None

    def close_stdin(self) -> None:
        """Close stdin after the buffered data is written (stream-json agents exit on EOF)."""
        if self._stdin_closed:
            return
        self._stdin_closed = True
        pipe = self._transport.get_pipe_transport(_STDIN_FD)
        if pipe is not None:
            pipe.close()

    def _on_stdin_resume(self) -> None:
        self._stdin_paused = False
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _on_stdin_lost(self, exc: Exception | None) -> None:
        self._stdin_exc = exc if exc is not None else BrokenPipeError(errno.EPIPE, "stdin closed")
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(AgentProcessError("agent stdin pipe is broken"))

    # ------------------------------------------------------------------ exit and signals

    def _on_exit(self) -> None:
        rc = self._transport.get_returncode()
        assert rc is not None
        if not self._exit.done():
            self._exit.set_result(classify_exit(rc))
        _running.discard(self._pid)
        # The agent's exit is its own: what it started and left behind is asked to stop now and
        # killed when the grace ends (at terminate()'s deadline if that is under way) ...
        if self._signal_all(signal.SIGTERM):
            if self._straggler_timer is None:
                when = (
                    self._kill_at if self._kill_at is not None else self._loop.time() + self._grace
                )
                self._straggler_timer = self._loop.call_at(when, self._kill_stragglers)
        else:
            self._forget()
        # ... and its output is read until EOF, or for EXIT_DRAIN_S at most (never past that
        # deadline): a descendant holding the pipe cannot keep the agent's turn open.
        if not (self._stdout_eof and self._stderr_eof) and not self._closing:
            now = self._loop.time()
            when, self._drain_by = now + EXIT_DRAIN_S, now + 5 * EXIT_DRAIN_S
            if self._kill_at is not None:
                when, self._drain_by = min(when, self._kill_at), min(self._drain_by, self._kill_at)
            self._drain_timer = self._loop.call_at(when, self._end_output)
        self._maybe_close_transport()

    def _end_output(self) -> None:
        """Stop reading stdout and stderr: queued lines are still handed out, then EOF."""
        self._drain_timer = None
        if self._stdout_paused and self._loop.time() < self._drain_by:
            # The consumer is behind (backpressure), not the agent: what waits in the pipe is the
            # agent's own output. Look again soon, up to a hard limit.
            self._drain_timer = self._loop.call_later(0.1, self._end_output)
            return
        for fd, eof in ((_STDOUT_FD, self._stdout_eof), (_STDERR_FD, self._stderr_eof)):
            pipe = self._transport.get_pipe_transport(fd)
            if not eof and pipe is not None:
                pipe.close()  # reported through pipe_connection_lost, as a real EOF is

    def _maybe_close_transport(self) -> None:
        # Like asyncio's own SubprocessStreamProtocol: once the process is gone and its output is
        # drained (or nobody wants the rest, after close()), release the transport and its pipes.
        # Never before the exit is reported: closing an asyncio transport early kills only the
        # leader and may reap it behind the child watcher's back.
        if self._exit.done() and (self._closing or (self._stdout_eof and self._stderr_eof)):
            self._stdin_closed = True
            self._transport.close()
            if self._nap_timer is not None:
                self._nap_timer.close()
                self._nap_timer = None
                self._napping = False
            if self._drain_timer is not None:
                self._drain_timer.cancel()
                self._drain_timer = None

    def close(self) -> None:
        """Give the agent up: SIGKILL to its group and descendants if it still runs, and release
        the pipes.

        Unread stdout is discarded. The pipes are released as soon as the exit is reported (at
        once if it already was); `aclose()` also waits for that. Stop agents politely with
        `terminate()`; this is the blunt end, safe to call at any time and more than once. After
        the agent's own exit, what it left behind keeps its deadline (see `_on_exit`).
        """
        self._closing = True
        self._stdin_closed = True
        if not self._exit.done():
            self._signal_all(signal.SIGKILL)
        # After the exit, what the agent left behind keeps its deadline (SIGKILL at the grace).
        self._maybe_close_transport()

    async def aclose(self) -> ExitStatus:
        """`close()`, then wait for the exit; returns the exit status."""
        killed = not self._exit.done()
        self.close()
        status = await self.wait()
        if killed:
            self._forget()  # everything got SIGKILL: nothing left to wait for
        return status

    def _forget(self) -> None:
        if _live_groups.get(self._pid) is self:
            del _live_groups[self._pid]
        if self._straggler_timer is not None:
            self._straggler_timer.cancel()
            self._straggler_timer = None

    async def wait(self) -> ExitStatus:
        """Wait for the agent (the group leader) to exit."""
        return await asyncio.shield(self._exit)

    def send_signal(self, sig: int) -> bool:
        """Send `sig` to the agent's whole process group. False when the group is gone."""
        if _live_groups.get(self._pid) is not self:
            return False  # never signal a pgid that may have been reused
        if not _killpg(self._pid, sig):
            if self._exit.done():
                self._forget()
            return False
        return True

    def _descendants(self, procs: dict[int, _Proc]) -> set[int]:
        """Live processes that came from the agent, itself excluded: members of its group or
        session, its subtree, and orphans adopted by the gateway that carry its session id or were
        seen under it before."""
        agent = self._pid
        roots = set()
        if _live_groups.get(agent) is self:  # else the pid may be another process's by now
            roots = {p.pid for p in procs.values() if agent in (p.pgrp, p.sid)}
            if not self._exit.done():
                roots.add(agent)
        for p in _adopted(procs):
            if self._seen.get(p.pid) == p.start or _session_id_of(p.pid) == self._session_id:
                roots.add(p.pid)
        found = _subtree(roots, procs) if roots else set()
        found.discard(agent)
        found = {pid for pid in found if not procs[pid].zombie}
        for pid in found:
            self._seen[pid] = procs[pid].start
        return found

    def _signal_all(self, sig: int, procs: dict[int, _Proc] | None = None) -> bool:
        """`sig` to the agent's group and to every descendant found, wherever it went. True when
        something besides the agent itself may still be alive."""
        if procs is None:
            procs = _processes()
        group = _live_groups.get(self._pid) is self and _killpg(self._pid, sig)
        found = self._descendants(procs)
        if found:
            _signal_pids(found, sig, procs)
            _schedule_reaps(self._loop)
        # /proc tells live members from zombies; without it, any member of the group counts.
        return bool(found) if procs else group

    async def terminate(self, grace: float = DEFAULT_GRACE_S) -> ExitStatus:
        """DPS-17.2.3: SIGTERM to the group and the agent's descendants, SIGKILL to them after
        `grace` s; the exit status.

        Returns once the agent itself has exited. Descendants that outlive it get SIGKILL when the
        grace period ends, and its output is not waited for past then.
        """
        if _live_groups.get(self._pid) is not self:
            # Exited and nothing is known to be left: probing the pgid again could hit a recycled
            # pid.
            return await self.wait()
        self._kill_at = self._loop.time() + grace
        self._drain_by = min(self._drain_by, self._kill_at)
        if self._drain_timer is not None and self._drain_timer.when() > self._kill_at:
            self._drain_timer.cancel()
            self._drain_timer = self._loop.call_at(self._kill_at, self._end_output)
        self._signal_all(signal.SIGTERM)
        try:
            async with asyncio.timeout(grace):
                status = await self.wait()
        except TimeoutError:
            self._kill_stragglers()
            status = await self.wait()
            self._end_output()
            return status
        if _live_groups.get(self._pid) is self:
            timer = self._straggler_timer
            if timer is None or timer.when() > self._kill_at:
                if timer is not None:
                    timer.cancel()
                self._straggler_timer = self._loop.call_at(self._kill_at, self._kill_stragglers)
        return status

    def _kill_stragglers(self) -> None:
        self._straggler_timer = None
        # A few rounds: a process killed now may have started children that a look before missed.
        for _ in range(3):
            if not self._signal_all(signal.SIGKILL):
                break
        self._forget()

    def __repr__(self) -> str:
        state = "running" if not self._exit.done() else f"exited {self._exit.result().returncode}"
        return f"<AgentProcess pid={self._pid} {state} argv0={self._argv[0]!r}>"
