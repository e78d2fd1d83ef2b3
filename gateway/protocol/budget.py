"""Budgets: how much of the cost the agents report a session, and an owner in a UTC day, may spend,
and what a report does when it gets there, sans-IO.

A ``Ledger`` is the whole state: for each session its spend, the agent's last running total
(``reported``) and the limit an admin set; for each owner their spend on ``day`` (a UTC date,
``YYYY-MM-DD``, given by the caller: nothing here reads a clock). The shell keeps it on disk
(gateway/storage/ledger.py) and feeds it:

* ``report(session, owner, cost, day)``: one main ``session.usage``'s cost, the agent's running
  total (gateway/protocol/usage.py reads it the same way). It returns the budgets that report
  crossed (``Crossed``: ``budget.warning`` at ``warn_at`` of a budget, ``budget.exceeded`` at it),
  each once per budget (per day for the daily one; again after an admin raised it).
* ``refusal(session, owner, day)``: why a prompt may not start (None: it may). A budget reached
  refuses until an admin raises the session's (``set_limit``) or, for the owner's daily one, the
  day turns.

Never counted twice: what a report adds is measured from ``reported``, which the shell writes with
the spend in one atomic write before anything acts on it. A report applied again after a restart
adds nothing; one whose write a crash lost is counted whole by the agent's next running total,
which includes it. An agent that starts counting again (a lower total) adds all of its new total,
as gateway/protocol/usage.py counts it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from gateway.protocol.usage import cost_increase
from gateway.setting import setting

__all__ = [
    "BUDGET_EXCEEDED",
    "BUDGET_WARNING",
    "DEFAULT_WARN_AT",
    "FORMAT",
    "MAX_USD",
    "Crossed",
    "Ledger",
    "LedgerError",
    "Limits",
    "check_limit",
]

BUDGET_EXCEEDED: Final = "BUDGET_EXCEEDED"  # session.error: a prompt refused, a budget reached
BUDGET_WARNING: Final = "BUDGET_WARNING"  # session.error (not fatal): warn_at of a budget reached
DEFAULT_WARN_AT: Final = 0.8
MAX_USD: Final = 1_000_000.0  # the largest budget one may set
FORMAT: Final = "rawp-gateway-budgets"
VERSION: Final = 1
# What a ledger read back may hold: the sessions a gateway keeps, the owners of one day.
MAX_SESSIONS: Final = 100_000
MAX_USERS: Final = 100_000
MAX_NAME_CHARS: Final = 256
_DAY: Final = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")

Scope = Literal["session", "user_daily"]
Event = Literal["budget.warning", "budget.exceeded"]
SCOPES: Final[tuple[Scope, ...]] = ("session", "user_daily")


class LedgerError(ValueError):
    """A saved ledger that cannot be used, and why."""


def check_limit(value: Any, what: str) -> float:
    """A budget in USD: a number from 0 to MAX_USD (0: none); ValueError says what is wrong."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number of USD, got {value!r:.64}")
    if not (math.isfinite(value) and 0 <= value <= MAX_USD):
        raise ValueError(f"{what} must be from 0 to {MAX_USD:,.0f} USD (0: none), got {value}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Limits:
    """``[budgets]`` (docs/budgets.md): 0 is no budget. Each field declares its key
    (gateway/setting.py); gateway/config/ reads the file's table into one."""

    session_usd: float = setting(0.0, check=check_limit, doc="USD a session may spend")
    user_daily_usd: float = setting(
        0.0, check=check_limit, doc="USD an owner's sessions may spend together in a UTC day"
    )
    warn_at: float = setting(
        DEFAULT_WARN_AT,
        above=0,
        high=1,
        doc="the share of a budget at which budget.warning is sent",
    )


@dataclass(frozen=True, slots=True)
class Crossed:
    """A budget a report reached: its event, scope, what is spent of it and its limit."""

    event: Event
    scope: Scope
    spent_usd: float
    limit_usd: float

    def message(self) -> str:
        what = "this session's budget" if self.scope == "session" else "its owner's budget today"
        if self.event == "budget.warning":
            return f"${self.spent_usd:.2f} of {what} of ${self.limit_usd:.2f} is spent"
        until = "until an admin raises it" if self.scope == "session" else "until the UTC day turns"
        return (
            f"{what} of ${self.limit_usd:.2f} is spent (${self.spent_usd:.2f}): prompts are "
            f"refused {until}"
        )


@dataclass(slots=True)
class _Spend:
    spent: float = 0.0
    warned: bool = False  # budget.warning sent for the limit in force
    exceeded: bool = False  # budget.exceeded sent for the limit in force


@dataclass(slots=True)
class _Session(_Spend):
    owner: str = ""
    reported: float = 0.0  # the agent's last running total
    limit: float | None = None  # an admin's; None: Limits.session_usd


@dataclass(slots=True)
class Ledger:
    limits: Limits = field(default_factory=Limits)
    day: str = ""
    sessions: dict[str, _Session] = field(default_factory=dict)
    users: dict[str, _Spend] = field(default_factory=dict)  # spend on ``day``

    # --- what a session does ----------------------------------------------------------------

    def open(self, session_id: str, owner: str, reported: float = 0.0) -> None:
        """A session begins to count (again: one read back keeps its entry). ``reported``: where
        the agent's running total already stands (a conversation it continues), not counted."""
        if session_id not in self.sessions:
            self.sessions[session_id] = _Session(owner=owner, reported=max(reported, 0.0))

    def forget(self, session_id: str) -> None:
        """The session ended: its owner's spend today stays."""
        self.sessions.pop(session_id, None)

    def report(self, session_id: str, owner: str, cost: float, day: str) -> list[Crossed]:
        """The agent's running total ``cost`` (USD, > 0) of a main ``session.usage``."""
        self._turn_day(day)
        entry = self.sessions.get(session_id)
        if entry is None:
            entry = self.sessions[session_id] = _Session(owner=owner)
        if not math.isfinite(cost) or cost <= 0:
            return []
        added = cost_increase(entry.reported, cost)
        entry.reported = cost
        if added <= 0:
            return []
        user = self.users.get(owner)
        if user is None:
            user = self.users[owner] = _Spend()
        entry.spent += added
        user.spent += added
        crossed = self._cross(entry, "session", self.session_limit(entry))
        crossed += self._cross(user, "user_daily", self.limits.user_daily_usd)
        return crossed

    def refusal(self, session_id: str, owner: str, day: str) -> Crossed | None:
        """The budget that refuses a prompt of this session now, or None."""
        self._turn_day(day)
        entry = self.sessions.get(session_id)
        if entry is not None:
            limit = self.session_limit(entry)
            if limit > 0 and entry.spent >= limit:
                return Crossed("budget.exceeded", "session", entry.spent, limit)
        user = self.users.get(owner)
        daily = self.limits.user_daily_usd
        if user is not None and daily > 0 and user.spent >= daily:
            return Crossed("budget.exceeded", "user_daily", user.spent, daily)
        return None

    def set_limit(self, session_id: str, owner: str, limit: float | None) -> None:
        """An admin sets the session's budget (0: none; None: the configured one). A budget that
        is then reached again warns and is reported exceeded again."""
        entry = self.sessions.get(session_id)
        if entry is None:
            entry = self.sessions[session_id] = _Session(owner=owner)
        entry.limit = limit
        now = self.session_limit(entry)
        entry.exceeded = now > 0 and entry.spent >= now
        entry.warned = now > 0 and entry.spent >= now * self.limits.warn_at

    def session_limit(self, entry: _Session) -> float:
        return self.limits.session_usd if entry.limit is None else entry.limit

    def view(self, session_id: str, owner: str, day: str) -> dict[str, Any]:
        """The session object's ``budget``: its limit (None: none) and spend, and its owner's
        daily one when there is one."""
        self._turn_day(day)
        entry = self.sessions.get(session_id) or _Session(owner=owner)
        limit = self.session_limit(entry)
        shown: dict[str, Any] = {
            "limit_usd": limit if limit > 0 else None,
            "spent_usd": round(entry.spent, 6),
        }
        if self.limits.user_daily_usd > 0:
            user = self.users.get(owner)
            shown["user_daily"] = {
                "limit_usd": self.limits.user_daily_usd,
                "spent_usd": round(user.spent if user else 0.0, 6),
                "day": day,
            }
        return shown

    def totals(self) -> dict[str, tuple[float, float, int]]:
        """By scope: what is spent, what remains of the budgets there are, and how many are
        reached (for the metrics: no session or owner named)."""
        out: dict[str, tuple[float, float, int]] = {}
        for scope, spends in (
            ("session", [(e, self.session_limit(e)) for e in self.sessions.values()]),
            ("user_daily", [(u, self.limits.user_daily_usd) for u in self.users.values()]),
        ):
            spent = sum(s.spent for s, _ in spends)
            remaining = sum(max(limit - s.spent, 0.0) for s, limit in spends if limit > 0)
            reached = sum(1 for s, limit in spends if limit > 0 and s.spent >= limit)
            out[scope] = (spent, remaining, reached)
        return out

    def today(self, day: str) -> None:
        """It is ``day`` (UTC): on a new day the owners' spend starts again from nothing."""
        self._turn_day(day)

    def _turn_day(self, day: str) -> None:
        if day != self.day:
            self.day = day
            self.users.clear()

    def _cross(self, spend: _Spend, scope: Scope, limit: float) -> list[Crossed]:
        if limit <= 0:
            return []
        if spend.spent >= limit and not spend.exceeded:
            spend.exceeded = spend.warned = True
            return [Crossed("budget.exceeded", scope, spend.spent, limit)]
        if spend.spent >= limit * self.limits.warn_at and not spend.warned:
            spend.warned = True
            return [Crossed("budget.warning", scope, spend.spent, limit)]
        return []

    # --- saved ---------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "day": self.day,
            "sessions": {
                sid: [e.owner, e.spent, e.reported, e.limit, e.warned, e.exceeded]
                for sid, e in self.sessions.items()
            },
            "users": {name: [u.spent, u.warned, u.exceeded] for name, u in self.users.items()},
        }

    @classmethod
    def from_json(cls, data: Any, limits: Limits) -> Ledger:
        """A ledger read back; LedgerError says why one cannot be used (the file is input: the
        agents run as the gateway's user)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise LedgerError(f"not a {FORMAT} file")
        if data.get("version") != VERSION:
            raise LedgerError(
                f"format version {data.get('version')!r}; this gateway reads {VERSION}"
            )
        day = data.get("day")
        if not isinstance(day, str) or (day and not _DAY.fullmatch(day)):
            raise LedgerError("day is not a YYYY-MM-DD date")
        sessions, users = data.get("sessions"), data.get("users")
        if not isinstance(sessions, dict) or len(sessions) > MAX_SESSIONS:
            raise LedgerError(f"sessions must be an object of at most {MAX_SESSIONS}")
        if not isinstance(users, dict) or len(users) > MAX_USERS:
            raise LedgerError(f"users must be an object of at most {MAX_USERS}")
        ledger = cls(limits, day)
        for sid, row in sessions.items():
            _name(sid, "a session id")
            if not (isinstance(row, list) and len(row) == 6):
                raise LedgerError(f"session {sid[:64]!r}: not an entry")
            owner, spent, reported, limit, warned, exceeded = row
            ledger.sessions[sid] = _Session(
                spent=_usd(spent),
                warned=_flag(warned),
                exceeded=_flag(exceeded),
                owner=_name(owner, "an owner"),
                reported=_usd(reported),
                limit=None if limit is None else _usd(limit),
            )
        for name, row in users.items():
            _name(name, "an owner")
            if not (isinstance(row, list) and len(row) == 3):
                raise LedgerError(f"user {name[:64]!r}: not an entry")
            ledger.users[name] = _Spend(_usd(row[0]), _flag(row[1]), _flag(row[2]))
        return ledger


def _usd(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LedgerError(f"{value!r:.64} is not an amount")
    if not (math.isfinite(value) and value >= 0):
        raise LedgerError(f"{value!r:.64} is not an amount")
    return float(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise LedgerError(f"{value!r:.64} is not true or false")
    return value


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_NAME_CHARS:
        raise LedgerError(f"{what} must be text of at most {MAX_NAME_CHARS} characters")
    return value
