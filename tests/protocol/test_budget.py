"""Budgets (gateway/protocol/budget.py) and the session machine's side of them: cost reports in,
crossings, refusals and frames out. Nothing runs, no clock is read: the day is given."""

from __future__ import annotations

import json

import pytest

from gateway.protocol import frames as F
from gateway.protocol import machine as sm
from gateway.protocol.budget import (
    BUDGET_EXCEEDED,
    Crossed,
    Ledger,
    LedgerError,
    Limits,
    check_limit,
)
from tests.support.scenario import (
    CLAUDE,
    Placeholder,
    Scenario,
    budget_notice,
    compact,
    emit,
    escalation_ends,
    gate,
    line,
    prompt,
    refused,
    relayed,
    turn_end,
)

DAY, NEXT_DAY = "2026-12-06", "2026-12-07"


def ledger(session_usd=0.0, user_daily_usd=0.0, warn_at=0.8) -> Ledger:
    book = Ledger(Limits(session_usd, user_daily_usd, warn_at))
    book.open("s1", "ann")
    return book


def events(crossed: list[Crossed]) -> list[tuple[str, str]]:
    return [(c.event, c.scope) for c in crossed]


def test_a_session_budget_warns_once_then_is_exceeded_once_and_refuses():
    book = ledger(session_usd=1.0)
    assert book.report("s1", "ann", 0.5, DAY) == []
    assert book.refusal("s1", "ann", DAY) is None
    # The agent's figure is its running total: 0.85 adds 0.35.
    assert events(book.report("s1", "ann", 0.85, DAY)) == [("budget.warning", "session")]
    assert book.report("s1", "ann", 0.9, DAY) == []  # warned already
    (spent,) = book.report("s1", "ann", 1.25, DAY)
    assert (spent.event, spent.scope, spent.limit_usd) == ("budget.exceeded", "session", 1.0)
    assert spent.spent_usd == pytest.approx(1.25)
    assert book.report("s1", "ann", 1.5, DAY) == []  # reported once
    refused = book.refusal("s1", "ann", DAY)
    assert refused is not None and refused.scope == "session"
    assert "until an admin raises it" in refused.message()
    # The day turning does not lift a session's budget.
    assert book.refusal("s1", "ann", NEXT_DAY) is not None


def test_an_admins_raise_lets_it_go_on_and_a_new_limit_is_reported_again():
    book = ledger(session_usd=1.0)
    book.report("s1", "ann", 1.2, DAY)
    book.set_limit("s1", "ann", 3.0)
    assert book.refusal("s1", "ann", DAY) is None
    assert book.view("s1", "ann", DAY) == {"limit_usd": 3.0, "spent_usd": 1.2}
    assert events(book.report("s1", "ann", 2.5, DAY)) == [("budget.warning", "session")]
    assert events(book.report("s1", "ann", 3.0, DAY)) == [("budget.exceeded", "session")]
    book.set_limit("s1", "ann", 0)  # none
    assert book.refusal("s1", "ann", DAY) is None
    assert book.view("s1", "ann", DAY)["limit_usd"] is None
    book.set_limit("s1", "ann", None)  # the configured one again: spent
    assert book.refusal("s1", "ann", DAY) is not None


def test_a_daily_budget_covers_the_owners_sessions_until_the_day_turns():
    book = ledger(user_daily_usd=2.0)
    book.open("s2", "ann")
    book.open("s3", "bob")
    assert book.report("s1", "ann", 1.0, DAY) == []
    assert events(book.report("s2", "ann", 1.5, DAY)) == [("budget.exceeded", "user_daily")]
    for sid in ("s1", "s2"):
        refused = book.refusal(sid, "ann", DAY)
        assert refused is not None and refused.scope == "user_daily"
    assert book.refusal("s3", "bob", DAY) is None
    assert book.refusal("s1", "ann", NEXT_DAY) is None
    assert book.view("s1", "ann", NEXT_DAY)["user_daily"] == {
        "limit_usd": 2.0,
        "spent_usd": 0.0,
        "day": NEXT_DAY,
    }


def test_a_report_applied_again_after_a_restart_adds_nothing():
    """What a report adds is measured from the running total saved with it: the ledger written
    after a report and read back (a restart, a SIGKILL after the write) counts a repeat of that
    report as nothing; the ledger of before (a SIGKILL before the write) counts it once."""
    limits = Limits(session_usd=10.0)
    book = ledger(session_usd=10.0)
    book.report("s1", "ann", 1.0, DAY)
    before = json.loads(json.dumps(book.to_json()))
    book.report("s1", "ann", 3.0, DAY)
    after = json.loads(json.dumps(book.to_json()))

    again = Ledger.from_json(after, limits)
    again.report("s1", "ann", 3.0, DAY)
    assert again.sessions["s1"].spent == pytest.approx(3.0)
    assert again.users["ann"].spent == pytest.approx(3.0)

    lost = Ledger.from_json(before, limits)
    lost.report("s1", "ann", 3.0, DAY)  # the report whose write was lost, or the next total
    assert lost.sessions["s1"].spent == pytest.approx(3.0)


def test_an_agent_that_counts_again_adds_its_whole_new_total():
    book = ledger(session_usd=10.0)
    book.report("s1", "ann", 2.0, DAY)
    book.report("s1", "ann", 0.5, DAY)  # a new process that does not resume its figure
    assert book.sessions["s1"].spent == pytest.approx(2.5)


def test_a_continued_conversations_earlier_cost_is_not_counted():
    book = Ledger(Limits(session_usd=1.0))
    book.open("s1", "ann", reported=4.0)  # where the resumed agent's total stands
    assert book.report("s1", "ann", 4.5, DAY) == []
    assert book.sessions["s1"].spent == pytest.approx(0.5)


@pytest.mark.parametrize("cost", [0.0, -1.0, float("nan"), float("inf")])
def test_no_cost_and_nonsense_add_nothing(cost):
    book = ledger(session_usd=1.0)
    assert book.report("s1", "ann", cost, DAY) == []
    assert book.sessions["s1"].spent == 0


def test_forget_keeps_the_owners_day():
    book = ledger(user_daily_usd=5.0)
    book.report("s1", "ann", 1.0, DAY)
    book.forget("s1")
    assert "s1" not in book.sessions and book.users["ann"].spent == 1.0


def test_totals_by_scope_name_no_session():
    book = ledger(session_usd=2.0, user_daily_usd=10.0)
    book.open("s2", "bob")
    book.report("s1", "ann", 2.5, DAY)
    book.report("s2", "bob", 0.5, DAY)
    assert book.totals() == {
        "session": (pytest.approx(3.0), pytest.approx(1.5), 1),
        "user_daily": (pytest.approx(3.0), pytest.approx(17.0), 0),
    }


@pytest.mark.parametrize(
    ("saved", "says"),
    [
        ([], "not a rawp-gateway-budgets file"),
        ({"format": "rawp-gateway-budgets", "version": 9}, "format version 9"),
        ({"format": "rawp-gateway-budgets", "version": 1, "day": "today"}, "YYYY-MM-DD"),
        (
            {"format": "rawp-gateway-budgets", "version": 1, "day": "", "sessions": {}, "users": 1},
            "users must be",
        ),
        (
            {
                "format": "rawp-gateway-budgets",
                "version": 1,
                "day": DAY,
                "sessions": {"s1": ["ann", -1, 0, None, False, False]},
                "users": {},
            },
            "not an amount",
        ),
        (
            {
                "format": "rawp-gateway-budgets",
                "version": 1,
                "day": DAY,
                "sessions": {"s1": ["ann", 1, 0, None, "yes", False]},
                "users": {},
            },
            "true or false",
        ),
    ],
)
def test_a_saved_ledger_that_cannot_be_used_says_why(saved, says):
    with pytest.raises(LedgerError, match=says):
        Ledger.from_json(saved, Limits())


def test_a_budget_an_admin_sets_is_bounded():
    assert check_limit(5, "budget_usd") == 5.0
    for value, says in (
        (2e6, "budget_usd must be from 0 to 1,000,000"),
        (-1, "budget_usd must be from 0"),
        (float("nan"), "budget_usd must be from 0"),
        ("5", "budget_usd must be a number"),
        (True, "budget_usd must be a number"),
    ):
        with pytest.raises(ValueError, match=says):
            check_limit(value, "budget_usd")


# --- the session machine ---------------------------------------------------------------------


TURN, NEXT = Placeholder("TURN"), Placeholder("NEXT")


def test_a_gated_prompt_gets_budget_exceeded_and_nothing_starts():
    """The prompt is relayed to the other masters as any is; only the error follows it, to its
    sender; when the budgets let prompts through again, the next one starts the first turn."""
    spent = (BUDGET_EXCEEDED, "this session's budget of $1.00 is spent")
    assert (
        Scenario()
        >> CLAUDE.started()
        >> gate(spent)
        >> prompt("hello", mid="m-hello")
        << relayed("control.prompt.request")
        << refused(BUDGET_EXCEEDED, parent_id="m-hello", message=spent[1])
        >> gate(None)
        >> CLAUDE.prompted("again", TURN)
    )


def test_a_compaction_is_gated_like_a_prompt():
    """docs/budgets.md: a compaction is a turn the agent is paid for, refused alike."""
    assert (
        Scenario(features=F.Features(context_compaction=True))
        >> CLAUDE.started()
        >> gate((BUDGET_EXCEEDED, "spent"))
        >> compact(mid="m-compact")
        << relayed("control.session.compact")
        << refused(BUDGET_EXCEEDED, parent_id="m-compact")
    )


def test_a_budget_spent_mid_turn_cancels_it_and_tells_every_master():
    """Every master is told (a broadcast in the turn, the budget in metadata), and the turn is
    cancelled as a master's cancel would be; once only; and a warning cancels nothing."""
    budget = {"scope": "session", "spent_usd": 1.2, "limit_usd": 1.0}
    assert (
        Scenario()
        >> CLAUDE.started()
        >> CLAUDE.prompted("hello", TURN)
        >> budget_notice(BUDGET_EXCEEDED, "spent", budget, cancel=True)
        << emit(
            F.SessionError(error_code=BUDGET_EXCEEDED, message="spent", fatal=False),
            turn_id=TURN,
            metadata={sm.BUDGET_KEY: budget},
        )
        << CLAUDE.escalation()
        >> budget_notice(BUDGET_EXCEEDED, "spent", {}, cancel=True)
        << emit("session.error", error_code=BUDGET_EXCEEDED, turn_id=TURN)
        >> line(CLAUDE.result)
        << escalation_ends()
        << turn_end(TURN, "cancelled", settles=None)
        >> budget_notice("BUDGET_WARNING", "80%", {}, cancel=False)
        << emit("session.error", error_code="BUDGET_WARNING", fatal=False, turn_id=None)
    )
