"""The browser console (/ui) driven in Debian's headless Chromium (tests/support/browser.py): a page, the
token dialog, the composer, and the DOM queries the console tests share."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from gateway.agent.profiles import builtin_profiles
from tests.support.browser import Browser, Page
from tests.support.gateway_peer import make_config, start_gateway
from tests.support.paths import TESTS
from tests.support.rig.env import require_cli
from tests.support.rig.run import scripted_cli
from tests.support.rig.scenario import parse_scenario

ARTIFACTS = TESTS / "artifacts" / "browser-console"


@contextlib.asynccontextmanager
async def open_page(on_new_document: str | None = None) -> AsyncIterator[Page]:
    """A tab of a new headless Chromium (closed after), running ``on_new_document`` first in
    every document it loads when given."""
    browser = await Browser().start()
    try:
        tab = await browser.page()
        if on_new_document is not None:
            await tab.send("Page.addScriptToEvaluateOnNewDocument", {"source": on_new_document})
        yield tab
    finally:
        await browser.close()


@contextlib.asynccontextmanager
async def claude_code_gateway(
    calls: list[dict[str, Any]], name: str, token: str
) -> AsyncIterator[tuple[Any, Any]]:
    """The real Claude Code CLI against the scripted Messages API answering ``calls``, behind a
    gateway (token ``token``) whose only agent it is, with the workspace ``ws``: the CLI's setup
    and the gateway's client, closed after."""
    binary = require_cli("claude-code")
    scenario = parse_scenario({"run": {}, "calls": calls}, name=name, agent="claude-code")
    async with scripted_cli(scenario) as cli:
        (cli.cwd / "ws").mkdir()
        profile = replace(builtin_profiles(claude=str(binary))["claude-code"], env=cli.env)
        gw = await start_gateway(make_config(cli.cwd, token=token, agents={"claude-code": profile}))
        try:
            yield cli, gw
        finally:
            await gw.close()


def url_of(gateway) -> str:
    return f"http://{gateway.host}:{gateway.port}"


async def shot(page: Page, name: str) -> None:
    """A screenshot of ``page`` into tests/artifacts/browser-console/``name``.png."""
    await page.screenshot(ARTIFACTS / f"{name}.png")


def q(selector: str) -> str:
    return f"document.querySelector({json.dumps(selector)})"


async def sign_in(page: Page, token: str) -> None:
    """Answer the token dialog, once it is open, as a person would."""
    await page.wait("document.getElementById('token-dialog').open")
    await page.js("document.getElementById('token').focus()")
    await page.type_text(token)
    await page.key("Enter")


async def prompt(page: Page, text: str) -> None:
    """Type into the composer and press Enter, as a person would."""
    await page.js("document.getElementById('prompt').focus()")
    await page.type_text(text)
    await page.key("Enter")


async def turns_ended(page: Page, n: int) -> None:
    await page.wait(f"document.querySelectorAll('.turn[data-state=ended]').length >= {n}", 15)


async def log_in_and_create(page: Page, gateway, name: str, token: str) -> str:
    """From the gateway's root: signed in with ``token``, a new session named ``name`` in the
    workspace ``ws``, attached; its id."""
    await page.goto(url_of(gateway) + "/")
    assert await page.js("location.pathname") == "/ui"
    await sign_in(page, token)
    await page.wait("document.querySelectorAll('#new-agent option').length > 0")
    assert await page.js("sessionStorage.getItem('rawp-console.token')") == token
    await page.js(
        "document.getElementById('new-workspace').value = 'ws';"
        f"document.getElementById('new-name').value = {json.dumps(name)};"
    )
    await page.click("#new-session button[type=submit]")
    await page.wait("document.body.dataset.connection === 'open'")
    return await page.js("location.hash.slice('#session='.length)")
