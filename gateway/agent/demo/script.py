"""The demo's "model": a few deterministic rules on the prompt text (`choose_action`), the prompt as
it came (`Prompt`), and what it says it got first (`split_attachments`, `acknowledge`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from gateway.agent.demo import ALL_TOOLS, ATTACHED_HEADER, DEFAULT_FILE_CONTENT
from gateway.agent.demo.tools import ToolError, image_info, inside_workspace

_ATTACHED_IMAGE = re.compile(r"^- (.+) \((\S+), attached as an image\)$")
_ATTACHED_FILE = re.compile(r"^- (\S.*) \((\S+), (\d+) bytes\)$")


@dataclass(frozen=True, slots=True)
class Action:
    """What the demo model does with a prompt: an optional tool call and whether it thinks first."""

    think: bool
    tool: str | None  # "Glob", "Read", "Write" or None
    path: str | None = None  # for Read/Write, as written in the prompt
    content: str | None = None  # for Write


_FILE_TOKEN = re.compile(r"""["'`]?([~\w./-]*[\w-]\.\w+|[~.]?/[\w./-]+)["'`]?""")
_QUOTED = re.compile(r"""["“]([^"”]+)["”]""")


def _file_after(prompt: str, verbs: str) -> str | None:
    """The first path-looking token after one of `verbs` (e.g. "write hello.txt" -> "hello.txt")."""
    m = re.search(rf"\b(?:{verbs})\b(.*)", prompt, re.IGNORECASE | re.DOTALL)
    if not m:
        return None
    for tok in _FILE_TOKEN.finditer(m.group(1)):
        path = tok.group(1).rstrip(".")
        if path and path not in (".", ".."):
            return path
    return None


@dataclass(frozen=True, slots=True)
class Prompt:
    """One user message: its text and the bytes of its image blocks (media type, data)."""

    text: str
    images: tuple[tuple[str, bytes], ...] = ()


def split_attachments(text: str) -> tuple[str, list[str]]:
    """The request without the gateway's "Attached files:" list, and that list's lines."""
    at = text.rfind(ATTACHED_HEADER)
    if at < 0:
        return text, []
    lines = text[at + len(ATTACHED_HEADER) :].split("\n")
    if not all(line.startswith("- ") for line in lines):
        return text, []
    return text[:at], lines


def acknowledge(
    workspace: str, attached: list[str], images: tuple[tuple[str, bytes], ...]
) -> list[str]:
    """What the demo says it got: each image block (named from the list, in order) with its size,
    and each file the gateway put into the workspace."""
    names = [m.group(1) for line in attached if (m := _ATTACHED_IMAGE.match(line))]
    notes = []
    for i, (_, data) in enumerate(images):
        name = names[i] if i < len(names) else f"number {i + 1}"
        info = image_info(data)
        if info is None:
            notes.append(f"I got an image {name} that I cannot read.")
        else:
            notes.append(f"I see the image {name} ({info[1]}x{info[2]}).")
    for line in attached:
        m = _ATTACHED_FILE.match(line)
        if m is None:
            continue
        path = m.group(1)
        try:
            size = os.path.getsize(inside_workspace(workspace, path))
        except (ToolError, OSError):
            notes.append(f"I cannot find the attached file {path}.")
        else:
            notes.append(f"I see the file {path} ({size} bytes).")
    return notes


_SPEND = re.compile(r"^\s*spend\s+\$?([0-9]{1,6}(?:\.[0-9]{1,6})?)\s*$", re.I)


def spent_usd(prompt: str) -> float | None:
    """``spend 1.50``: the USD the demo says the turn cost (its budgets can then be tried); None
    for any other prompt."""
    m = _SPEND.match(prompt)
    return float(m.group(1)) if m else None


def choose_action(prompt: str, tools: tuple[str, ...] = ALL_TOOLS) -> Action:
    """Deterministic rules standing in for a model. Pure."""
    low = prompt.lower()
    think = "think" in low
    if "Write" in tools and re.search(r"\b(write|create)\b", low):
        path = _file_after(prompt, "write|create") or "hello.txt"
        quoted = _QUOTED.search(prompt)
        content = quoted.group(1) + "\n" if quoted else DEFAULT_FILE_CONTENT
        return Action(think, "Write", path, content)
    if "Read" in tools and re.search(r"\bread\b", low):
        target = _file_after(prompt, "read")
        if target:
            return Action(think, "Read", target)
    if "Glob" in tools and ("list" in low or "files" in low):
        return Action(think, "Glob")
    return Action(think, None)
