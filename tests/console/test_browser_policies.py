"""Permission rules and budgets in the console (gateway/console/ui/render.js), in a real headless
Chromium against a real gateway with the demo agent: where a rule answered, the tool card says
"allowed by policy NAME" or "denied by policy NAME"; a rule that asks says so in the question; a
budget nearly spent and spent are warnings in the transcript, and the refused prompt's answer too
(docs/policies.md, docs/budgets.md)."""

from __future__ import annotations

import json

import pytest

from gateway.protocol.budget import Limits
from gateway.protocol.policy import Glob, Rule
from tests.support.browser import Page
from tests.support.console import log_in_and_create, prompt, shot, turns_ended
from tests.support.gateway_peer import fast_demo, make_config, start_gateway

pytestmark = pytest.mark.browser

TOKEN = "browser-policies-token"
RULES = (
    Rule("no-secrets", "deny", (Glob("Write"),), (("file_path", Glob("*secret*")),)),
    Rule("ask-notes", "ask", (Glob("Write"),), (("file_path", Glob("*notes*")),)),
    Rule("writes", "allow", (Glob("Write"),)),
)


async def texts(page: Page, selector: str) -> list[str]:
    return await page.js(
        f"[...document.querySelectorAll({json.dumps(selector)})].map(n => n.textContent)"
    )


async def test_rules_and_budgets_are_shown_where_a_person_would_have_been_asked(tmp_path, page):
    (tmp_path / "ws").mkdir()
    config = make_config(
        tmp_path,
        token=TOKEN,
        agents={"demo": fast_demo(5)},
        policy=RULES,
        budgets=Limits(session_usd=1.0),
    )
    gateway = await start_gateway(config)
    try:
        await log_in_and_create(page, gateway, "ruled", TOKEN)
        await prompt(page, "write hello.txt")
        await turns_ended(page, 1)
        await prompt(page, "write secret.txt")
        await turns_ended(page, 2)
        statuses = await texts(page, ".tool-status .policy")
        assert statuses == [" · allowed by policy writes", " · denied by policy no-secrets"]
        assert (tmp_path / "ws" / "hello.txt").exists()
        assert not (tmp_path / "ws" / "secret.txt").exists()

        await prompt(page, "write notes.txt")
        await page.wait("document.querySelector('.notice.ask[data-state=pending]') !== null")
        (asked,) = await texts(page, ".notice.ask")
        assert asked.endswith("(asked by policy ask-notes)")
        await page.wait("document.getElementById('ask-dialog').open")
        await page.click("#ask-options button[data-value=deny]")
        await turns_ended(page, 3)

        await prompt(page, "spend 0.9")
        await page.wait("document.querySelector('.notice.budget') !== null")
        await prompt(page, "spend 0.2")
        await page.wait("document.querySelector('.notice.budget[data-code=BUDGET_EXCEEDED]')")
        await prompt(page, "hello")
        await page.wait(
            "document.querySelectorAll('.notice.budget[data-code=BUDGET_EXCEEDED]').length >= 2"
        )
        budget = await texts(page, ".notice.budget")
        assert budget[0] == "budget: $0.90 of this session's budget of $1.00 is spent"
        assert all("refused until an admin raises it" in t for t in budget[1:])
        assert await page.js("document.querySelectorAll('.notice.error').length") == 0
        await shot(page, "policies-and-budgets")
        assert not page.errors()
    finally:
        await gateway.close()
