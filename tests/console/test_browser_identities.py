"""The browser console as a signed-in user (docs/identities.md): Debian's headless Chromium
(tests/support/browser.py) against a real gateway with a users file and the demo agent."""

from __future__ import annotations

import pytest

from tests.support.auth import bearer, shared_with_viewer, users_config
from tests.support.console import q, sign_in, url_of
from tests.support.gateway_peer import Master, fast_demo, start_gateway

pytestmark = pytest.mark.browser

ALICE, BOB = "alice-console-token", "bob-console-token"


@pytest.fixture
async def gateway(tmp_path):
    users = {"alice": ("operator", ALICE), "bob": ("viewer", BOB)}
    config = users_config(tmp_path, users, agents={"demo": fast_demo(20)})
    client = await start_gateway(config)
    yield client
    await client.close()


async def shown(page, selector: str) -> bool:
    """The element exists and is laid out (not display: none, nor inside something that is)."""
    return await page.js(
        f"(() => {{ const e = {q(selector)}; return !!e && e.offsetParent !== null; }})()"
    )


async def test_a_viewer_sees_who_did_what_and_is_offered_nothing_it_cannot_do(gateway, page):
    sid = await shared_with_viewer(gateway, ALICE, "bob", name="shared")
    alice = await Master.attach(gateway, sid, headers=bearer(ALICE))
    await alice.send("control.prompt.request", {"prompt_text": "write from-alice.txt"})
    ask = await alice.until("agent.interaction.request")

    await page.goto(url_of(gateway) + f"/ui#session={sid}")
    await sign_in(page, BOB)
    await page.wait("document.body.dataset.connection === 'open'")
    await page.wait("document.querySelector('.notice.ask') !== null")
    assert await page.js("document.getElementById('whoami').textContent") == "bob · viewer"
    assert await page.js("document.body.dataset.mayOperate") == "no"
    # Nothing a viewer cannot do is offered: no composer, cancel, compaction, mode, new session,
    # rename or delete, and the question is not put to him (it is in the transcript).
    for selector in ("#composer", "#prompt", "#cancel", "#compact", "#mode", "#new-session"):
        assert not await shown(page, selector), selector
    assert (
        await page.js("document.querySelectorAll('#sessions .rename, #sessions .delete').length")
        == 0
    )
    assert await shown(page, "#sessions .attach")
    assert not await page.js("document.getElementById('ask-dialog').open")
    # Alice's prompt carries her name; her answer shows who gave it.
    assert await page.js(f"{q('.prompt')}.dataset.by") == "alice"
    await alice.send(
        "control.interaction.response",
        {"interaction_id": ask["payload"]["interaction_id"], "selected_value": "allow"},
    )
    await page.wait("document.querySelector('.notice.ask[data-answered-by]') !== null")
    assert await page.js(f"{q('.notice.ask')}.dataset.answeredBy") == "alice"
    assert (await page.js(f"{q('.notice.ask .answer')}.textContent")).endswith("allow by alice")
    await page.wait("document.querySelectorAll('.turn[data-state=ended]').length >= 1", 15)


async def test_an_operator_is_offered_the_composer_but_not_rename_or_delete(gateway, page):
    await page.goto(url_of(gateway) + "/ui")
    await sign_in(page, ALICE)
    await page.wait("document.querySelectorAll('#new-agent option').length > 0")
    assert await page.js("document.getElementById('whoami').textContent") == "alice · operator"
    assert await shown(page, "#new-session")
    await page.click("#new-session button[type=submit]")
    await page.wait("document.body.dataset.connection === 'open'")
    assert await shown(page, "#composer")
    await page.wait("document.querySelectorAll('#sessions li').length === 1")
    assert (
        await page.js("document.querySelectorAll('#sessions .rename, #sessions .delete').length")
        == 0
    )
