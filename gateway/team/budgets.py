"""Budgets in a running gateway (docs/budgets.md): the ledger of gateway/protocol/budget.py kept in
the state dir, and what a report that reaches a budget does to the sessions it covers.

One ``Budgets`` per gateway. A session registers when it starts (``opened``) and leaves when it
ends (``ended``); each main ``session.usage`` it sends comes here (``report``): the ledger adds the
cost, is written (gateway/storage/ledger.py) and only then acted on: the metrics, a webhook
(``budget.warning``, ``budget.exceeded``) and, on every session the budget covers (the session, or
all of its owner's for the daily one), a ``session.error`` that is not fatal (``BUDGET_WARNING``,
``BUDGET_EXCEEDED``) and, once a budget is spent, the running turn cancelled. A prompt asks
``refusal`` through the machine's ``prompt_gate``: the session's budget spent, or its owner's for
today, refuses it with ``BUDGET_EXCEEDED``. Nothing else about a session stops.

The UTC day is read here (``clock``), the one thing of time the ledger needs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.metrics import GatewayMetrics
from gateway.protocol import frames as F
from gateway.protocol.budget import BUDGET_EXCEEDED, BUDGET_WARNING, Crossed, Ledger, Limits
from gateway.protocol.usage import reported_cost
from gateway.storage.ledger import LedgerFile

__all__ = ["Budgets"]

log = logging.getLogger("rawp_gateway.budgets")


class Budgets:
    def __init__(
        self,
        limits: Limits,
        metrics: GatewayMetrics,
        ledger_file: LedgerFile | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.limits = limits
        self.metrics = metrics
        self.file = ledger_file
        self.clock = clock
        # The configuration's limits, whatever the file was written under.
        self.ledger = ledger_file.read(limits) if ledger_file is not None else Ledger(limits)
        self.notifier: Any = None  # gateway/team/notify.py's, when webhooks are configured
        self._sessions: dict[str, Any] = {}  # live sessions, by id
        self._publish()

    def day(self) -> str:
        return time.strftime("%Y-%m-%d", time.gmtime(self.clock()))

    # --- what sessions call -------------------------------------------------------------------

    def opened(self, session: Any) -> None:
        """A session starts (or is read back after a restart): it counts from where its agent's
        running cost stands."""
        self._sessions[session.id] = session
        if session.id not in self.ledger.sessions:
            self.ledger.open(session.id, session.owner, session.usage.cost_reported)
            self._save()
        session.machine.prompt_gate = lambda: self.refusal(session)

    def ended(self, session: Any) -> None:
        self._sessions.pop(session.id, None)
        if session.id in self.ledger.sessions:
            self.ledger.forget(session.id)
            self._save()
            self._publish()

    def restored(self, session_ids: set[str]) -> None:
        """After a restart: the sessions read back; the ledger forgets the others (their files
        could not be used), their owners' spend today stays."""
        gone = [sid for sid in self.ledger.sessions if sid not in session_ids]
        for sid in gone:
            self.ledger.forget(sid)
        if gone:
            self._save()
            self._publish()

    def refusal(self, session: Any) -> tuple[str, str] | None:
        """(``BUDGET_EXCEEDED``, why) when a budget refuses the session's next prompt."""
        crossed = self.ledger.refusal(session.id, session.owner, self.day())
        return None if crossed is None else (BUDGET_EXCEEDED, crossed.message())

    def report(self, session: Any, usage: F.Usage) -> None:
        """A main ``session.usage`` the session sent: counted, written, then acted on."""
        cost = reported_cost(usage)
        if cost is None:
            return
        crossed = self.ledger.report(session.id, session.owner, cost, self.day())
        self._save()  # before anything relies on it
        self._publish()
        if crossed:
            # Called while the usage frame is being broadcast: what it crossed is told after it.
            asyncio.get_running_loop().call_soon(self._tell, session, crossed)

    def set_limit(self, session: Any, limit: float | None) -> None:
        """An admin's ``PATCH {"budget_usd"}``: the session's own budget (0: none; None: the
        configured one)."""
        self.ledger.set_limit(session.id, session.owner, limit)
        self._save()
        self._publish()

    def view(self, session: Any) -> dict[str, Any]:
        """The session object's ``budget``."""
        return self.ledger.view(session.id, session.owner, self.day())

    # --- inside ------------------------------------------------------------------------------

    def _tell(self, session: Any, crossed: list[Crossed]) -> None:
        for c in crossed:
            self._crossed(session, c)

    def _crossed(self, session: Any, crossed: Crossed) -> None:
        self.metrics.decisions.budget_event(crossed.event, crossed.scope)
        message = crossed.message()
        budget = {
            "scope": crossed.scope,
            "spent_usd": round(crossed.spent_usd, 6),
            "limit_usd": crossed.limit_usd,
        }
        log.warning(
            "budget %s",
            "spent" if crossed.event == "budget.exceeded" else "nearly spent",
            extra={"session": session.id, "owner": session.owner, **budget},
        )
        if self.notifier is not None:
            self.notifier.event(crossed.event, session, {"budget": {**budget, "message": message}})
        covered = [session]
        if crossed.scope == "user_daily":
            covered += [
                s for s in self._sessions.values() if s.owner == session.owner and s is not session
            ]
        exceeded = crossed.event == "budget.exceeded"
        code = BUDGET_EXCEEDED if exceeded else BUDGET_WARNING
        for s in covered:
            s.perform(s.machine.budget_notice(code, message, budget, cancel=exceeded))

    def _publish(self) -> None:
        """The metrics of the ledger as it stands today."""
        self.ledger.today(self.day())
        self.metrics.decisions.budgets(self.ledger.totals())

    def _save(self) -> None:
        if self.file is None:
            return
        try:
            self.file.write(self.ledger)
        except OSError as err:
            # Counting goes on in memory; what a restart reads back is the last ledger written.
            log.error("cannot write the budgets ledger: %s", err.strerror or err)
