"""An agent's exit is its own, whatever its descendants do (gateway.agent.process, real processes).

The hostile agent (``tests/support/hostile/leaves_descendant.py``) leaves a descendant behind that ignores
SIGTERM and sleeps 120 s: in its process group holding stdout, in a session of its own holding
stdout, in its own session with fds 0-2 on /dev/null, or as a double-forked daemon. In every case
the agent's output is read to its last line, stdout ends although the descendant may still hold it,
the descendant is killed when the grace ends, and, as the gateway is its subreaper, reaped. Each
scenario runs on the stdlib loop and on uvloop (production).
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from gateway.agent.descendants import kill_all_groups, live_groups
from gateway.agent.process import EXIT_DRAIN_SEC, WIDE_STDOUT_PIPE_BYTES, AgentProcess
from tests.support.gateway_exit import none_outlive_the_gateway
from tests.support.loops import HOSTILE, HOWS, LOOPS, PY, run
from tests.support.procs import alive, gone
from tests.support.waiting import eventually

# Both kinds of stdout: the loop's own, and the wide pipe the gateway makes for a single-turn agent.
STDOUTS = pytest.mark.parametrize(
    "stdout_pipe_bytes", [0, WIDE_STDOUT_PIPE_BYTES], ids=["loop-stdout", "wide-stdout"]
)


async def hostile(
    tmp_path: Path, how: str, *flags: str, grace: float = 0.5, stdout_pipe_bytes: int = 0
) -> AgentProcess:
    return await AgentProcess.start(
        [PY, HOSTILE, how, "--ignore-term", *flags],
        env=None,
        session_id="hostile-1",
        workspace=tmp_path,
        grace=grace,
        stdout_pipe_bytes=stdout_pipe_bytes,
    )


@LOOPS
@STDOUTS
def test_an_agent_gets_exactly_fds_0_1_2(
    loop_factory: Any, stdout_pipe_bytes: int, tmp_path: Path
) -> None:
    """Nothing of the gateway leaks into the agent: no socket pair, no pipe of another agent, not
    the read end of its own wide stdout."""

    async def scenario() -> list[str]:
        other = await AgentProcess.start(
            [PY, "-c", "import time; time.sleep(30)"],
            env=None,
            session_id="s",
            workspace=tmp_path,
            stdout_pipe_bytes=stdout_pipe_bytes,
        )
        proc = await AgentProcess.start(
            [PY, "-c", "import json, os; print(json.dumps(os.listdir('/proc/self/fd')))"],
            env=None,
            session_id="s",
            workspace=tmp_path,
            stdout_pipe_bytes=stdout_pipe_bytes,
        )
        line = await proc.readline()
        assert line is not None
        await proc.wait()
        await other.aclose()
        return json.loads(line.line)

    fds = run(loop_factory, scenario())
    fds.remove("3")  # the directory listdir itself had open
    assert sorted(fds) == ["0", "1", "2"]


@LOOPS
@STDOUTS
@pytest.mark.parametrize("how", HOWS)
def test_exit_ends_the_output_whatever_a_descendant_holds(
    loop_factory: Any, stdout_pipe_bytes: int, how: str, tmp_path: Path
) -> None:
    """The agent exits 0 leaving a descendant that ignores SIGTERM (and may hold stdout): every
    line it printed arrives, then EOF (at most EXIT_DRAIN_SEC after the exit, not 120 s later);
    the descendant is killed when the grace ends and reaped."""

    async def scenario() -> None:
        proc = await hostile(tmp_path, how, stdout_pipe_bytes=stdout_pipe_bytes)
        lines = [item.line async for item in proc]  # EOF, although the descendant may hold it
        assert lines == [b"working", b"done"]
        assert (await proc.wait()).kind == "ok"
        descendant = int((tmp_path / "descendant.pid").read_text())
        await eventually(lambda: gone(descendant), "the descendant to be reaped", timeout=10)
        assert proc.pid not in live_groups()

    run(loop_factory, scenario())


@LOOPS
@STDOUTS
@pytest.mark.parametrize("how", HOWS)
def test_terminate_reaches_descendants_that_left_the_group(
    loop_factory: Any, stdout_pipe_bytes: int, how: str, tmp_path: Path
) -> None:
    """DPS-17.2.3-signals: terminate() stops the agent and, by the end of the grace, every
    descendant, wherever it went; the output ends by then too."""

    async def scenario() -> None:
        proc = await hostile(
            tmp_path, how, "--stay", grace=5.0, stdout_pipe_bytes=stdout_pipe_bytes
        )
        assert (await proc.readline()).line == b"working"  # type: ignore[union-attr]
        assert (await proc.readline()).line == b"done"  # type: ignore[union-attr]
        descendant = int((tmp_path / "descendant.pid").read_text())
        assert alive(descendant)
        status = await proc.terminate(grace=0.5)
        assert status.signal == signal.SIGTERM
        assert await proc.readline() is None
        await eventually(lambda: gone(descendant), "the descendant to be reaped", timeout=10)
        assert proc.pid not in live_groups()

    run(loop_factory, scenario())


def test_the_drain_after_exit_is_bounded(tmp_path: Path) -> None:
    """A descendant in the group that ignores SIGTERM and holds stdout, with a 60 s grace before
    its SIGKILL: stdout still ends (EXIT_DRAIN_SEC after the exit, within the test's 20 s limit)
    with every line the agent printed, while the descendant still lives."""

    async def scenario() -> None:
        proc = await hostile(tmp_path, "group", grace=60.0)
        lines = [item.line async for item in proc]
        assert (await proc.wait()).kind == "ok" and lines == [b"working", b"done"]
        descendant = int((tmp_path / "descendant.pid").read_text())
        assert alive(descendant)
        # Terminating what is left shortens its deadline to the new grace.
        await proc.terminate(grace=0.2)
        await eventually(lambda: gone(descendant), "the descendant to be reaped", timeout=10)
        assert proc.pid not in live_groups()

    assert EXIT_DRAIN_SEC < 20
    run(asyncio.new_event_loop, scenario())


def test_no_descendant_outlives_a_gateway_that_exits(tmp_path: Path) -> None:
    """The atexit fallback reaches a daemon that left the agent's group and session."""
    pidfile = tmp_path / "pids"
    none_outlive_the_gateway(
        f'[sys.executable, {HOSTILE!r}, "daemon", "--ignore-term", "--stay"], '
        f'env=None, session_id="s", workspace={str(tmp_path)!r}',
        f"""
        await p.readline(); await p.readline()
        daemon = open({str(tmp_path / "descendant.pid")!r}).read()
        open({str(pidfile)!r}, "w").write(f"{{p.pid}} {{daemon}}")
        """,
        pidfile,
    )


def test_kill_all_groups_reaches_escaped_descendants(tmp_path: Path) -> None:
    async def scenario() -> None:
        proc = await hostile(tmp_path, "devnull", "--stay", grace=60.0)
        await proc.readline()
        await proc.readline()
        descendant = int((tmp_path / "descendant.pid").read_text())
        kill_all_groups()
        assert (await proc.wait()).signal == signal.SIGKILL
        await eventually(lambda: gone(descendant), "the descendant to be reaped", timeout=10)

    run(asyncio.new_event_loop, scenario())


def test_the_drain_waits_for_a_consumer_that_is_behind(tmp_path: Path) -> None:
    """The agent writes more than the high-water mark and exits; the consumer reads nothing for
    longer than EXIT_DRAIN_SEC: what was in the pipe was the agent's own output, and all of it
    arrives."""

    async def scenario() -> None:
        proc = await AgentProcess.start(
            # One write per line (flushed): reading pauses early, the rest waits in the pipe.
            [PY, "-c", "import sys\nfor _ in range(5000): print('x' * 9, flush=True)"],
            env=None,
            session_id="s",
            workspace=tmp_path,
            high_water=1024,
        )
        assert (await proc.wait()).kind == "ok"
        await eventually(lambda: proc.stdout_pauses >= 1, "a pause of the stdout reader")
        await asyncio.sleep(EXIT_DRAIN_SEC + 0.5)
        lines = [item.line async for item in proc]
        assert lines == [b"x" * 9] * 5000

    run(asyncio.new_event_loop, scenario())
