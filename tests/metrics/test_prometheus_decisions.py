"""Permission rules and budgets as a real Prometheus sees them: the in-process gateway with the demo
agent, two rules (one allows writes, one denies a secret) and a session budget; a turn of each,
and one that spends the budget. Prometheus then reads each decision by rule once, the budget spent,
reached and reported exceeded, and every query of the dashboard's "Policies and budgets" row
answers with those series (docs/policies.md, docs/budgets.md)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from gateway.protocol.budget import Limits
from gateway.protocol.policy import Glob, Rule
from tests.support.dashboard import all_panels, load_dashboard, substitute
from tests.support.gateway_peer import Master, create_session, demo_config, prompt_and_wait
from tests.support.gateway_peer import start_gateway as start
from tests.support.prometheus import prometheus_binary, query, run_prometheus, wait_for_value

pytestmark = pytest.mark.prometheus

TOKEN = "decisions-test-token"
DEADLINE_SEC = 30.0  # scrapes on a busy machine
RULES = (
    Rule("no-secrets", "deny", (Glob("Write"),), (("file_path", Glob("*secret*")),)),
    Rule("writes", "allow", (Glob("Write"),)),
)
ROW = "Policies and budgets"


async def test_decisions_and_budgets_reach_prometheus_and_the_dashboard_row(tmp_path):
    prometheus_binary()
    config = demo_config(tmp_path, token=TOKEN, policy=RULES, budgets=Limits(session_usd=1.0))
    gw = await start(config)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    gw.session.headers.update(auth)
    try:
        sid = (await create_session(gw))["session_id"]
        master = await Master.attach(gw, sid, headers=auth)
        await prompt_and_wait(master, "write notes.txt", idle=True)
        await prompt_and_wait(master, "write secret.txt", idle=True)
        await prompt_and_wait(master, "spend 1.25", idle=True)
        await master.until("session.error", error_code="BUDGET_EXCEEDED")
        address = f"{gw.server.host}:{gw.server.port}"
        async with (
            run_prometheus(tmp_path, TOKEN, [{"targets": [address]}]) as prometheus,
            aiohttp.ClientSession() as http,
        ):
            deadline = time.monotonic() + DEADLINE_SEC

            async def equals(promql: str, value: float) -> None:
                await wait_for_value(http, prometheus, promql, value, deadline)

            decisions = "rawp_gateway_policy_decisions_total"
            await equals(f'{decisions}{{rule="writes", decision="allow"}}', 1)
            await equals(f'{decisions}{{rule="no-secrets", decision="deny"}}', 1)
            await equals(f"sum({decisions})", 2)
            await equals('rawp_gateway_budget_spent_usd{scope="session"}', 1.25)
            await equals('rawp_gateway_budget_remaining_usd{scope="session"}', 0)
            await equals('rawp_gateway_budget_reached{scope="session"}', 1)
            await equals('rawp_gateway_budget_reached{scope="user_daily"}', 0)
            events = "rawp_gateway_budget_events_total"
            await equals(f'{events}{{event="budget.exceeded", scope="session"}}', 1)
            await equals(f'{events}{{event="budget.warning", scope="session"}}', 0)

            # The dashboard's row: every query runs and finds these series (rate() and
            # increase() need two scrapes of a change, so a decision and a budget event are made
            # again while Prometheus watches: an admin's raise, a write, a warning).
            raised = await gw.patch(f"/v1/session/{sid}", json={"budget_usd": 2})
            assert raised.status == 200
            await prompt_and_wait(master, "write more.txt", idle=True)
            await prompt_and_wait(master, "spend 0.5", idle=True)  # 1.75: warned
            await master.until("session.error", error_code="BUDGET_WARNING")
            dashboard = load_dashboard()
            titles = [p["title"] for p in dashboard["panels"]]
            start_at = titles.index(ROW)
            end = next(
                i
                for i in range(start_at + 1, len(titles))
                if dashboard["panels"][i]["type"] == "row"
            )
            panels = all_panels(dashboard)[start_at + 1 : end]
            assert len(panels) == 3
            for panel in panels:
                for target in panel["targets"]:
                    expr = substitute(target["expr"])
                    result = await query(http, prometheus, expr)
                    # A rate needs a change between two scrapes; a gauge, its series.
                    moved = "rate(" in expr or "increase(" in expr
                    while not result or (moved and not any(float(r["value"][1]) for r in result)):
                        assert time.monotonic() < deadline, f"{panel['title']}: {expr}"
                        await asyncio.sleep(0.25)
                        result = await query(http, prometheus, expr)
                    if "policy_decisions" in expr:
                        found = {(r["metric"]["rule"], r["metric"]["decision"]) for r in result}
                        assert found <= {("writes", "allow"), ("no-secrets", "deny")}
                    elif "scope" in target["legendFormat"]:
                        assert {r["metric"]["scope"] for r in result} <= {"session", "user_daily"}
    finally:
        await gw.close()
