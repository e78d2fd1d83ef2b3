"""``rawp-gateway chat`` run by a test: piped input, its screen as text."""

from __future__ import annotations

import asyncio
import io
import os
from typing import Any

from gateway.chat import run_chat
from tests.support.waiting import eventually


async def piped_chat(url: str, stdin: str, **kw: Any) -> tuple[int, str]:
    """The chat on ``url`` reading ``stdin`` to its end (agent "demo" unless given); its exit
    status and everything it printed."""
    out = io.StringIO()
    kw.setdefault("agent", "demo")
    kw.setdefault("reattach_delays", (0.05, 0.2))
    rc = await asyncio.wait_for(
        run_chat(url, stdin=io.StringIO(stdin), stdout=out, **kw), timeout=30
    )
    return rc, out.getvalue()


class Pipe:
    """A real pipe as stdin: the chat reads it as it would a terminal, lines written as typed."""

    def __init__(self) -> None:
        r, self.w = os.pipe()
        self.reader = open(r, encoding="utf-8")  # noqa: SIM115 - closed by close()

    def type(self, line: str) -> None:
        os.write(self.w, (line + "\n").encode())

    def close(self) -> None:
        """End of input (like Ctrl-D); the read end is closed once the chat is done with it."""
        os.close(self.w)


async def shown(
    out: io.StringIO, text: str, times: int = 1, task: asyncio.Task[Any] | None = None
) -> None:
    """Until ``text`` is on the chat's screen (``times`` times); fails at once if ``task`` (the
    chat) ends first."""

    def there() -> bool:
        assert task is None or not task.done(), out.getvalue()
        return out.getvalue().count(text) >= times

    await eventually(there, repr(text), timeout=20)


def demo_ui_args(workspace_root: Any) -> Any:
    """``rawp-gateway demo --ui --workspace-root DIR``'s arguments, parsed as the command does."""
    import argparse

    from gateway.chat import add_chat_arguments

    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace-root")
    parser.add_argument("--ui", action="store_true")
    add_chat_arguments(parser, with_url=False)
    return parser.parse_args(["--workspace-root", str(workspace_root), "--ui"])
