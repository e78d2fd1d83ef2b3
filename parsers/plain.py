"""Any line-oriented program: each stdout line becomes text.

Theory of operation
-------------------
The least a program has to do to be wrapped by the gateway is print lines. ``PlainParser`` makes
every line a text delta (with its newline, so the block's ``full_text`` is the output as printed)
of one block per run; the block ends with the turn. It never produces a ``TurnEnded``: the turn
ends when the process exits (exit 0 → ``end_turn``, anything else → ``agent.error``), which is
why a plain profile is a single-turn process. Bytes that are not UTF-8 are replaced, never fatal.

``PlainInput`` writes a prompt as one line on stdin, for a program that reads its prompt there
rather than from its arguments (a profile whose command has no ``{prompt}``); it has no way to
interrupt (cancel is SIGINT), answer permissions or change modes.
"""

from __future__ import annotations

from typing import Final

from . import events as ev
from .base import NoInput, ParserSpec

__all__ = ["SPEC", "PlainInput", "PlainParser"]


class PlainParser:
    """Each line a text delta of the run's one block (see the module docstring)."""

    __slots__ = ("_block", "_runs")

    def __init__(self) -> None:
        self._block: str | None = None
        self._runs = 0

    def feed(self, line: bytes) -> list[ev.AgentEvent]:
        if self._block is None:
            self._runs += 1
            self._block = f"out-{self._runs}"
        return [ev.TextDelta(block=self._block, text=line.decode("utf-8", "replace") + "\n")]

    def end(self) -> list[ev.AgentEvent]:
        # The block is the mapper's to end with the turn (is_cancelled when it was cancelled).
        self._block = None
        return []


class PlainInput(NoInput):
    """A prompt is one line on stdin; nothing else can be said to a plain program."""

    def prompt(self, text: str) -> bytes | None:
        # One line: newlines inside the prompt would make it several prompts to a line reader.
        return text.replace("\r", " ").replace("\n", " ").encode() + b"\n"


SPEC: Final = ParserSpec(
    name="plain",
    parser=PlainParser,
    input=PlainInput,
    description="Any line-oriented program: every stdout line becomes text",
)
