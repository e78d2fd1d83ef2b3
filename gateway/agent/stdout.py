"""An agent's stdout, read as lines: `StdoutLine`, and `StdoutReader`, the stdout half of
`AgentProcess` (partial and cut lines, backpressure, the nap that gathers lines, `readline()`,
`readlines()` and `deliver()`).

`AgentProcess` inherits `StdoutReader` rather than holding one: this is the per-line path, and a
line read through the process's own methods and attributes costs no call or attribute hop more
than it would in one class. The pipe callbacks come from the process's `SubprocessProtocol`, or
from a read-pipe protocol of its own when the gateway made the stdout pipe (a wide one).

Theory of operation
-------------------
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

`readlines()` hands over every queued line per await (one coroutine round trip per burst).
`deliver(consumer)` hands the same batches to a plain function instead, called from the pipe's own
callback as the lines are read: no task wake-up, coroutine or future per batch, which at a few
lines a second per session is most of what a line costs apart from its own work (and young objects
that every collection of the garbage collector would walk). At high
line rates it also gathers lines: an agent like Claude Code writes each line on its own, and each
line read alone is a wake-up of the event loop (a pipe read, the consumer's turn, a socket write per
master) costing several times the line's own work. When lines come faster than one per
`NAP_BELOW_GAP_NS` (smoothed over recent batches) and the batches are small, stdout is left unread
for `NAP_SEC` after each batch (a `FineTimer`: uvloop's timers count whole milliseconds), so the
lines of that half millisecond are read, mapped and sent together. No line waits longer than that;
at 1,000 lines/s nothing waits.

A wide stdout
-------------
A single-turn agent (one process per prompt) is started with a wide stdout pipe
(`AgentProcess.start(stdout_pipe_bytes=WIDE_STDOUT_PIPE_BYTES)`): such a CLI ends its run with
`process.exit()` (Node: Gemini CLI, Claude Code `-p`), which drops what its stdout stream still
queues in the process when the pipe is full. Gemini prints the whole prompt back first, so a long
prompt alone fills the 64 KiB a Linux pipe holds by default, and when the gateway read a little
late the answer and the result line behind it were lost (the turn ended with nothing said).

The gateway makes that pipe itself (`wide_pipe`), widens it with `F_SETPIPE_SZ`, gives the write
end to the spawn as the child's stdout (closing its own copy) and reads the read end with
`connect_read_pipe` (`StdoutPipeProtocol`), on both loops: uvloop's own stdio is a socket pair
whose send buffer (about 208 KiB) is the child's end and cannot be set from here. The kernel may
refuse the size (`pipe-max-size`, the user's `pipe-user-pages-soft`); then the loop's own stdio is
used, as for every other agent. At most `MAX_WIDE_STDOUT_PIPES` are wide at once, so the gateway
never takes much of its user's pipe budget (past it, every new pipe of the user would get two
pages).
"""

from __future__ import annotations

import asyncio
import fcntl
import io
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Final, NamedTuple, cast

from gateway.agent.fine_timer import FineTimer

__all__ = [
    "CUT_HEAD_BYTES",
    "DEFAULT_HIGH_WATER",
    "DEFAULT_MAX_LINE_BYTES",
    "MAX_WIDE_STDOUT_PIPES",
    "STDOUT_FD",
    "WIDE_STDOUT_PIPE_BYTES",
    "StdoutLine",
    "StdoutPipeProtocol",
    "StdoutReader",
    "release_wide_pipe",
    "wide_pipe",
]

DEFAULT_HIGH_WATER: Final = 4 * 1024 * 1024
DEFAULT_MAX_LINE_BYTES: Final = 32 * 1024 * 1024
CUT_HEAD_BYTES: Final = 1024  # what is kept of a line over the limit, for the diagnostic
# Gathering lines at high rates (see the module docstring): when the time between lines, smoothed
# over the recent batches, is under NAP_BELOW_GAP_NS and a batch holds fewer than NAP_MAX_BATCH
# lines, stdout is not read for NAP_SEC after it, so that the next batch brings several lines for
# one wake-up. The smoothing keeps one pair of close lines at a moderate rate from making anyone
# wait.
NAP_SEC: Final = 0.0005
NAP_BELOW_GAP_NS: Final = 250_000  # i.e. above 4,000 lines/s
NAP_MAX_BATCH: Final = 32  # a batch this big (a burst) already shares its wake-up
_GAP_CAP_NS: Final = 10_000_000  # an idle pause counts as this much: the rate is found again soon
STDOUT_FD: Final = 1
# A single-turn agent's stdout pipe holds this much (see the module docstring): a whole turn's
# output, a long prompt's echo included, fits before the agent exits.
WIDE_STDOUT_PIPE_BYTES: Final = 1024 * 1024
MAX_WIDE_STDOUT_PIPES: Final = 16  # wide at once: 16 MiB of the user's 64 MiB default budget
_wide_pipes = 0  # how many are now


def wide_pipe(size: int) -> tuple[io.FileIO, int] | None:
    """A new pipe that holds ``size`` bytes, both ends close-on-exec: its read end as a file, its
    write end's fd. Counted in ``MAX_WIDE_STDOUT_PIPES`` until `release_wide_pipe()`; None past
    that count or when the kernel refuses the size (module docstring)."""
    global _wide_pipes
    if _wide_pipes >= MAX_WIDE_STDOUT_PIPES:
        return None
    try:
        read, write = os.pipe2(os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, size)
        reader = io.FileIO(read, "rb")
    except OSError:  # pipe-max-size, the user's pipe budget: the loop's own pipe will do
        os.close(read)
        os.close(write)
        return None
    _wide_pipes += 1
    return reader, write


def release_wide_pipe() -> None:
    global _wide_pipes
    _wide_pipes -= 1


class StdoutLine(NamedTuple):
    """One stdout line without its b"\\n", and the perf_counter_ns() when it was read.

    A line over `max_line_bytes` is not kept: `line` is its first `CUT_HEAD_BYTES` and `cut` its
    full size in bytes (0 for every line that is whole).
    """

    line: bytes
    t_ns: int
    cut: int = 0


class StdoutReader:
    """The stdout half of `AgentProcess`, which inherits it (see the module docstring)."""

    # Private state, declared up front (as aiohttp's own web_ws does); the process sets the first
    # two when it starts.
    _loop: asyncio.AbstractEventLoop
    _transport: asyncio.SubprocessTransport
    # The gateway's own stdout pipe (a wide one), read apart from the process's transport; None
    # while stdout is the process transport's pipe.
    _own_stdout: asyncio.ReadTransport | None
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
    _napping: bool  # stdout left unread for NAP_SEC to gather lines
    _nap_timer: FineTimer | None
    _last_batch_ns: int
    _line_gap_ns: float  # between lines, smoothed over the batches handed out
    _line_waiter: asyncio.Future[None] | None
    _consumer: Callable[[list[StdoutLine]], object] | None  # deliver()'s, while it runs
    _batch_max: int
    _delivered: asyncio.Future[None] | None  # done when deliver() has handed out the last line
    _delivery_scheduled: bool  # the rest of a burst is handed out in the next loop iteration
    # At stdout's EOF: the process releases its transport once the agent has exited too.
    _maybe_close_transport: Callable[[], None]

    #: Counters for metrics (read by the shell; never reset).
    lines_read: int
    bytes_read: int
    lines_cut: int
    stdout_pauses: int
    naps: int

    def _init_stdout(self, high_water: int, max_line_bytes: int) -> None:
        self._own_stdout = None
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
        self.lines_read = 0
        self.bytes_read = 0
        self.lines_cut = 0
        self.stdout_pauses = 0
        self.naps = 0

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

    def _stdout_pipe(self) -> asyncio.BaseTransport | None:
        """The transport stdout is read through: the gateway's own pipe if it made one, else the
        process transport's."""
        if self._own_stdout is not None:
            return self._own_stdout
        return self._transport.get_pipe_transport(STDOUT_FD)

    def _pause_stdout(self) -> None:
        pipe = self._stdout_pipe()
        if pipe is not None and not pipe.is_closing():
            pipe.pause_reading()  # type: ignore[attr-defined]
            self._stdout_paused = True
            self.stdout_pauses += 1

    def _resume_stdout(self) -> None:
        self._stdout_paused = False
        if not self._napping:
            self._resume_pipe()

    def _resume_pipe(self) -> None:
        pipe = self._stdout_pipe()
        if pipe is not None and not pipe.is_closing():
            pipe.resume_reading()  # type: ignore[attr-defined]

    def _nap(self) -> None:
        """Leave stdout unread for NAP_SEC (see the module docstring)."""
        pipe = self._stdout_pipe()
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
        self._nap_timer.start(NAP_SEC)
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


class StdoutPipeProtocol(asyncio.Protocol):
    """Reads a stdout pipe the gateway made itself (a wide one) for its `StdoutReader`."""

    __slots__ = ("_owner",)

    def __init__(self, owner: StdoutReader) -> None:
        self._owner = owner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._owner._own_stdout = cast(asyncio.ReadTransport, transport)

    def data_received(self, data: bytes) -> None:
        self._owner._on_stdout(data)

    def connection_lost(self, exc: Exception | None) -> None:
        # After EOF, or when the gateway closed the pipe: both end stdout, as with the loop's pipe.
        self._owner._on_stdout_eof()
