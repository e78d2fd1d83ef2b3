"""How each agent is handed its session's MCP servers (docs/mcp.md), and where it says what became
of them beyond its own report.

Theory of operation
-------------------
``kinds_of(profile)`` is what a profile takes: its own ``mcp_kinds`` when it says (the demo agent
takes none), else its parser's (``KINDS_BY_PARSER``). ``delivery(profile, specs, home)`` renders,
purely, what the agent needs for the servers of a kind it takes: argv flags and files to write
into the session's HOME (``Delivery``); the shell (gateway/session/agent_link.py) writes the files
with mode 0600 before each spawn and puts the flags before the template's end of options. Each
parser's renderer is one entry of ``DELIVERIES``: Claude Code's is here (``--mcp-config`` with a
file, ``--strict-mcp-config``, so the servers are exactly the session's); the other agents' are
added beside it.

Claude Code 2.1.328 says only ``{"name", "status": "failed"}`` of a server that failed; its reason
is in its MCP logs, ``$HOME/.cache/claude-cli-nodejs/<workspace, every other character as '-'>/
mcp-logs-<server>/<time>.jsonl``, one JSON object a line, the failure an ``error`` line.
``claude_failure_reasons`` reads the newest of those files of each failed server, through
gateway/storage/nofollow.py and bounded (the agent wrote them), and cuts every secret of the
session's servers out of what it found before anything else sees it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gateway.agent.profiles import AgentProfile
from gateway.protocol.mcp_servers import ServerSpec
from gateway.storage import nofollow

__all__ = [
    "CLAUDE_CONFIG_FILE",
    "DELIVERIES",
    "KINDS_BY_PARSER",
    "MAX_REASON_CHARS",
    "Delivery",
    "claude_failure_reasons",
    "delivery",
    "kinds_of",
    "without_secrets",
]

# What each parser's agent takes; a parser not here takes none (GET /v1/agents says "mcp": []).
# Codex and Gemini are given theirs by gateway/protocol/mcp_delivery.py. An ACP agent says its own
# in ``initialize`` (stdio always, http when it declares it): this is what the three pinned ones
# declared (claude-agent-acp 0.23.1, codex-acp 0.16.0, gemini --acp 0.61.0), and the ACP adapter
# reports a server of a kind the running agent does not declare failed.
KINDS_BY_PARSER: dict[str, tuple[str, ...]] = {
    "claude-code": ("stdio", "http"),
    "codex": ("stdio", "http"),
    "gemini": ("stdio", "http"),
    "acp": ("stdio", "http"),
}

CLAUDE_CONFIG_FILE: Final = ".rawp-mcp.json"  # in the session's HOME, mode 0600
MAX_REASON_CHARS: Final = 500  # of a reason read from an agent's log, said to masters
MAX_LOG_TAIL_BYTES: Final = 64 * 1024  # read from the end of one MCP log
MAX_LOG_FILES: Final = 256  # looked at in one server's log directory


@dataclass(frozen=True)
class Delivery:
    """What an agent needs for its servers: argv flags, and files (a name in the session's HOME →
    its text) the shell writes with mode 0600 before the agent starts."""

    flags: tuple[str, ...] = ()
    files: Mapping[str, str] = field(default_factory=dict)


def kinds_of(profile: AgentProfile) -> tuple[str, ...]:
    """The kinds of MCP server ``profile``'s agent takes."""
    if profile.mcp_kinds is not None:
        return profile.mcp_kinds
    return KINDS_BY_PARSER.get(profile.parser, ())


def _claude(specs: Sequence[ServerSpec], home: str) -> Delivery:
    servers: dict[str, Any] = {}
    for spec in specs:
        if spec.kind == "stdio":
            command = spec.command or ("",)
            servers[spec.name] = {
                "type": "stdio",
                "command": command[0],
                "args": list(command[1:]),
                "env": dict(spec.env),
            }
        else:
            # Claude Code drops an entry with a url and no type without a word: "http" it is.
            servers[spec.name] = {"type": "http", "url": spec.url, "headers": dict(spec.headers)}
    path = os.path.join(home, CLAUDE_CONFIG_FILE)
    text = json.dumps({"mcpServers": servers}, indent=2)
    return Delivery(("--mcp-config", path, "--strict-mcp-config"), {CLAUDE_CONFIG_FILE: text})


# parser → its renderer (the servers of kinds it takes, the session's HOME).
DELIVERIES: dict[str, Callable[[Sequence[ServerSpec], str], Delivery]] = {"claude-code": _claude}


def delivery(profile: AgentProfile, specs: Sequence[ServerSpec], home: str) -> Delivery:
    """What ``profile``'s agent is given for ``specs`` (those of a kind it takes); nothing when the
    session has none it takes, so an agent without servers runs as it always did."""
    kinds = kinds_of(profile)
    taken = [s for s in specs if s.kind in kinds]
    render = DELIVERIES.get(profile.parser)
    if not taken or render is None:
        return Delivery()
    return render(taken, home)


def without_secrets(text: str, specs: Sequence[ServerSpec]) -> str:
    """``text`` with every env and header value of ``specs`` (and each word of a header value,
    ``Bearer`` aside: the token alone is the secret) cut out, and cut to MAX_REASON_CHARS."""
    values: set[str] = set()
    for spec in specs:
        for value in spec.secrets().values():
            values.add(value)
            values.update(w for w in value.split() if len(w) >= 4 and w.lower() != "bearer")
    for value in sorted((v for v in values if v), key=len, reverse=True):
        text = text.replace(value, "[REDACTED]")
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


_SLUG: Final = re.compile(r"[^A-Za-z0-9]")


def claude_failure_reasons(
    home: str, workspace: str, names: Sequence[str], specs: Sequence[ServerSpec]
) -> dict[str, str]:
    """Why each of ``names`` failed, from Claude Code's MCP logs in ``home`` for ``workspace``:
    the last ``error`` of its newest log, without the session's secrets. A server whose log is
    missing or unreadable is left out."""
    reasons: dict[str, str] = {}
    project = _SLUG.sub("-", workspace)
    for name in names:
        found = _last_error(home, (".cache", "claude-cli-nodejs", project, f"mcp-logs-{name}"))
        if found:
            reasons[name] = without_secrets(found, specs)
    return reasons


def _last_error(home: str, parts: tuple[str, ...]) -> str | None:
    fd = -1
    try:
        home_fd = nofollow.open_dir(home)
        try:
            fd = nofollow.open_dirs(home_fd, parts)  # never through a link the agent left
        finally:
            os.close(home_fd)
        names = sorted(n for n in _listed(fd) if n.endswith(".jsonl"))
        if not names:
            return None
        tail = _tail(fd, names[-1])
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    for line in reversed(tail.splitlines()):
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and isinstance(entry.get("error"), str):
                return str(entry["error"])
    return None


def _listed(fd: int) -> list[str]:
    names = []
    with os.scandir(fd) as entries:
        for i, entry in enumerate(entries):
            if i >= MAX_LOG_FILES:
                break
            names.append(entry.name)
    return names


def _tail(dir_fd: int, name: str) -> str:
    """The end of a regular file (a FIFO or a link is never opened as one)."""
    fd = os.open(name, nofollow.READ_FLAGS | os.O_NONBLOCK, dir_fd=dir_fd)
    st = nofollow.regular_fd(fd, name)  # closes it when it is not
    try:
        start = max(0, st.st_size - MAX_LOG_TAIL_BYTES)
        return os.pread(fd, MAX_LOG_TAIL_BYTES, start).decode(errors="replace")
    finally:
        os.close(fd)
