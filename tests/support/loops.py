"""Running one scenario on both event loops the gateway meets: the stdlib loop most tests use and
uvloop, which production runs on and which drives subprocess pipes with different code."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from tests.support.paths import HOSTILE

PY = sys.executable
LOOPS = pytest.mark.parametrize(
    "loop_factory",
    [asyncio.new_event_loop, uvloop.new_event_loop],
    ids=["asyncio", "uvloop"],
)

# The hostile agent that leaves a descendant behind, and the ways it can hide it (see the script).
HOSTILE = str(HOSTILE / "leaves_descendant.py")
HOWS = ["group", "setsid", "devnull", "daemon"]


def run(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], coro: Coroutine[Any, Any, Any]
) -> Any:
    """Run ``coro`` to its end on a new loop of ``loop_factory``, bounded at 20 s."""
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(asyncio.wait_for(coro, 20))
