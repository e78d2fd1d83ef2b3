"""``eventually``: the one way the tests wait for a condition they cannot await."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    check: Callable[[], T],
    what: str,
    timeout: float = 10.0,
    *,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll ``check`` until it returns something true and return that; past ``timeout`` seconds
    fail the test naming ``what``, and what ``detail`` says of the state instead (a loaded machine
    is slow, not wrong: the timeout is a bound on a hang, not a measure)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if loop.time() > end:
            seen = f" ({detail()})" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{seen}")
        await asyncio.sleep(0.01)
