"""What the team's rules decided, as metrics: permission policies by rule and outcome, and the
budgets' spend (docs/policies.md, docs/budgets.md). Both change a few times per turn at most, so
ordinary prometheus-client instruments, on the gateway's registry (``GatewayMetrics.decisions``).

Labels stay bounded: a rule's name comes from the configuration (at most ``RULE_LABEL_LIMIT``
distinct ones per gateway, then ``other``: a rule set reloaded often with new names cannot grow the
series without end), decisions and scopes are fixed sets, and no session id or user name is a
label: the budgets are summed over the sessions and owners of a scope.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.metrics.labels import PREFIX, CappedLabel, bounded
from gateway.protocol.budget import SCOPES
from gateway.protocol.policy import DECISIONS

__all__ = ["RULE_LABEL_LIMIT", "DecisionMetrics"]

RULE_LABEL_LIMIT: Final = 100
BUDGET_EVENTS: Final = ("budget.warning", "budget.exceeded")


class DecisionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self._decisions = Counter(
            PREFIX + "policy_decisions",
            "Permission questions a [[policy.rules]] rule decided, by rule (its name; at most "
            f"{RULE_LABEL_LIMIT} then other) and decision (allow, deny: answered with no master; "
            "ask: a master was asked).",
            ("rule", "decision"),
            registry=r,
        )
        self._rule_label = CappedLabel(RULE_LABEL_LIMIT)
        # The ledger by scope (gateway/protocol/budget.py ``Ledger.totals``), in its order.
        self._scoped = tuple(
            Gauge(PREFIX + name, text, ("scope",), registry=r)
            for name, text in (
                (
                    "budget_spent_usd",
                    "USD the agents reported, by budget scope: session (summed over the live "
                    "sessions) or user_daily (summed over the owners, today, UTC).",
                ),
                (
                    "budget_remaining_usd",
                    "USD left of the budgets of a scope, summed over the sessions (owners) that "
                    "have one.",
                ),
                (
                    "budget_reached",
                    "Sessions (scope session) or owners (user_daily) whose budget is spent: "
                    "their prompts are refused with BUDGET_EXCEEDED.",
                ),
            )
        )
        self._events = Counter(
            PREFIX + "budget_events",
            "Budgets that reached warn_at (budget.warning) or were spent (budget.exceeded), by "
            "event and scope.",
            ("event", "scope"),
            registry=r,
        )
        for scope in SCOPES:
            for gauge in self._scoped:
                gauge.labels(scope)
            for event in BUDGET_EVENTS:
                self._events.labels(event, scope)

    def policy(self, rule: str, decision: str) -> None:
        self._decisions.labels(self._rule_label(rule), bounded(decision, DECISIONS)).inc()

    def budgets(self, totals: Mapping[str, tuple[float, float, int]]) -> None:
        """The ledger's totals by scope (``Ledger.totals``): spent, remaining, reached."""
        for scope, values in totals.items():
            for gauge, value in zip(self._scoped, values, strict=True):
                gauge.labels(bounded(scope, SCOPES)).set(value)

    def budget_event(self, event: str, scope: str) -> None:
        self._events.labels(bounded(event, BUDGET_EVENTS), bounded(scope, SCOPES)).inc()
