"""What became of a session's MCP servers in the console (gateway/console/ui/mcp.js), in a real
headless Chromium against a real gateway (docs/mcp.md#in-the-console-and-the-chat): with the
demo agent, which takes no server, each server a master gave is shown failed, and why; with the
real Claude Code CLI against the scripted Messages API and a real stdio MCP server
(tests/support/mcp_servers.py), the servers are pending until the agent reports, and the next
catalog shows one connected with its tools and one failed. No secret reaches the page."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import mcp_servers
from tests.support.auth import bearer
from tests.support.browser import Page
from tests.support.console import claude_code_gateway, prompt, shot, sign_in, turns_ended, url_of
from tests.support.gateway_peer import fast_demo, make_config, start_gateway

pytestmark = pytest.mark.browser

TOKEN = "browser-mcp-token"
SECRET = "console-mcp-secret-3e9d"  # in an env value, a header value, an argument: never shown


def request_servers(stdio: list[str]) -> list[dict[str, Any]]:
    return [
        {"name": "local", "command": stdio, "env": {"KEY": SECRET}},
        {
            "name": "broken",
            "url": "http://127.0.0.1:9/mcp",
            "headers": {"Authorization": f"Bearer {SECRET}"},
        },
    ]


async def shown(page: Page) -> dict[str, Any]:
    return await page.js(
        "(() => { const m = document.getElementById('mcp');"
        " return { hidden: m.hidden, state: m.dataset.state,"
        " summary: m.querySelector('summary')?.textContent ?? null,"
        " servers: [...m.querySelectorAll('.mcp-server')].map(li => ({"
        " name: li.dataset.name, status: li.dataset.status,"
        " badge: li.querySelector('.mcp-status').textContent,"
        " meta: li.querySelector('.mcp-meta').textContent,"
        " reason: li.querySelector('.mcp-reason')?.textContent ?? null })) }; })()"
    )


async def open_session(page: Page, gateway, agent: str, servers: list[dict[str, Any]]) -> str:
    resp = await gateway.post(
        "/v1/session",
        json={"agent": agent, "workspace_path": "ws", "mcp_servers": servers},
        headers=bearer(TOKEN),
    )
    assert resp.status == 201, await resp.text()
    session_id = (await resp.json())["session_id"]
    # The token in the address, as `serve` prints it: the page keeps it and takes it out.
    await page.goto("about:blank")  # a new document, not a move within the console's
    await page.goto(url_of(gateway) + f"/ui#session={session_id}&token={TOKEN}")
    await page.wait("document.body.dataset.connection === 'open'", 20)
    return session_id


async def test_servers_the_agent_cannot_take_are_shown_failed_and_why(tmp_path, page):
    (tmp_path / "ws").mkdir()
    gateway = await start_gateway(make_config(tmp_path, token=TOKEN, agents={"demo": fast_demo(5)}))
    try:
        await page.goto(url_of(gateway) + "/")
        await sign_in(page, TOKEN)
        await page.wait("document.querySelectorAll('#new-agent option').length > 0")
        assert (await shown(page))["hidden"] is True  # not attached: nothing to show
        await open_session(page, gateway, "demo", request_servers(["docs-mcp", f"--key={SECRET}"]))
        await page.wait("!document.getElementById('mcp').hidden")
        before = await shown(page)
        assert before["state"] == "failed" and before["summary"] == "MCP 0/2 · 2 failed"
        assert before["servers"] == [
            {
                "name": "local",
                "status": "failed",
                "badge": "✗ failed",
                "meta": "stdio · from request · 0 tools",
                "reason": "the agent does not take stdio servers",
            },
            {
                "name": "broken",
                "status": "failed",
                "badge": "✗ failed",
                "meta": "http · from request · 0 tools",
                "reason": "the agent does not take http servers",
            },
        ]
        # A failed server is marked where it is listed, not only by its words.
        colour = await page.js(
            "getComputedStyle(document.querySelector('.mcp-server[data-status=failed]'))"
            ".borderLeftStyle"
        )
        assert colour == "solid"
        await prompt(page, "hello")  # the session runs all the same
        await turns_ended(page, 1)
        await page.click("#mcp summary")
        await shot(page, "mcp-failed")
        assert SECRET not in await page.js("document.documentElement.outerHTML")
        assert not page.errors()
    finally:
        await gateway.close()


@pytest.mark.realcli
async def test_claude_codes_report_replaces_pending_with_connected_and_failed(page):
    calls = [{"content": [{"type": "text", "text": "Servers seen."}]}]
    async with claude_code_gateway(calls, "mcp-console", TOKEN) as (cli, gw):
        servers = request_servers(mcp_servers.stdio_command())
        await open_session(page, gw, "claude-code", servers)
        await page.wait("!document.getElementById('mcp').hidden")
        # Claude Code says nothing of its servers before its first turn starts it.
        before = await shown(page)
        assert [s["status"] for s in before["servers"]] == ["pending", "pending"]
        assert before["state"] == "partial" and before["summary"] == "MCP 0/2"
        await prompt(page, "which servers?")
        await page.wait("document.querySelectorAll('.turn[data-state=ended]').length >= 1", 60)
        await page.wait(
            "document.querySelector('.mcp-server[data-name=local]')?.dataset.status"
            " === 'connected'",
            30,
        )
        after = await shown(page)
        local, broken = after["servers"]
        assert after["state"] == "failed" and after["summary"] == "MCP 1/2 · 1 failed"
        assert local["badge"] == "connected" and local["reason"] is None
        assert local["meta"] == "stdio · from request · 2 tools"  # echo, secret_digest
        assert broken["status"] == "failed" and broken["badge"] == "✗ failed"
        tools = await page.js("document.querySelector('.mcp-server[data-name=local]').title")
        assert set(tools.split("\n")) == {"mcp__local__echo", "mcp__local__secret_digest"}
        await page.click("#mcp summary")
        await shot(page, "mcp-claude-code")
        assert SECRET not in await page.js("document.documentElement.outerHTML")
        assert not cli.server.unexpected
