"""The browser console lists a workspace's saved conversations and continues one (real headless
Chromium, marked ``browser``), against a real gateway with a token whose Claude Code profile reads
a store in a throwaway HOME (files in the shape 2.1.328 writes: ``test_conversations.py``). The
profile is single-turn, so nothing is spawned before a prompt: no CLI is needed."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gateway.agent.profiles import builtin_profiles
from tests.support.browser import Page
from tests.support.console import shot, sign_in, url_of
from tests.support.gateway_peer import make_config, start_gateway
from tests.support.saved import Store, conversation

pytestmark = pytest.mark.browser

TOKEN = "conversations-console-token"
AGENT = "claude-code-oneshot"


@pytest.fixture
async def gateway(tmp_path):
    store = Store(tmp_path)
    base = builtin_profiles(claude="/nonexistent/claude")[AGENT]
    profile = replace(base, env={"HOME": str(store.home)})
    config = make_config(store.workspace.parent, token=TOKEN, agents={AGENT: profile})
    client = await start_gateway(config)
    yield client, store
    await client.close()


async def test_console_lists_saved_conversations_and_continues_one(gateway, page: Page) -> None:
    client, store = gateway
    store.put(conversation(store.workspace, "The old one.", "Old answer."), age=100)
    new = store.put(conversation(store.workspace, "Remember 42.", "Noted."))
    await page.goto(url_of(client) + "/ui")
    await sign_in(page, TOKEN)
    await page.wait("document.querySelectorAll('#new-agent option').length > 0")
    # The demo profile keeps no conversations: its button is off until a profile that does.
    assert await page.js("document.getElementById('list-conversations').disabled")
    await page.js(
        "(() => { const a = document.getElementById('new-agent');"
        f" a.value = {json.dumps(AGENT)}; a.dispatchEvent(new Event('change'));"
        f" document.getElementById('new-workspace').value = {json.dumps(store.workspace.name)};"
        " })()"
    )
    await page.click("#list-conversations")
    await page.wait("!document.getElementById('conversations').hidden")
    listed = await page.js(
        "[...document.querySelectorAll('#conversations li')]"
        ".map(li => [li.dataset.conversationId, li.querySelector('.title').textContent])"
    )
    assert listed[0] == [new, "Remember 42."]  # newest first
    assert listed[1][1] == "The old one."
    await shot(page, "saved-conversations")
    await page.click(f"#conversations li[data-conversation-id='{new}'] button")
    await page.wait("document.body.dataset.connection === 'open'")
    await page.wait("document.querySelectorAll('.turn .text').length >= 1")
    assert await page.js("[...document.querySelectorAll('.prompt')].map(p => p.textContent)") == [
        "Remember 42."
    ]
    assert await page.js("document.querySelector('.turn .text').textContent") == "Noted."
    # Shown as the past: the replayed prompt and turn are marked.
    assert await page.js("document.querySelector('.prompt').dataset.replayed") == "yes"
    assert await page.js("document.querySelector('.turn').dataset.replayed") == "yes"
    await shot(page, "continued-conversation")
    sessions = (await (await client.get("/v1/sessions", headers=_auth())).json())["sessions"]
    assert [s.get("agent_session_id") for s in sessions] == [new], sessions
    assert page.errors() == []


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}
