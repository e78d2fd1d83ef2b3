"""What parser tests share: JSON lines fed to a parser as the CLI prints them, and a workspace in
memory for what a parser reads from the workspace (file changes, diffs)."""

from __future__ import annotations

import json
from typing import Any

from parsers import events as ev
from parsers.base import AgentParser


def line(obj: dict[str, Any]) -> bytes:
    """One stdout line, compact as the CLIs print it."""
    return json.dumps(obj, separators=(",", ":")).encode()


def feed(parser: AgentParser, *objs: dict[str, Any]) -> list[ev.AgentEvent]:
    """What the parser makes of these lines, one after another."""
    out: list[ev.AgentEvent] = []
    for obj in objs:
        out += parser.feed(line(obj))
    return out


def tokens(
    input_: int, output: int, cache_read: int, cache_write: int, thinking: int
) -> ev.UsageInfo:
    """A usage of these counts, in the order of DPS ``token_usage``."""
    return ev.UsageInfo(
        input_tokens=input_,
        output_tokens=output,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
        thinking_tokens=thinking,
    )


def whole_text(block: str, text: str) -> list[ev.AgentEvent]:
    """A text block said in one piece: its text, then its end."""
    return [ev.TextDelta(block=block, text=text), ev.TextEnd(block=block)]


def whole_thinking(block: str, text: str) -> list[ev.AgentEvent]:
    """A thinking block said in one piece: its text, then its end."""
    return [ev.ThinkingDelta(block=block, text=text), ev.ThinkingEnd(block=block)]


class Files:
    """Paths to texts; ``root`` goes before each name given. A path it does not hold is not
    found, as on disk; tests change ``files`` between a parser's reads."""

    def __init__(self, root: str = "", /, **files: str) -> None:
        self.files = {f"{root}{k}": v for k, v in files.items()}

    def read(self, path: str) -> str | None:
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path]
