"""The console's usage pill (gateway/console/ui/usage.js) in a real headless Chromium against a real gateway:
with the demo agent, the session's running totals and context gauge are the gateway's own
(``LiveSession.usage``, the same rules in Python) after turns, a compaction and a reload; with the
real Claude Code CLI against the scripted Messages API, the cost it reports is shown."""

from __future__ import annotations

import json

import pytest

from gateway.server import SESSIONS
from tests.support.browser import Page
from tests.support.console import (
    claude_code_gateway,
    log_in_and_create,
    prompt,
    shot,
    sign_in,
    turns_ended,
    url_of,
)
from tests.support.gateway_peer import fast_demo, make_config, start_gateway

pytestmark = pytest.mark.browser

TOKEN = "browser-usage-token"


@pytest.fixture
async def gateway(tmp_path):
    (tmp_path / "ws").mkdir()
    client = await start_gateway(make_config(tmp_path, token=TOKEN, agents={"demo": fast_demo(5)}))
    yield client
    await client.close()


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
    session_id = await log_in_and_create(page, gateway, "usage", TOKEN)
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


@pytest.mark.realcli
async def test_usage_pill_shows_the_cost_claude_code_reports(page):
    """The real Claude Code CLI against the scripted Messages API: the cost it reports is a running
    total over its session, and the pill shows the sum of its increases, which is the last figure
    (and the gateway's own total), not the sum of the figures."""
    calls = [
        {
            "match": {"last_user_contains": "first"},
            "usage": {"input_tokens": 12_000, "output_tokens": 3_000},
            "content": [{"type": "text", "text": "The first answer."}],
        },
        {
            "match": {"last_user_contains": "second"},
            "usage": {"input_tokens": 24_000, "output_tokens": 1_000},
            "content": [{"type": "text", "text": "The second answer."}],
        },
    ]
    async with claude_code_gateway(calls, "usage-cost", TOKEN) as (cli, gw):
        await page.goto(url_of(gw) + "/")
        await sign_in(page, TOKEN)
        await page.wait(
            "[...document.querySelectorAll('#new-agent option')].some(o => o.value === 'claude-code')"
        )
        await page.js(
            "document.getElementById('new-agent').value = 'claude-code';"
            "document.getElementById('new-workspace').value = 'ws';"
        )
        await page.click("#new-session button[type=submit]")
        await page.wait("document.body.dataset.connection === 'open'", 20)
        session_id = await page.js("location.hash.slice('#session='.length)")
        tally = gw.server.app[SESSIONS][session_id].usage
        await prompt(page, "the first prompt")
        await page.wait("document.querySelectorAll('.turn[data-state=ended]').length >= 1", 60)
        first = tally.cost_usd
        await prompt(page, "the second prompt")
        await page.wait("document.querySelectorAll('.turn[data-state=ended]').length >= 2", 60)
        assert tally.turns == 2 and tally.cost_usd > first > 0
        assert tally.cost_reported == pytest.approx(tally.cost_usd)  # the CLI's last figure
        text = f"{tally.input_tokens:,} in · {tally.output_tokens:,} out · ${tally.cost_usd:.4f}"
        await page.wait(
            f"document.querySelector('#usage .usage-totals')?.textContent === {json.dumps(text)}"
        )
        assert (tally.input_tokens, tally.output_tokens) == (36_000, 4_000)
        assert "as the agent reports it" in await page.js("document.getElementById('usage').title")
        assert not cli.server.unexpected
