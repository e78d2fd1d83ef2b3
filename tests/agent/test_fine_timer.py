"""FineTimer: a one-shot timer below uvloop's millisecond resolution (gateway/agent/fine_timer.py)."""

from __future__ import annotations

import asyncio
import os
import time

import uvloop

from gateway.agent.fine_timer import FineTimer


def run(coro):
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(asyncio.wait_for(coro, 20))


def test_fires_once_and_never_before_its_delay():
    async def scenario():
        loop = asyncio.get_running_loop()
        fired: list[int] = []
        timer = FineTimer(loop, lambda: fired.append(time.monotonic_ns()))
        start = time.monotonic_ns()
        timer.start(0.0003)  # under uvloop's millisecond: call_later would fire at once
        while not fired:
            await asyncio.sleep(0)
        assert fired[0] - start >= 300_000
        await asyncio.sleep(0.01)
        assert len(fired) == 1  # one-shot
        timer.close()

    run(scenario())


def test_cancel_and_rearm_drop_the_earlier_expiry():
    async def scenario():
        loop = asyncio.get_running_loop()
        fired: list[str] = []
        timer = FineTimer(loop, lambda: fired.append("x"))
        timer.start(0.001)
        timer.cancel()
        await asyncio.sleep(0.02)
        assert fired == []
        timer.start(0.001)
        timer.start(0.002)  # re-armed: fires once, for the second start
        await asyncio.sleep(0.03)
        assert fired == ["x"]
        timer.close()

    run(scenario())


def test_close_releases_the_descriptor():
    async def scenario():
        before = len(os.listdir("/proc/self/fd"))
        timer = FineTimer(asyncio.get_running_loop(), lambda: None)
        assert len(os.listdir("/proc/self/fd")) == before + 1
        timer.start(0.001)
        timer.close()
        timer.close()  # twice is harmless
        assert timer.closed
        assert len(os.listdir("/proc/self/fd")) == before

    run(scenario())
