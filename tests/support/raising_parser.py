"""A third-party parser with a bug, as a package would register it (``rawp_gateway.parsers``): it
reads ``tests/support/hostile/breaks_parser.py``'s lines like ``plain`` does, ends a turn at
``DONE``, and raises on a line ``BOOM`` (the message is long, to show the gateway bounds it). Once
it has raised it is broken for good, as a plugin with a bug may be: it raises on every line after,
so a session that reads its agent again must have made a fresh one.

``register(directory)`` writes a distribution's metadata naming it under the entry-point group, for
a test to put ``directory`` on ``sys.path``: the same lookup as for an installed package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from parsers import events as ev
from parsers.base import ENTRY_POINT_GROUP, ParserSpec
from parsers.plain import PlainInput

NAME: Final = "raises-on-boom"
TRIGGER: Final = b"BOOM"
MESSAGE: Final = "cannot read this line " + "x" * 2000


class ParserBug(Exception):
    """What the parser raises: a type of its own, named with its module in the error."""


class RaisingParser:
    def __init__(self) -> None:
        self._block: str | None = None
        self._blocks = 0
        self._broken = False

    def feed(self, line: bytes) -> list[ev.AgentEvent]:
        if line == TRIGGER or self._broken:
            self._broken = True
            raise ParserBug(MESSAGE)
        if line == b"DONE":
            self._block = None
            return [ev.TurnEnded(stop_reason="end_turn", usage=ev.UsageInfo())]
        if self._block is None:
            self._blocks += 1
            self._block = f"b{self._blocks}"
        return [ev.TextDelta(block=self._block, text=line.decode() + "\n")]

    def end(self) -> list[ev.AgentEvent]:
        self._block = None
        return []


SPEC: Final = ParserSpec(name=NAME, parser=RaisingParser, input=PlainInput)


def register(directory: Path) -> None:
    """A distribution in ``directory`` whose entry point names ``SPEC``."""
    info = directory / "raising_parser-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: raising-parser\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{NAME} = {__name__}:SPEC\n")
