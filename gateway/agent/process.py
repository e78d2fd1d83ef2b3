"""The agent process: spawn, stdin, stderr tail, signals, exit (§17, §18). Its stdout is read by
`StdoutReader` (`gateway.agent.stdout`), which `AgentProcess` inherits; its exit is classified in
`gateway.agent.exit`; what it leaves running is found in `gateway.agent.descendants`.

Theory of operation
-------------------
`AgentProcess.start()` launches the agent CLI from an argv list (never through a shell) with
`loop.subprocess_exec`, in a new session so that the agent and everything it starts (Bash tool
commands, MCP servers, subagents) share one process group whose id is the agent's pid. Every signal
the gateway sends goes to that group (`os.killpg`), so a SIGTERM or SIGKILL also reaches the
grandchildren. Its environment is `gateway.agent.environment`'s (never a gateway setting in it;
the three `RAWP_*` variables of DPS-17.2.1 added). With a `sandbox` (`[isolation] mode =
"sandbox"`, `gateway.agent.sandbox`), the command runs under bubblewrap: the pid is bwrap's, whose
end ends the whole sandbox at once, so a signal other than SIGKILL goes to the processes inside
and never to bubblewrap's own two (`_signal_inside`). The agent gets exactly fds 0, 1 and 2 (uvloop
needs help there, see `start`): no descendant can hold the agent's pipes through a descriptor it did
not know it had.

Descendants that leave the group (setsid(), as Gemini CLI's shell tool does, or a daemon's double
fork) are found too: the gateway is a child subreaper (Linux), so they stay in its process tree, and
/proc says which came from which agent (`gateway.agent.descendants`). Terminating an agent signals
them with its group.

The pipes are driven by a `SubprocessProtocol` of our own instead of `asyncio.StreamReader`:

* stdout is split into lines as chunks arrive, with backpressure on complete lines
  (`gateway.agent.stdout`).
* stderr is drained continuously into a ring of the last `stderr_limit` bytes (`stderr_tail()`),
  for `agent.error.details`; a chatty stderr can never fill the pipe and stall the agent.
* stdin: `write()` + `await drain()` with the transport's flow control, `close_stdin()`. What the
  agent has not read yet waits in the transport (`stdin_backlog`); `write(data, limit=N)` refuses
  (`AgentStdinFull`, nothing written) a write that would take it past N bytes, so an agent that
  never reads stdin cannot make the gateway grow.

The agent's exit is seen when the agent itself exits, not at stdout EOF: its exit status is
reported at once, what it left behind gets SIGTERM, and SIGKILL when the grace ends; stdout (and
stderr) are read on until EOF or for `EXIT_DRAIN_SEC` at most (up to five times that while the
consumer is behind and reading is paused: the pipe then holds the agent's own output), then closed,
so a descendant still holding the pipe cannot keep the consumer waiting. Lines already read are
still handed out.

`terminate(grace)` follows DPS-17.2.3: SIGTERM to the group and the descendants, SIGKILL to them
when the agent has not exited after `grace` seconds. If the agent exits in time but descendants
linger, they get SIGKILL when the grace period ends (a timer, so `terminate` returns as soon as the
agent itself is gone), and its output is not read past that deadline.

A single-turn agent (one process per prompt) gets a wide stdout pipe of the gateway's own
(`stdout_pipe_bytes`; why and how: `gateway.agent.stdout`), read apart from the process transport.

`close()` / `aclose()` drop an agent without reading it to the end (SIGKILL to the group, then the
pipes are released). Otherwise the transport is closed by itself once the agent has exited and its output is
drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from gateway.agent.descendants import (
    DEFAULT_GRACE_SEC,
    Proc,
    adopted,
    all_processes,
    become_subreaper,
    killpg,
    live_process_groups,
    running_pids,
    schedule_reaps,
    session_id_of,
    signal_pids,
    subtree,
)
from gateway.agent.environment import agent_environment
from gateway.agent.exit import (
    AgentExecutableNotFound,
    AgentProcessError,
    AgentStartError,
    AgentStdinFull,
    ExitStatus,
    classify_exit,
)
from gateway.agent.sandbox import SpawnSandbox
from gateway.agent.stdout import (
    DEFAULT_HIGH_WATER,
    DEFAULT_MAX_LINE_BYTES,
    MAX_WIDE_STDOUT_PIPES,
    STDOUT_FD,
    WIDE_STDOUT_PIPE_BYTES,
    StdoutPipeProtocol,
    StdoutReader,
    release_wide_pipe,
    wide_pipe,
)

__all__ = ["MAX_WIDE_STDOUT_PIPES", "WIDE_STDOUT_PIPE_BYTES", "AgentProcess"]

DEFAULT_STDERR_LIMIT: Final = 64 * 1024
# After the agent exits, what is left on its stdout is read for at most this long: its own output is
# already in the pipe; only a descendant still holding the pipe open could make it longer.
EXIT_DRAIN_SEC: Final = 2.0
_STDERR_FD: Final = 2
_STDIN_FD: Final = 0


# --------------------------------------------------------------------------- starting


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
        if fd == STDOUT_FD:
            self._owner._on_stdout(data)
        elif fd == _STDERR_FD:
            self._owner._on_stderr(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == STDOUT_FD:
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


class AgentProcess(StdoutReader):
    """One agent child process in its own process group. Create with `await AgentProcess.start()`."""

    # Private state, declared up front (as aiohttp's own web_ws does); stdout's is StdoutReader's.
    _pid: int
    _argv: tuple[str, ...]
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
    _sandboxed: bool  # the pid is bubblewrap's (gateway.agent.sandbox)

    #: Counters for metrics (read by the shell; never reset).
    stderr_bytes: int

    def __init__(self) -> None:
        raise TypeError("use 'await AgentProcess.start(...)'")

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None,
        gateway_env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        session_id: str,
        workspace: str | os.PathLike[str],
        high_water: int = DEFAULT_HIGH_WATER,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        stderr_limit: int = DEFAULT_STDERR_LIMIT,
        grace: float = DEFAULT_GRACE_SEC,
        sandbox: SpawnSandbox | None = None,
        stdout_pipe_bytes: int = 0,
    ) -> AgentProcess:
        """Spawn `argv` (no shell) in a new process group, with exactly fds 0, 1 and 2.

        The environment is `gateway.agent.environment`'s: `gateway_env` (None: the gateway's own)
        without the gateway's settings, `env` (the profile's) over it, then `RAWP_SESSION_ID`,
        `RAWP_WORKSPACE_PATH` (absolute) and `RAWP_DPS_VERSION` (DPS-17.2.1). `cwd`
        defaults to the workspace. `grace`: how long descendants left behind by the agent's own
        exit get between SIGTERM and SIGKILL. `stdout_pipe_bytes`: the stdout pipe is made to
        hold that much where it can (`gateway.agent.stdout`; 0: the loop's own). Raises
        `AgentExecutableNotFound` or `AgentStartError`.
        """
        if isinstance(argv, str | bytes) or not argv:
            raise ValueError("argv must be a non-empty list of strings (no shell is used)")
        if high_water < 1 or max_line_bytes < 1 or stderr_limit < 0:
            raise ValueError("high_water, max_line_bytes must be >= 1 and stderr_limit >= 0")
        workspace_abs = os.path.abspath(os.fspath(workspace))
        child_env = agent_environment(
            env or {}, session_id=session_id, workspace=workspace_abs, gateway_env=gateway_env
        )

        run_cwd = os.fspath(cwd) if cwd is not None else workspace_abs
        run_argv: Sequence[str] = argv
        if sandbox is not None:  # the environment is made before bwrap: its own shows inside
            run_argv, child_env = await sandbox.wrap(argv, child_env, run_cwd)

        self = object.__new__(cls)
        self._init_state(high_water, max_line_bytes, stderr_limit)
        self._sandboxed = sandbox is not None
        self._argv = tuple(argv)
        self._session_id = session_id
        self._grace = grace
        loop = self._loop = asyncio.get_running_loop()
        self._exit = loop.create_future()
        become_subreaper()
        # The stdlib loop spawns with close_fds=True. uvloop leaves the child the original numbers
        # of its stdio socket pairs (and whatever the gateway holds without O_CLOEXEC) besides
        # 0-2: a descendant that puts 0-2 on /dev/null would still hold the agent's stdout.
        # Passed on to Popen's keywords, which subprocess_exec's stub types one by one.
        extra: dict[str, Any] = (
            {} if isinstance(loop, asyncio.BaseEventLoop) else {"preexec_fn": _cloexec_above_2}
        )
        # A wide stdout is a pipe of the gateway's own (gateway.agent.stdout): its write end is the
        # child's fd 1 (both loops dup it there; the parent's copy is closed once spawned).
        wide = wide_pipe(stdout_pipe_bytes) if stdout_pipe_bytes else None
        spawned = False
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: _Protocol(self),
                *run_argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE if wide is None else wide[1],
                stderr=asyncio.subprocess.PIPE,
                env=child_env,
                cwd=run_cwd,
                start_new_session=True,
                **extra,
            )
            spawned = True
        except FileNotFoundError as exc:
            # FileNotFoundError covers a missing cwd too; say which one it was.
            target = cwd if cwd is not None else workspace_abs
            if not os.path.isdir(target):
                raise AgentStartError(f"agent working directory does not exist: {target}") from exc
            raise AgentExecutableNotFound(argv[0]) from exc
        except OSError as exc:
            raise AgentStartError(f"cannot start agent {argv[0]!r}: {exc}") from exc
        finally:
            if wide is not None:
                os.close(wide[1])
                if not spawned:
                    wide[0].close()
                    release_wide_pipe()
        assert self._transport is transport
        if wide is not None:
            self._wide_stdout = True  # released with the transport (_maybe_close_transport)
            await self._read_own_stdout(wide[0])
        return self

    async def _read_own_stdout(self, pipe: io.FileIO) -> None:
        """Read stdout from ``pipe``, the read end of the gateway's own; the agent is killed if
        that cannot start (or start() is cancelled here): nobody would read or stop it."""
        try:
            await self._loop.connect_read_pipe(lambda: StdoutPipeProtocol(self), pipe)
        except BaseException:
            pipe.close()  # the transport, if one was made, closed it already: a no-op then
            self.close()
            raise

    def _on_connected(self, transport: asyncio.SubprocessTransport) -> None:
        self._transport = transport
        pid = transport.get_pid()
        assert pid is not None
        self._pid = pid
        live_process_groups[pid] = self
        running_pids.add(pid)

    def _init_state(self, high_water: int, max_line_bytes: int, stderr_limit: int) -> None:
        self._init_stdout(high_water, max_line_bytes)
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
        self.stderr_bytes = 0
        self._wide_stdout = False

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
        running_pids.discard(self._pid)
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
        # ... and its output is read until EOF, or for EXIT_DRAIN_SEC at most (never past that
        # deadline): a descendant holding the pipe cannot keep the agent's turn open.
        if not (self._stdout_eof and self._stderr_eof) and not self._closing:
            now = self._loop.time()
            when, self._drain_by = now + EXIT_DRAIN_SEC, now + 5 * EXIT_DRAIN_SEC
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
        pipes = (
            (self._stdout_pipe(), self._stdout_eof),
            (self._transport.get_pipe_transport(_STDERR_FD), self._stderr_eof),
        )
        for pipe, eof in pipes:
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
            if self._own_stdout is not None:
                self._own_stdout.close()  # the process transport's own pipes close with it
            if self._wide_stdout:
                self._wide_stdout = False
                release_wide_pipe()
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
        if live_process_groups.get(self._pid) is self:
            del live_process_groups[self._pid]
        if self._straggler_timer is not None:
            self._straggler_timer.cancel()
            self._straggler_timer = None

    async def wait(self) -> ExitStatus:
        """Wait for the agent (the group leader) to exit."""
        return await asyncio.shield(self._exit)

    def send_signal(self, sig: int) -> bool:
        """Send `sig` to the agent's whole process group. False when the group is gone."""
        if live_process_groups.get(self._pid) is not self:
            return False  # never signal a pgid that may have been reused
        if self._sandboxed and sig != signal.SIGKILL:
            return self._signal_inside(sig, all_processes())
        if not killpg(self._pid, sig):
            if self._exit.done():
                self._forget()
            return False
        return True

    def _descendants(self, procs: dict[int, Proc]) -> set[int]:
        """Live processes that came from the agent, itself excluded: members of its group or
        session, its subtree, and orphans adopted by the gateway that carry its session id or were
        seen under it before."""
        agent = self._pid
        roots = set()
        if live_process_groups.get(agent) is self:  # else the pid may be another process's by now
            roots = {p.pid for p in procs.values() if agent in (p.pgrp, p.sid)}
            if not self._exit.done():
                roots.add(agent)
        for p in adopted(procs):
            if self._seen.get(p.pid) == p.start or session_id_of(p.pid) == self._session_id:
                roots.add(p.pid)
        found = subtree(roots, procs) if roots else set()
        found.discard(agent)
        found = {pid for pid in found if not procs[pid].zombie}
        for pid in found:
            self._seen[pid] = procs[pid].start
        return found

    def _signal_all(self, sig: int, procs: dict[int, Proc] | None = None) -> bool:
        """`sig` to the agent's group and to every descendant found, wherever it went. True when
        something besides the agent itself may still be alive."""
        if procs is None:
            procs = all_processes()
        if self._sandboxed and sig != signal.SIGKILL:
            return self._signal_inside(sig, procs)
        group = live_process_groups.get(self._pid) is self and killpg(self._pid, sig)
        found = self._descendants(procs)
        if found:
            signal_pids(found, sig, procs)
            schedule_reaps(self._loop)
        # /proc tells live members from zombies; without it, any member of the group counts.
        return bool(found) if procs else group

    def _signal_inside(self, sig: int, procs: dict[int, Proc]) -> bool:
        """In the sandbox: `sig` to every process in it but bubblewrap's own two, its outer
        process (the agent's pid here) and the namespace's init (that one's child). Either one
        ended by the signal would end the whole sandbox at once, with SIGKILL."""
        found = self._descendants(procs)
        found -= {p.pid for p in procs.values() if p.ppid == self._pid}
        # Oldest first, as a group signal would reach them at once: the agent before the tool
        # it runs, so that it never sees its tool die and goes on before its own signal comes.
        for pid in sorted(found, key=lambda pid: procs[pid].start):
            signal_pids({pid}, sig, procs)
        return bool(found) or not self._exit.done()

    async def terminate(self, grace: float = DEFAULT_GRACE_SEC) -> ExitStatus:
        """DPS-17.2.3: SIGTERM to the group and the agent's descendants, SIGKILL to them after
        `grace` s; the exit status.

        Returns once the agent itself has exited. Descendants that outlive it get SIGKILL when the
        grace period ends, and its output is not waited for past then.
        """
        if live_process_groups.get(self._pid) is not self:
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
        if live_process_groups.get(self._pid) is self:
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
