"""What the metrics' labels may be, bounded by construction: the histogram buckets, the fixed sets
of label values, and the functions that map a value from outside (a frame type, a tool name, a
model or user name) onto them. No session id, invocation id or other free text ever becomes a
label value.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from typing import Final

from gateway.config.notify import EVENTS as WEBHOOK_EVENTS
from gateway.protocol.frames import PAYLOAD_CLASSES, VENDOR_PREFIX
from gateway.protocol.tools import BUILTIN_TOOLS

__all__ = [
    "AGENT_LINE_KIND_LIMIT",
    "FRAME_TYPES",
    "LATENCY_BUCKETS",
    "CappedLabel",
    "bounded",
    "context_band",
    "frame_type_label",
    "tool_label",
]

PREFIX: Final = "rawp_gateway_"

# 50 µs to 5 s, roughly 1-2.5-5 per decade: fine enough to tell a healthy sub-millisecond hop from a
# slow consumer, and only 16 buckets so the exposition stays small.
LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)

# A turn lasts from a second (a short answer) to tens of minutes (a long refactor).
TURN_BUCKETS: Final[tuple[float, ...]] = (
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)

TO_MASTER: Final = "to_master"
FROM_MASTER: Final = "from_master"

# DPS 1.0.1 appendix B: every frame type. Any of them may travel either way as far as counting
# goes: masters' control.* frames are relayed to the other masters (DPS 2.4), and a master may send
# a type meant for the other direction (counted, then refused), so each type is counted under
# both directions.
FRAME_TYPES: Final[tuple[str, ...]] = (
    "agent.text.delta",
    "agent.text.done",
    "agent.thinking.delta",
    "agent.thinking.done",
    "agent.interaction.request",
    "agent.error",
    "agent.file.transfer",
    "agent.state.changed",
    "agent.commands.publish",
    "agent.subagent.started",
    "agent.subagent.ended",
    "tool.invoke.request",
    "tool.invoke.result",
    "tool.invoke.stream",
    "tool.catalog.publish",
    "control.prompt.request",
    "control.prompt.cancel",
    "control.interaction.response",
    "control.interaction.timeout",
    "control.session.compact",
    "control.mode.switch",
    "control.file.search",
    "control.file.search.cancel",
    "session.history",
    "session.compacted",
    "session.usage",
    "session.error",
    "session.turn.start",
    "session.turn.end",
    "session.capabilities",
    "session.file.candidates",
    "session.renamed",
    "session.deleted",
    # The gateway's own extension events (DPS 3.1.1, `x-rawp-gateway.*`, e.g. an agent line
    # passed through raw): a fixed set defined in code, so they get their own label values.
    *sorted(t for t in PAYLOAD_CLASSES if t.startswith(VENDOR_PREFIX)),
)
OTHER: Final = "other"

SESSION_STATES: Final = ("IDLE", "RUNNING", "DETACHED", "TERMINATED")
CONNECTION_ROLES: Final = ("master", "local_ui")
STOP_REASONS: Final = (
    "end_turn",
    "max_tokens",
    "cancelled",
    "error",
    "tool_use",
    "awaiting_input",
    "disconnected",
)
TOOL_STATUSES: Final = ("success", "error", "timeout", "cancelled")
INTERACTION_TYPES: Final = ("YN", "SELECT", "MULTI_SELECT", "TEXT_INPUT", "PERMISSION")
# allowed/denied answer a PERMISSION; answered is any other type's reply; timed_out when nobody
# answered in time; cancelled when the turn or session ended with the question still open.
INTERACTION_OUTCOMES: Final = ("allowed", "denied", "answered", "timed_out", "cancelled")
EXIT_CLASSES: Final = ("ok", "error", "signal")
RESTORE_FAILURES: Final = ("unreadable", "corrupt", "version", "agent", "workspace")
STATE_FILES: Final = ("create", "record", "log")
NOTIFY_EVENTS: Final = WEBHOOK_EVENTS
DEFAULT_AGENTS: Final = ("claude-code", "codex", "gemini")

# Usage and cost: `model` is the agent's own name for it and `user` the session's owner, both free
# text, so each takes at most this many distinct values per gateway (then `other`), none longer
# than LABEL_VALUE_MAX characters (a longer one is `other` too); UNKNOWN when not told.
MODEL_LABEL_LIMIT: Final = 32
USER_LABEL_LIMIT: Final = 32
LABEL_VALUE_MAX: Final = 128
UNKNOWN: Final = "unknown"
TOKEN_KINDS: Final = ("input", "output", "cache_read", "cache_write")
COMPACTION_TRIGGERS: Final = ("auto", "manual", "requested")
# The latest context fill of live sessions, in bands (a label value each): the lower bound of the
# band, so a session at 0.83 is in band "0.8". 0.8 and 0.95 are DPS §7.3's "should" and "must"
# compact thresholds.
CONTEXT_BANDS: Final = (0.0, 0.5, 0.8, 0.95)

# Tool names of the three agents' built-in catalogs (one catalog: gateway/protocol/tools.py). Anything
# else is a user's MCP server or plug-in and must not mint a new label value.
KNOWN_TOOLS: Final = frozenset(BUILTIN_TOOLS)

# A parser reports a kind per line (e.g. "stream_event", "system/init"); a misbehaving parser or
# agent must not be able to grow the series count without bound.
AGENT_LINE_KIND_LIMIT: Final = 64
KIND_INVALID: Final = "invalid"  # the line was not valid JSON
KIND_UNKNOWN: Final = "unknown"  # valid JSON of a kind the parser does not know


def frame_type_label(type_: str) -> str:
    """The `type` label value for a frame type: the DPS type itself, or `other`."""
    return type_ if type_ in FRAME_TYPES else OTHER


def tool_label(name: str) -> str:
    """The `tool` label value: a known catalog name, `mcp` for any MCP tool, else `other`."""
    if name in KNOWN_TOOLS:
        return name
    # Claude Code and Codex name MCP tools mcp__<server>__<tool>, Gemini mcp_<server>_<tool>.
    if name.startswith("mcp_"):
        return "mcp"
    return OTHER


def bounded(value: str, allowed: Iterable[str]) -> str:
    return value if value in allowed else OTHER


def context_band(fill: float) -> float:
    """The band of a context fill (0.0-1.0): its lower bound, the `band` label value."""
    return CONTEXT_BANDS[max(bisect_right(CONTEXT_BANDS, fill) - 1, 0)]


class CappedLabel:
    """Free-text label values (a model name, a user name), at most `limit` distinct ones, then
    `other`; UNKNOWN for a missing value."""

    __slots__ = ("limit", "seen")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, value: str | None) -> str:
        if not value:
            return UNKNOWN
        if value in self.seen:
            return value
        if len(self.seen) >= self.limit or len(value) > LABEL_VALUE_MAX or value == OTHER:
            return OTHER
        self.seen.add(value)
        return value
