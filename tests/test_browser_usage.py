"""The console's usage pill (gateway/ui/usage.js) in a real headless Chromium against a real gateway
with the demo agent: the session's running totals and context gauge are the gateway's own
(``LiveSession.usage``, the same rules in Python), after turns, a compaction and a reload."""

from __future__ import annotations

import json

import pytest

from gateway.server import SESSIONS
from tests.browser import Browser, Page
from tests.gateway_peer import fast_demo, make_config, start_gateway
from tests.test_browser_console import TOKEN, log_in_and_create, prompt, shot, turns_ended

pytestmark = pytest.mark.browser


@pytest.fixture
async def gateway(tmp_path):
    (tmp_path / "ws").mkdir()
    client = await start_gateway(make_config(tmp_path, token=TOKEN, agents={"demo": fast_demo(5)}))
    yield client
    await client.close()


@pytest.fixture
async def page():
    browser = await Browser().start()
    try:
        yield await browser.page()
    finally:
        await browser.close()


async def pill(page: Page) -> dict:
    return await page.js(
        "(() => { const u = document.getElementById('usage');"
        " const m = u.querySelector('meter');"
        " return { text: u.querySelector('.usage-totals')?.textContent ?? null,"
        " fill: m ? m.value : null, label: u.querySelector('.context-fill')?.textContent ?? null,"
        " compacted: u.querySelector('.compactions')?.textContent ?? null,"
        " shown: getComputedStyle(u).display !== 'none' }; })()"
    )


def expected_text(tally) -> str:
    text = f"{tally.input_tokens:,} in · {tally.output_tokens:,} out"
    if tally.cache_read_tokens:
        text += f" · {tally.cache_read_tokens:,} cached"
    return text  # the demo reports no cost: none is shown


async def test_usage_pill_shows_running_totals_context_and_compaction(gateway, page):
    session_id = await log_in_and_create(page, gateway, "usage")
    assert (await pill(page))["shown"] is False  # nothing reported yet
    tally = gateway.server.app[SESSIONS][session_id].usage

    await prompt(page, "hello")
    await turns_ended(page, 1)
    await prompt(page, "hello again, a longer prompt this time")
    await turns_ended(page, 2)
    assert tally.turns == 2 and tally.input_tokens > 0 and tally.cost_usd == 0
    await page.wait(
        f"document.querySelector('#usage .usage-totals')?.textContent === {json.dumps(expected_text(tally))}"
    )
    shown = await pill(page)
    assert shown["shown"] and shown["compacted"] is None
    assert shown["fill"] == pytest.approx(tally.fill) and tally.fill > 0
    assert shown["label"] == f"context {round(tally.fill * 100)}%"
    assert "$" not in shown["text"]

    # A compaction asked from the console: said in the pill; the gauge is what is left.
    await page.click("#compact")
    await page.wait("document.querySelector('#usage .compactions')?.textContent === 'compacted ×1'")
    await page.wait("document.querySelector('.notice.compacted') !== null")
    after = await pill(page)
    assert after["fill"] == pytest.approx(tally.fill)
    await shot(page, "usage")

    # A reload replays the history: the same totals, not twice as much.
    await page.reload()
    await page.wait("document.body.dataset.connection === 'open'")
    await page.wait("document.querySelector('#usage .compactions')?.textContent === 'compacted ×1'")
    again = await pill(page)
    assert again["text"] == expected_text(tally)
    assert again["fill"] == pytest.approx(tally.fill)
    assert not page.errors()
