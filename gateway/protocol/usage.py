"""What a session's agent used: its running totals, and what each ``session.usage`` adds to them.

The rules, one place for the metrics, the saved record and the docs (docs/usage.md):

* Only the main agent's ``session.usage`` counts (no ``metadata.subagent_context``). DPS §10.5
  leaves summing a subagent's own usage to the receiver; the gateway does not add it, because the
  agents either include it already or report it partially (Claude Code: see docs/usage.md).
* Its tokens are that turn's (or that agent run's): each frame's ``token_usage`` is added once.
  The parsers see to it (Codex reports thread totals: its parser sends the turn's share).
* ``cost_usage.used`` is the agent's own running total over its session (Claude Code's
  ``total_cost_usd``, kept across ``--resume``; ACP's ``usage_update`` cost): what counts is its
  increase. A figure below the last one means the agent started counting again, so all of it is new.
  An agent that reports no cost adds 0, never an estimate.
* The context fill is the last usage's ``context_window.utilization`` (or ``used / capacity``).

Pure: no metrics, no I/O; ``LiveSession`` feeds it and hands what it returns to the metrics.

The ``session.usage`` payloads themselves, as the agent reported them at a turn's or a subagent's
end, are built here too (``usage_payload``, ``subagent_usage_payload``), for the mapper to send.
"""

from __future__ import annotations

import math
from typing import Any, Final, NamedTuple

from gateway.protocol import frames as F
from parsers import events as ev
from parsers import numbers

__all__ = [
    "CONTEXT_FULL",
    "Counted",
    "UsageTally",
    "context_fill",
    "cost_increase",
    "reported_cost",
    "subagent_usage_payload",
    "usage_payload",
]

_NO_RESET: Final = "PT0S"  # time_to_reset: no limit applies (limits are -1), so nothing resets
_UNLIMITED: Final = -1
# DPS §7.3: at 0.95 utilization the agent MUST compact; a turn that ends at or past it hit the limit.
CONTEXT_FULL: Final = 0.95


class Counted(NamedTuple):
    """What one main-agent ``session.usage`` adds: tokens by kind, the cost's increase in USD, and
    the context fill it reports (None: not reported)."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float
    fill: float | None


def _count(n: int | None) -> int:
    # An agent's negative count is nonsense; it must not make a counter go down.
    return n if n is not None and n > 0 else 0


def reported_cost(usage: F.Usage) -> float | None:
    """The agent's running cost total a ``session.usage`` says, in USD; None when it says none
    (0, another unit, not a finite number)."""
    cost = usage.cost_usage.used if usage.cost_usage.unit == "USD" else 0.0
    return cost if math.isfinite(cost) and cost > 0 else None


def cost_increase(last: float, cost: float) -> float:
    """What a running total ``cost`` adds to the ``last`` one: its increase, or all of it when it
    is lower (the agent started counting again)."""
    return cost - last if cost >= last else cost


def context_fill(window: F.ContextWindow | None) -> float | None:
    """How full the context window is, 0.0-1.0, or None when the usage does not say."""
    if window is None:
        return None
    fill = window.utilization
    if fill is None and window.capacity and window.used is not None:
        fill = window.used / window.capacity
    if fill is None or not math.isfinite(fill):
        return None
    return min(max(fill, 0.0), 1.0)


class UsageTally:
    """A session's running totals. ``add`` takes each main-agent ``session.usage``."""

    __slots__ = (
        "cache_read_tokens",
        "cache_write_tokens",
        "capacity",
        "cost_reported",
        "cost_usd",
        "fill",
        "input_tokens",
        "output_tokens",
        "turns",
    )

    # The keys of the saved record (gateway/storage/state_dir.py), in this order.
    FIELDS: Final = (
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "cost_usd",
        "cost_reported",
        "turns",
    )

    def __init__(self) -> None:
        self.input_tokens = 0
        self.output_tokens = 0
        self.cache_read_tokens = 0
        self.cache_write_tokens = 0
        self.cost_usd = 0.0  # what the agent's reports added up to over this session
        self.cost_reported = 0.0  # the agent's last running total (see the module docstring)
        self.turns = 0
        self.fill: float | None = None
        self.capacity: int | None = None  # the context window's size, as last reported

    def add(self, usage: F.Usage) -> Counted:
        t = usage.token_usage
        cost = reported_cost(usage)
        increase = 0.0
        if cost is not None:
            increase = cost_increase(self.cost_reported, cost)
            self.cost_reported = cost
        counted = Counted(
            _count(t.input_tokens),
            _count(t.output_tokens),
            _count(t.cache_read_tokens),
            _count(t.cache_write_tokens),
            increase,
            context_fill(usage.context_window),
        )
        self.input_tokens += counted.input_tokens
        self.output_tokens += counted.output_tokens
        self.cache_read_tokens += counted.cache_read_tokens
        self.cache_write_tokens += counted.cache_write_tokens
        self.cost_usd += increase
        self.turns += 1
        if counted.fill is not None:
            self.fill = counted.fill
        window = usage.context_window
        if window is not None and window.capacity:
            self.capacity = window.capacity
        return counted

    def seen(self, usage: F.Usage) -> None:
        """A usage of the agent's own past, replayed into a session that continues a saved
        conversation: not counted (this gateway did not run it), but the agent's running cost
        stands where it says, so the next turn's report counts only its increase."""
        cost = reported_cost(usage)
        if cost is not None:
            self.cost_reported = cost

    def compacted(self, compacted: F.Compacted) -> float | None:
        """The agent compacted its context: the fill is now ``current_token_count`` of the
        window's last known size (None, and unchanged, when no size was reported yet)."""
        if not self.capacity or compacted.current_token_count < 0:
            return None
        self.fill = min(compacted.current_token_count / self.capacity, 1.0)
        return self.fill

    def to_json(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self.FIELDS}

    def restore(self, saved: Any) -> None:
        """Read back what ``to_json`` wrote (a record of an older version may lack keys)."""
        if not isinstance(saved, dict):
            return
        for key in self.FIELDS:
            value = saved.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                setattr(self, key, value)


# --- what the gateway sends ------------------------------------------------------------------------


def usage_payload(ended: ev.TurnEnded | None, turn_id: str | None) -> F.Usage:
    """``session.usage`` for a turn's end as the agent reported it (``ended``; None: it reported
    nothing, so all is 0)."""
    # The parsers drop odd numbers (parsers/numbers.py); checked again here, where every agent's
    # numbers meet, so that no plugin's slip puts a NaN or a negative count in a frame, the tally
    # or a budget.
    usage = ended.usage if ended is not None else None
    context = None
    capacity = numbers.count(ended.context_window) if ended is not None else None
    used = numbers.count(ended.context_used) if ended is not None else None
    if capacity or used:
        utilization = None
        if capacity and used is not None:
            utilization = round(min(used / capacity, 1.0), 4)
        context = F.ContextWindow(capacity=capacity, used=used, utilization=utilization)
    return F.Usage(
        turn_id=turn_id,
        token_usage=_token_usage(usage),
        cost_usage=F.Quota(
            limit=_UNLIMITED,
            used=(numbers.cost(ended.cost_usd) or 0.0) if ended else 0.0,
            unit="USD",
        ),
        message_usage=F.Quota(
            limit=_UNLIMITED,
            used=(numbers.count(ended.num_turns) or 0) if ended else 0,
            unit="COUNT",
        ),
        context_window=context,
        time_to_reset=_NO_RESET,
    )


def subagent_usage_payload(usage: ev.UsageInfo, turn_id: str | None) -> F.Usage:
    """A subagent's own ``session.usage`` (DPS-10.5-usage). Its cost and message count are not
    reported separately by agents, so they are 0."""
    return F.Usage(
        turn_id=turn_id,
        token_usage=_token_usage(usage),
        cost_usage=F.Quota(limit=_UNLIMITED, used=0.0, unit="USD"),
        message_usage=F.Quota(limit=_UNLIMITED, used=0, unit="COUNT"),
        time_to_reset=_NO_RESET,
    )


def _token_usage(usage: ev.UsageInfo | None) -> F.TokenUsage:
    if usage is None:
        return F.TokenUsage(input_tokens=0, output_tokens=0)
    count = numbers.count
    return F.TokenUsage(
        input_tokens=count(usage.input_tokens) or 0,
        output_tokens=count(usage.output_tokens) or 0,
        cache_read_tokens=count(usage.cache_read_tokens),
        cache_write_tokens=count(usage.cache_write_tokens),
        thinking_tokens=count(usage.thinking_tokens),
    )
