"""Tests of gateway.agent.process (and its stdout, exit and descendants) with real child processes
(python -c scripts), on asyncio and uvloop.

Each test runs its scenario under both event loops through `asyncio.Runner(loop_factory=...)`,
because the gateway runs on uvloop in production and on the stdlib loop in most tests, and the two
drive subprocess pipes with different code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import uvloop

import gateway.agent.stdout as stdout_module
from gateway.agent.descendants import kill_all_groups, live_groups, terminate_all
from gateway.agent.environment import RAWP_DPS_VERSION
from gateway.agent.exit import (
    AgentExecutableNotFound,
    AgentProcessError,
    AgentStartError,
    ExitStatus,
    classify_exit,
)
from gateway.agent.process import MAX_WIDE_STDOUT_PIPES, WIDE_STDOUT_PIPE_BYTES, AgentProcess
from gateway.agent.stdout import CUT_HEAD_BYTES, DEFAULT_MAX_LINE_BYTES, StdoutLine
from tests.support.gateway_exit import none_outlive_the_gateway
from tests.support.loops import LOOPS, PY, run
from tests.support.procs import alive
from tests.support.waiting import eventually

BATCH = 256  # as the session reads


async def spawn(script: str, *args: str, workspace: Path | str = ".", **kw: Any) -> AgentProcess:
    """``script`` as an agent, under a session id of its own: the gateway takes an orphan that
    carries an agent's RAWP_SESSION_ID for that agent's descendant (gateway/agent/descendants.py),
    so one shared id would let an earlier agent's clean-up signal a later one."""
    return await AgentProcess.start(
        [PY, "-c", script, *args],
        env=None,
        session_id=f"sess-{uuid.uuid4().hex[:12]}",
        workspace=workspace,
        **kw,
    )


async def all_lines(proc: AgentProcess) -> list[bytes]:
    return [item.line async for item in proc]


# --------------------------------------------------------------------------- DPS-17.2.1-env


@LOOPS
def test_dps_17_2_1_env_rawp_variables_are_set(loop_factory: Any, tmp_path: Path) -> None:
    """DPS-17.2.1-env: RAWP_SESSION_ID, RAWP_WORKSPACE_PATH (absolute), RAWP_DPS_VERSION."""

    async def scenario() -> dict[str, str]:
        script = (
            "import json, os; print(json.dumps({k: v for k, v in os.environ.items()"
            " if k.startswith('RAWP_') or k == 'KEEP'} | {'cwd': os.getcwd()}))"
        )
        proc = await AgentProcess.start(
            [PY, "-c", script],
            env={"KEEP": "1", "RAWP_DPS_VERSION": "wrong"},
            gateway_env={"PATH": os.environ["PATH"]},
            session_id="3f1c2a9e-6b0d-4c7a-9e2f-1a2b3c4d5e6f",
            workspace=tmp_path,
        )
        (line,) = await all_lines(proc)
        assert (await proc.wait()).kind == "ok"
        return json.loads(line)

    seen = run(loop_factory, scenario())
    assert seen == {
        "RAWP_SESSION_ID": "3f1c2a9e-6b0d-4c7a-9e2f-1a2b3c4d5e6f",
        "RAWP_WORKSPACE_PATH": str(tmp_path.resolve()),
        "RAWP_DPS_VERSION": RAWP_DPS_VERSION,
        "KEEP": "1",
        "cwd": str(tmp_path.resolve()),
    }
    assert RAWP_DPS_VERSION == "rawp-dps-1.0"


def test_argv_is_never_passed_through_a_shell(tmp_path: Path) -> None:
    """Shell metacharacters in an argument reach the agent literally, and nothing runs them."""
    marker = tmp_path / "pwned"
    evil = f"x; touch {marker}; $(touch {marker}) `touch {marker}` | cat && echo *"

    async def scenario() -> list[bytes]:
        proc = await spawn("import sys; print(sys.argv[1])", evil)
        lines = await all_lines(proc)
        await proc.wait()
        return lines

    assert run(asyncio.new_event_loop, scenario()) == [evil.encode()]
    assert not marker.exists()


def test_argv_must_be_a_list() -> None:
    async def scenario() -> None:
        with pytest.raises(ValueError, match="no shell"):
            await AgentProcess.start("echo hi", env=None, session_id="s", workspace=".")

    run(asyncio.new_event_loop, scenario())


def test_start_new_session_puts_the_agent_in_its_own_group() -> None:
    async def scenario() -> tuple[int, int, int]:
        proc = await spawn("import os; print(os.getpgrp(), os.getsid(0))")
        (line,) = await all_lines(proc)
        await proc.wait()
        pgrp, sid = map(int, line.split())
        return proc.pid, pgrp, sid

    pid, pgrp, sid = run(asyncio.new_event_loop, scenario())
    assert pid == pgrp == sid
    assert pgrp != os.getpgrp()


def test_missing_executable_is_a_clear_error(tmp_path: Path) -> None:
    async def scenario() -> None:
        with pytest.raises(AgentExecutableNotFound, match="no-such-agent-cli") as info:
            await AgentProcess.start(
                ["no-such-agent-cli", "-p"], env=None, session_id="s", workspace=tmp_path
            )
        assert isinstance(info.value, FileNotFoundError)
        with pytest.raises(AgentStartError, match="working directory"):
            await AgentProcess.start(
                [PY, "-c", "pass"], env=None, session_id="s", workspace=tmp_path / "missing"
            )

    run(asyncio.new_event_loop, scenario())


# --------------------------------------------------------------------------- stdout lines


def test_a_line_of_the_default_max_line_bytes_arrives_whole() -> None:
    """A line of exactly the default limit (32 MiB, 512x the StreamReader default limit) is one
    line, then the stream goes on.

    On uvloop only, the production loop (the stdlib loop reads lines over many chunks in
    test_stdin_write_drain_and_close and the max_line_bytes test), to keep the suite fast.
    """
    size = DEFAULT_MAX_LINE_BYTES

    async def scenario() -> None:
        proc = await spawn(
            "import sys; o = sys.stdout.buffer; o.write(b'{\"a\":\"' + b'x' * (int(sys.argv[1]) - 8)"
            " + b'\"}\\n'); o.write(b'after\\n')",
            str(size),
        )
        t_before = time.perf_counter_ns()
        big = await proc.readline()
        assert big is not None
        assert len(big.line) == size  # 6 + (size - 8) + 2 bytes
        assert big.line.startswith(b'{"a":"xxx') and big.line.endswith(b'xx"}')
        assert big.t_ns >= t_before
        after = await proc.readline()
        assert after is not None and after.line == b"after"
        assert await proc.readline() is None
        assert (await proc.wait()).kind == "ok"

    run(uvloop.new_event_loop, scenario())


@LOOPS
def test_many_small_lines_arrive_in_order(loop_factory: Any) -> None:
    n = 20_000

    async def scenario() -> None:
        proc = await spawn(
            "import sys; sys.stdout.write(''.join(f'{i}\\n' for i in range(int(sys.argv[1]))))",
            str(n),
        )
        lines = await all_lines(proc)
        assert lines == [str(i).encode() for i in range(n)]
        assert proc.lines_read == n
        await proc.wait()

    run(loop_factory, scenario())


@LOOPS
def test_read_times_are_monotonic_and_batches_match_lines(loop_factory: Any) -> None:
    async def scenario() -> None:
        # Each line waits for a go on stdin, given 10 ms after the line before it was read: the
        # reads are apart in time however late a loaded machine runs the agent.
        proc = await spawn(
            "import sys\nfor i in range(5):\n print(i, flush=True)\n sys.stdin.readline()"
        )

        async def pace() -> None:
            for n in range(1, 6):
                await eventually(lambda n=n: proc.lines_read >= n, f"line {n} read")
                await asyncio.sleep(0.01)
                proc.write(b"\n")

        pacer = asyncio.ensure_future(pace())
        items = []
        while batch := await proc.readlines(max_lines=2):
            assert 1 <= len(batch) <= 2
            items += batch
        await pacer
        assert [i.line for i in items] == [b"0", b"1", b"2", b"3", b"4"]
        times = [i.t_ns for i in items]
        assert times == sorted(times) and times[-1] - times[0] >= 40_000_000
        assert proc.at_eof()
        await proc.wait()

    run(loop_factory, scenario())


@LOOPS
def test_deliver_hands_every_line_to_the_consumer_in_batches_and_returns_at_eof(
    loop_factory: Any,
) -> None:
    """``deliver`` calls the consumer with the batches ``readlines`` would return (lines printed
    before it was called included), turns the loop after a full batch, returns after the last."""

    async def scenario() -> None:
        proc = await spawn("import sys\nfor i in range(600): print(i)\nsys.stdout.flush()")
        await eventually(lambda: proc.lines_read == 600, "every line read before the consumer")
        batches: list[list[bytes]] = []
        turns = 0

        async def count_turns() -> None:
            nonlocal turns
            while True:
                await asyncio.sleep(0)
                turns += 1

        counter = asyncio.ensure_future(count_turns())
        seen: list[int] = []
        await proc.deliver(lambda b: (batches.append([i.line for i in b]), seen.append(turns)), 256)
        counter.cancel()
        assert [line for b in batches for line in b] == [str(i).encode() for i in range(600)]
        assert [len(b) for b in batches] == [256, 256, 88]
        assert seen[0] < seen[1] < seen[2]  # the loop turned between two full batches
        assert proc.at_eof()
        await proc.wait()

    run(loop_factory, scenario())


@LOOPS
def test_deliver_raises_what_the_consumer_raised_and_hands_it_nothing_more(
    loop_factory: Any,
) -> None:
    async def scenario() -> None:
        proc = await spawn(PACED, "50", "500")
        calls = 0

        def consumer(batch: list[StdoutLine]) -> None:
            nonlocal calls
            calls += 1
            raise ValueError("consumer broke")

        with pytest.raises(ValueError, match="consumer broke"):
            await proc.deliver(consumer, 8)
        await proc.wait()
        await asyncio.sleep(0.05)
        assert calls == 1
        await proc.aclose()

    run(loop_factory, scenario())


@LOOPS
def test_a_cancelled_deliver_hands_nothing_more(loop_factory: Any) -> None:
    async def scenario() -> None:
        proc = await spawn(PACED, "100", "200")
        got: list[bytes] = []
        task = asyncio.ensure_future(proc.deliver(lambda b: got.extend(i.line for i in b)))
        await eventually(lambda: len(got) >= 5, "the first lines delivered")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        n = len(got)
        await proc.wait()
        assert len(got) == n < 100
        await proc.aclose()

    run(loop_factory, scenario())


# One write(2) per line, paced by a busy wait: N lines at RATE lines/s (as Claude Code's Node.js
# stdout writes each line on its own).
PACED = """
import os, sys, time
n, rate = int(sys.argv[1]), float(sys.argv[2])
start = time.perf_counter()
for i in range(n):
    while time.perf_counter() < start + i / rate:
        pass
    os.write(1, b"%d\\n" % i)
"""


def fd_links() -> list[str]:
    """What the test process's descriptors are (``pipe:[...]``, ``anon_inode:[timerfd]`` ...)."""
    fds = "/proc/self/fd"
    links = []
    for fd in os.listdir(fds):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone already
            links.append(os.readlink(f"{fds}/{fd}"))
    return links


def timerfds() -> int:
    return fd_links().count("anon_inode:[timerfd]")


@LOOPS
def test_lines_at_a_high_rate_all_arrive_in_order_and_the_nap_timer_goes(loop_factory: Any) -> None:
    """Above NAP_BELOW_GAP_NS per line the reader may nap between small batches: whether and how
    often it does depends on how the machine schedules the two processes, so that is not asserted
    here (how much napping gathers is a matter for bench/). What holds whatever the scheduling:
    every line arrives, in order, at most one timer is made, and it goes with the pipes."""
    n = 3000

    async def scenario() -> None:
        proc = await spawn(PACED, str(n), "20000")
        lines: list[bytes] = []
        timers = 0
        while batch := await proc.readlines(BATCH):
            lines += [item.line for item in batch]
            timers = max(timers, timerfds())
        assert lines == [str(i).encode() for i in range(n)]
        assert timers <= 1  # made at the first nap, if there is one, and kept
        await proc.aclose()
        assert timerfds() == 0

    run(loop_factory, scenario())


def test_without_a_timerfd_lines_are_read_as_they_come(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no timer can be made (not Linux, or no descriptor left) the reader does not nap, and
    no line is lost."""

    def no_timer(*args: object) -> None:
        raise OSError("timerfd is not available on this system")

    monkeypatch.setattr(stdout_module, "FineTimer", no_timer)

    async def scenario() -> None:
        proc = await spawn(PACED, "2000", "20000")
        lines = []
        while batch := await proc.readlines(BATCH):
            lines += [item.line for item in batch]
        assert lines == [str(i).encode() for i in range(2000)]
        assert proc.naps == 0
        await proc.wait()

    run(uvloop.new_event_loop, scenario())


@LOOPS
def test_lines_at_a_low_rate_are_handed_out_at_once(loop_factory: Any) -> None:
    """At 200 lines/s no line waits for another: the reader never naps. The agent writes each
    line only when told to, 5 ms after the one before was handed out: a clock-paced writer on a
    loaded machine falls behind and catches up in a burst, which is a high rate."""

    async def scenario() -> None:
        proc = await spawn(
            "import os\nfor i in range(20): os.write(1, b'%d\\n' % i); os.read(0, 1)"
        )
        lines = []
        while batch := await proc.readlines(BATCH):
            lines += [item.line for item in batch]
            await asyncio.sleep(1 / 200)
            proc.write(b"\n")
        assert lines == [str(i).encode() for i in range(20)]
        assert proc.naps == 0
        await proc.wait()

    run(loop_factory, scenario())


@LOOPS
def test_a_nap_never_resumes_a_pipe_paused_by_backpressure(loop_factory: Any) -> None:
    """Lines at a high rate while the consumer lags: the nap's end must not undo the pause that
    keeps memory near high_water."""
    high_water = 16 * 1024

    async def scenario() -> None:
        proc = await spawn(PACED, "20000", "50000", high_water=high_water)
        got = 0
        while batch := await proc.readlines(4):
            got += len(batch)
            if got % 400 < 4:
                await asyncio.sleep(0.02)  # the consumer lags now and then
            # One read chunk may land on top of the mark before the pause takes effect.
            assert proc.queued_bytes <= high_water + 256 * 1024
        assert got == 20000
        assert proc.stdout_pauses > 0
        await proc.wait()

    run(loop_factory, scenario())


def test_last_line_without_newline_is_still_a_line() -> None:
    async def scenario() -> list[bytes]:
        proc = await spawn("import sys; sys.stdout.write('a\\n\\nb\\r\\npartial')")
        lines = await all_lines(proc)
        await proc.wait()
        return lines

    # Only b"\n" splits; an empty line is kept (the parser skips it), b"\r" is left to the parser.
    assert run(asyncio.new_event_loop, scenario()) == [b"a", b"", b"b\r", b"partial"]


def test_a_line_over_max_line_bytes_is_cut_to_its_head_and_counted_not_fatal() -> None:
    """An overlong line, whether it comes in one chunk or in many, is queued as its first
    CUT_HEAD_BYTES with its full size in ``cut``; the lines around it are whole."""

    async def scenario() -> None:
        proc = await spawn(
            "import sys; o = sys.stdout.buffer; o.write(b'ok1\\n' + b'y' * 300000 + b'\\nok2\\n');"
            " o.flush(); o.write(b'z' * 300000); o.flush(); o.write(b'z\\nok3\\n')",
            max_line_bytes=100_000,
        )
        items = [item async for item in proc]
        assert [(item.line, item.cut) for item in items] == [
            (b"ok1", 0),
            (b"y" * CUT_HEAD_BYTES, 300_000),
            (b"ok2", 0),
            (b"z" * CUT_HEAD_BYTES, 300_001),
            (b"ok3", 0),
        ]
        assert proc.lines_cut == 2
        await proc.wait()

    run(asyncio.new_event_loop, scenario())


@LOOPS
def test_deliver_hands_over_lines_split_across_reads_and_cut_lines_as_readline_does(
    loop_factory: Any,
) -> None:
    """The lines a read completes (a partial line's end, an overlong line's cut head) go to
    ``deliver``'s consumer as ``readline`` would return them, in order."""

    async def scenario() -> None:
        proc = await spawn(
            "import sys, time; o = sys.stdout.buffer; o.write(b'ok1\\npar'); o.flush();"
            " time.sleep(0.05); o.write(b'tial\\n' + b'y' * 300000 + b'\\nok2\\n'); o.flush()",
            max_line_bytes=100_000,
        )
        items: list[StdoutLine] = []
        await proc.deliver(items.extend)
        assert [(item.line, item.cut) for item in items] == [
            (b"ok1", 0),
            (b"partial", 0),
            (b"y" * CUT_HEAD_BYTES, 300_000),
            (b"ok2", 0),
        ]
        await proc.wait()

    run(loop_factory, scenario())


@LOOPS
def test_backpressure_pauses_stdout_while_the_consumer_lags(loop_factory: Any) -> None:
    """The pipe is paused when complete lines pile up, so memory stays near high_water."""
    high_water = 64 * 1024

    async def scenario() -> None:
        proc = await spawn(
            "import sys; sys.stdout.write(''.join(f'{i:07}\\n' for i in range(50_000)))",
            high_water=high_water,
        )
        await eventually(
            lambda: proc.stdout_pauses > 0, "a pause of the stdout reader"
        )  # we read nothing meanwhile
        await asyncio.sleep(0.05)  # a paused pipe must stay paused: the queue does not grow
        assert proc.stdout_pauses == 1
        # One read chunk may land on top of the mark before the pause takes effect; two when the
        # agent writes before uvloop has finished setting up the process's transport: it holds what
        # it reads until then and hands both chunks over back to back, the pause coming after the
        # first. Either way the overshoot is bounded by the reads, not by what the agent writes.
        assert proc.queued_bytes <= high_water + 2 * 256 * 1024
        lines = await all_lines(proc)
        assert len(lines) == 50_000 and lines[-1] == b"0049999"
        assert proc.queued_bytes == 0
        assert (await proc.wait()).kind == "ok"

    run(loop_factory, scenario())


# A CLI that ends its run with Node's process.exit(): what its stdout stream could not write yet
# (the pipe was full because the gateway read late) is dropped, the result line behind it too.
# 900 KB: more than the default pipe (64 KiB) or socket pair (about 208 KiB) holds with what the
# gateway reads before backpressure stops it (a chunk or two: uvloop reads 256 KiB at once), less
# than the wide pipe's 1 MiB.
# It waits for a line on stdin before it writes (``began``): the stdlib loop reads what a child
# writes before its transport is connected without backpressure, and would then read it all.
EXITS_DROPPING_THE_REST = """
import os
os.read(0, 1)
os.set_blocking(1, False)
rest = memoryview((b"x" * 1023 + b"\\n") * 900 + b'{"type": "result"}\\n')
while rest:
    try:
        rest = rest[os.write(1, rest):]
    except BlockingIOError:
        break
os._exit(0)
"""


async def began(proc: AgentProcess) -> AgentProcess:
    """Let ``EXITS_DROPPING_THE_REST`` write, now that its reader is connected."""
    proc.write(b"\n")
    await proc.drain()
    return proc


@LOOPS
def test_a_single_turn_agents_wide_stdout_pipe_keeps_what_it_writes_before_exiting(
    loop_factory: Any,
) -> None:
    """Gemini CLI echoes a long prompt (150 KB) before its answer and exits with
    process.exit(): with the default 64 KiB pipe (about 208 KiB on uvloop's socket pair) and a
    gateway that reads late (held here by backpressure, under load by the machine), its answer and
    result were lost and the turn ended with nothing said. The pipe of a single-turn agent holds
    its whole output, on both loops."""

    async def result_line(**kw: Any) -> bool:
        proc = await began(await spawn(EXITS_DROPPING_THE_REST, high_water=1024, **kw))
        await eventually(
            lambda: proc.stdout_pauses == 1,
            "the reader held by backpressure",
            # What the reader saw instead, should it never be held.
            detail=lambda: f"{proc.bytes_read} bytes read, exit {proc.exit_status}",
        )
        assert (await proc.wait()).kind == "ok"
        lines = await all_lines(proc)
        assert all(line == b"x" * 1023 for line in lines[:-1])
        return lines[-1] == b'{"type": "result"}'

    async def scenario() -> None:
        assert not await result_line()  # the loss, as it was
        assert await result_line(stdout_pipe_bytes=WIDE_STDOUT_PIPE_BYTES)

    run(loop_factory, scenario())


def open_pipes() -> int:
    """The gateway's descriptors of pipes and sockets (uvloop opens /dev/null once, for good)."""
    return sum(link.startswith(("pipe:", "socket:")) for link in fd_links())


@LOOPS
def test_wide_stdout_pipes_leave_no_descriptor_or_count_behind(
    loop_factory: Any, tmp_path: Path
) -> None:
    """However an agent with a wide stdout ends (read to its end, dropped with close() after its
    exit or aclose() while it runs, terminated, or never started), the gateway holds as many
    pipes and sockets after as before, and each wide pipe is given back: more agents than
    MAX_WIDE_STDOUT_PIPES one after another all get one."""
    wide: dict[str, Any] = {"stdout_pipe_bytes": WIDE_STDOUT_PIPE_BYTES}
    sleeper = "import time; print('up', flush=True); time.sleep(30)"

    async def scenario() -> None:
        # Each agent's exit is awaited before the next starts: all of them share the session id,
        # so an exit seen late would take the next agent for a descendant of the one before.
        before = open_pipes()
        for _ in range(MAX_WIDE_STDOUT_PIPES // 4 + 1):
            proc = await spawn("print('one')", **wide)
            assert await all_lines(proc) == [b"one"]
            await proc.wait()
            proc = await spawn("print('unread')", **wide)
            await proc.wait()
            proc.close()
            proc = await spawn(sleeper, **wide)
            await proc.readline()
            assert (await proc.aclose()).signal == signal.SIGKILL
            proc = await spawn(sleeper, **wide)
            await proc.readline()
            assert (await proc.terminate(grace=5.0)).signal == signal.SIGTERM
            with pytest.raises(AgentExecutableNotFound):
                await AgentProcess.start(
                    ["no-such-agent-cli"], env=None, session_id="s", workspace=tmp_path, **wide
                )
        await eventually(lambda: open_pipes() == before, "the descriptors to be released")
        # Still wide: the Node-like exit loses nothing.
        proc = await began(await spawn(EXITS_DROPPING_THE_REST, high_water=1024, **wide))
        await eventually(lambda: proc.stdout_pauses == 1, "the reader held by backpressure")
        assert (await proc.wait()).kind == "ok"
        assert (await all_lines(proc))[-1] == b'{"type": "result"}'

    run(loop_factory, scenario())


# --------------------------------------------------------------------------- stdin


@LOOPS
def test_stdin_write_drain_and_close(loop_factory: Any) -> None:
    async def scenario() -> None:
        proc = await spawn(
            "import sys\nfor line in sys.stdin: print(line.strip().upper(), flush=True)\nprint('eof')"
        )
        proc.write(b'{"type":"user"}\n')
        await proc.drain()
        first = await proc.readline()
        assert first is not None and first.line == b'{"TYPE":"USER"}'
        # More than any pipe buffer: drain() has to wait for the child to read.
        proc.write(b"x" * 1_000_000 + b"\n")
        await proc.drain()
        proc.close_stdin()
        with pytest.raises(AgentProcessError, match="closed"):
            proc.write(b"late\n")
        rest = await all_lines(proc)
        assert rest == [b"X" * 1_000_000, b"eof"]
        assert (await proc.wait()).kind == "ok"

    run(loop_factory, scenario())


@LOOPS
def test_stdin_of_an_agent_that_closed_it_is_a_broken_pipe_not_a_hang(loop_factory: Any) -> None:
    """The agent closes its stdin and runs on: a write past the pipe's buffer breaks it, and from
    then on write() and drain() raise AgentProcessError instead of waiting for a reader."""

    async def scenario() -> None:
        proc = await spawn(
            "import os, sys, time\nos.close(0)\nprint('closed', flush=True)\ntime.sleep(30)"
        )
        assert (await proc.readline()) is not None
        chunk = b"x" * 65536
        with pytest.raises(AgentProcessError, match="broken"):
            for _ in range(64):  # 4 MiB: more than any pipe buffer holds
                proc.write(chunk)
                await proc.drain()
                await asyncio.sleep(0)
        with pytest.raises(AgentProcessError, match="broken"):
            proc.write(b"more\n")
        with pytest.raises(AgentProcessError, match="broken"):
            await proc.drain()
        await proc.aclose()

    run(loop_factory, scenario())


# --------------------------------------------------------------------------- stderr


@LOOPS
def test_stderr_is_drained_into_a_bounded_tail(loop_factory: Any) -> None:
    """1 MiB of stderr cannot stall the agent; the last bytes are kept for agent.error.details."""

    async def scenario() -> None:
        proc = await spawn(
            "import sys; sys.stderr.write('e' * (1 << 20) + 'Error: boom\\n'); print('done')",
            stderr_limit=4096,
        )
        assert await all_lines(proc) == [b"done"]
        await proc.wait()
        tail = proc.stderr_tail()
        assert len(tail) == 4096
        assert tail.endswith("Error: boom\n")
        assert proc.stderr_truncated and proc.stderr_bytes == (1 << 20) + 12

    run(loop_factory, scenario())


def test_stderr_tail_survives_invalid_utf8() -> None:
    async def scenario() -> str:
        proc = await spawn("import sys; sys.stderr.buffer.write(b'bad \\xff byte')")
        await proc.wait()
        # stderr may close just after the exit is reported
        await eventually(lambda: proc.stderr_tail() != "", "stderr to be read")
        return proc.stderr_tail()

    assert run(asyncio.new_event_loop, scenario()) == "bad \ufffd byte"


# --------------------------------------------------------------------------- DPS-17.2.2-exit


@pytest.mark.parametrize(
    ("returncode", "expected"),
    [
        (0, ExitStatus(returncode=0, signal=None, kind="ok")),
        (1, ExitStatus(returncode=1, signal=None, kind="error")),
        (3, ExitStatus(returncode=3, signal=None, kind="error")),
        (127, ExitStatus(returncode=127, signal=None, kind="error")),
        (128, ExitStatus(returncode=128, signal=None, kind="error")),
        (130, ExitStatus(returncode=130, signal=2, kind="signal")),
        (137, ExitStatus(returncode=137, signal=9, kind="signal")),
        (143, ExitStatus(returncode=143, signal=15, kind="signal")),
        (255, ExitStatus(returncode=255, signal=None, kind="error")),
        (-9, ExitStatus(returncode=-9, signal=9, kind="signal")),
        (-15, ExitStatus(returncode=-15, signal=15, kind="signal")),
    ],
)
def test_dps_17_2_2_exit_classify_exit_table(returncode: int, expected: ExitStatus) -> None:
    """DPS-17.2.2-exit: 0 ok, 1-127 error, 128+N or killed by N -> signal N."""
    assert classify_exit(returncode) == expected


def test_dps_17_2_2_exit_status_is_frozen_and_describes_itself() -> None:
    status = classify_exit(143)
    with pytest.raises(AttributeError):
        status.kind = "ok"  # type: ignore[misc]
    assert status.signal_name == "SIGTERM"
    assert status.describe() == "agent exited with code 143 (SIGTERM)"
    assert classify_exit(-9).describe() == "agent was killed by SIGKILL"
    assert classify_exit(3).describe() == "agent exited with code 3"


@LOOPS
@pytest.mark.parametrize(
    ("script", "returncode", "kind", "signo"),
    [
        ("pass", 0, "ok", None),
        ("raise SystemExit(3)", 3, "error", None),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -15, "signal", 15),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9, "signal", 9),
        ("raise SystemExit(143)", 143, "signal", 15),  # what Claude Code does on SIGTERM
        ("raise SystemExit(137)", 137, "signal", 9),
    ],
    ids=["exit0", "exit3", "sigterm", "sigkill", "exit143", "exit137"],
)
def test_dps_17_2_2_exit_mapping_of_real_processes(
    loop_factory: Any, script: str, returncode: int, kind: str, signo: int | None
) -> None:
    """DPS-17.2.2-exit with real exits, signals included (negative returncode and 128+N)."""

    async def scenario() -> ExitStatus:
        proc = await spawn(script)
        status = await proc.wait()
        assert proc.returncode == returncode and proc.exit_status == status
        return status

    assert run(loop_factory, scenario()) == ExitStatus(
        returncode=returncode, signal=signo, kind=kind
    )  # type: ignore[arg-type]


# --------------------------------------------------------------------------- DPS-17.2.3-signals

# A leader that ignores SIGTERM and starts a grandchild (same group) that ignores it too.
STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True);"
    " time.sleep(60)"], stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(60)
"""

# A leader that dies on SIGTERM, leaving a grandchild that ignores it.
LEAVES_ORPHAN = STUBBORN.replace("signal.signal(signal.SIGTERM, signal.SIG_IGN)\nchild", "child", 1)


@LOOPS
def test_dps_17_2_3_signals_terminate_escalates_to_sigkill_for_the_whole_group(
    loop_factory: Any,
) -> None:
    """DPS-17.2.3-signals: SIGTERM, then SIGKILL to the group after the grace period."""

    async def scenario() -> None:
        proc = await spawn(STUBBORN)
        first = await proc.readline()
        assert first is not None
        grandchild = int(first.line)
        assert alive(grandchild)
        t0 = time.monotonic()
        status = await proc.terminate(grace=0.3)
        elapsed = time.monotonic() - t0
        assert status == ExitStatus(returncode=-9, signal=9, kind="signal")
        assert elapsed >= 0.3
        await eventually(lambda: not alive(grandchild), "the grandchild to be gone")
        assert proc.pid not in live_groups()

    run(loop_factory, scenario())


@LOOPS
def test_dps_17_2_3_signals_sigterm_is_enough_for_a_well_behaved_agent(loop_factory: Any) -> None:
    """DPS-17.2.3-signals: an agent that exits on SIGTERM is not killed, nor kept waiting."""

    async def scenario() -> None:
        proc = await spawn("import time; print('up', flush=True); time.sleep(60)")
        await proc.readline()
        # A grace far longer than run()'s bound: waiting it out would fail the test, so ending
        # at all proves terminate returned on the exit, not on the grace.
        status = await proc.terminate(grace=600.0)
        assert status == ExitStatus(returncode=-15, signal=15, kind="signal")
        assert proc.pid not in live_groups()
        assert not proc.send_signal(signal.SIGTERM)  # nothing left to signal

    run(loop_factory, scenario())


def test_dps_17_2_3_signals_group_members_outliving_the_agent_die_at_the_deadline() -> None:
    """DPS-17.2.3-signals: a grandchild ignoring SIGTERM gets SIGKILL when the grace ends."""

    async def scenario() -> None:
        proc = await spawn(LEAVES_ORPHAN)
        first = await proc.readline()
        assert first is not None
        grandchild = int(first.line)
        status = await proc.terminate(grace=0.6)
        assert status.signal == signal.SIGTERM
        assert alive(grandchild)  # the agent went at once; its straggler still has time
        assert proc.pid in live_groups()
        await eventually(lambda: not alive(grandchild), "the grandchild to be gone")
        assert proc.pid not in live_groups()

    run(asyncio.new_event_loop, scenario())


def test_send_signal_reaches_the_whole_group() -> None:
    async def scenario() -> None:
        proc = await spawn(
            "import subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(c.pid, flush=True); time.sleep(60)"
        )
        first = await proc.readline()
        assert first is not None
        grandchild = int(first.line)
        assert proc.send_signal(signal.SIGKILL)
        assert (await proc.wait()).signal == signal.SIGKILL
        await eventually(lambda: not alive(grandchild), "the grandchild to be gone")

    run(asyncio.new_event_loop, scenario())


# --------------------------------------------------------------------------- no agent outlives us


def test_registry_terminate_all_and_kill_all_groups() -> None:
    """Shutdown terminates every live agent; the atexit fallback SIGKILLs what is left."""

    async def scenario() -> None:
        a = await spawn("import time; print('up', flush=True); time.sleep(60)")
        b = await spawn(STUBBORN)
        await a.readline()
        await b.readline()
        assert {a.pid, b.pid} <= set(live_groups())
        await terminate_all(grace=0.2)
        assert (await a.wait()).signal == signal.SIGTERM
        assert (await b.wait()).signal == signal.SIGKILL
        assert not {a.pid, b.pid} & set(live_groups())

        c = await spawn("import time; time.sleep(60)")
        kill_all_groups()  # synchronous: what atexit runs
        assert (await c.wait()).signal == signal.SIGKILL
        assert c.pid not in live_groups()

    run(asyncio.new_event_loop, scenario())


def test_no_agent_outlives_a_gateway_that_exits(tmp_path: Path) -> None:
    """A gateway process that exits without cleaning up still takes its agents along (atexit)."""
    pidfile = tmp_path / "pid"
    none_outlive_the_gateway(
        f'[sys.executable, "-c", {STUBBORN!r}], env=None, session_id="s", workspace="."',
        f"""
        line = await p.readline()
        open({str(pidfile)!r}, "w").write(f"{{p.pid}} {{int(line.line)}}")
        """,
        pidfile,
    )


def test_aclose_kills_a_running_group_and_releases_the_pipes() -> None:
    """aclose() is for dropping an agent without reading it to the end; it never leaks a group."""

    async def scenario() -> None:
        proc = await spawn(STUBBORN)
        first = await proc.readline()
        assert first is not None
        grandchild = int(first.line)
        assert (await proc.aclose()).signal == signal.SIGKILL
        proc.close()  # idempotent
        assert proc.pid not in live_groups()
        with pytest.raises(AgentProcessError):
            proc.write(b"x\n")
        await eventually(lambda: not alive(grandchild), "the grandchild to be gone")

    run(asyncio.new_event_loop, scenario())


def test_close_releases_unread_output_of_an_exited_or_blocked_agent() -> None:
    """A consumer that stops reading (stdout paused, lines queued) can still release everything."""

    async def scenario() -> None:
        # Fits in the pipe: the agent exits while we have paused reading it. It exits only once
        # the pause is seen (at the end of its stdin): from its exit on, its output is read for
        # EXIT_DRAIN_SEC at most, and a loaded machine may not have read the first lines by then.
        proc = await spawn(
            "import sys; sys.stdout.write(('x' * 9 + '\\n') * 3000 + '\\n' * 2000);"
            " sys.stdout.flush(); sys.stdin.read()",
            high_water=1024,
        )
        await eventually(lambda: proc.stdout_pauses == 1, "one pause of the stdout reader")
        proc.close_stdin()
        status = await proc.wait()
        assert status.kind == "ok" and not proc.at_eof()
        proc.close()
        # Does not fit: the agent blocks on a full pipe and never exits by itself.
        proc = await spawn("import sys; sys.stdout.write('y\\n' * 1_000_000)", high_water=1024)
        await eventually(lambda: proc.stdout_pauses == 1, "one pause of the stdout reader")
        await asyncio.sleep(0.05)
        assert proc.returncode is None
        assert (await proc.aclose()).signal == signal.SIGKILL

    run(asyncio.new_event_loop, scenario())
