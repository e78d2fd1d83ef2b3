"""The browser console in a real headless Chromium (Debian's ``chromium``, driven over the
DevTools protocol by tests/support/browser.py) against a real gateway with the demo agent, a token
configured. Every assertion is on the page's DOM (or the WebSocket URLs Chromium opened).
Screenshots of the main states are written to tests/artifacts/browser-console/."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import sys
import uuid

import aiohttp
import pytest

from gateway.agent.demo import THOUGHT_TEXT
from gateway.cli.translate import translate
from gateway.server import CONFIG, SESSIONS
from tests.support.browser import Page
from tests.support.console import (
    log_in_and_create,
    open_page,
    prompt,
    q,
    shot,
    sign_in,
    turns_ended,
    url_of,
)
from tests.support.gateway_peer import demo_config, fast_demo, make_config, start_gateway
from tests.support.paths import FIXTURES

pytestmark = pytest.mark.browser

TOKEN = "browser-console-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# The 4x3 red PNG of the rig's image scenarios (what the real CLI read in tool-read-image).
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAQAAAADCAIAAAA7ljmRAAAAEElEQVR4nGP4z8AARww4OQD1MQv1NXv7ggAAAABJRU5ErkJggg=="
)
# Slow enough that a turn is still streaming when the test cancels or reloads, fast enough that
# the whole file stays well under a minute.
DELAY_MS = 60

# Records, from the first script of every document on, whether anything was ever shown
# interrupted: the §7.8 finalisation is on screen only between a reload and the history.
# It also collects what the Content-Security-Policy blocked.
WATCH_PAGE = """
window.__sawInterrupted = false;
window.__cspViolations = [];
window.__notices = [];
new MutationObserver(() => {
  if (document.querySelector('[data-state="interrupted"]')) window.__sawInterrupted = true;
}).observe(document, { subtree: true, childList: true, attributes: true });
// Every text the banner is given, in order (one record per textContent set).
new MutationObserver((records) => {
  for (const r of records) {
    if (r.target.id !== 'banner') continue;
    for (const n of r.addedNodes) if (n.textContent) window.__notices.push(n.textContent);
  }
}).observe(document, { subtree: true, childList: true });
document.addEventListener('securitypolicyviolation', (e) => {
  window.__cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`);
});
"""


@pytest.fixture
async def gateway(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("one\ntwo\n")
    config = make_config(tmp_path, token=TOKEN, agents={"demo": fast_demo(DELAY_MS)})
    client = await start_gateway(config)
    yield client
    await client.close()


@pytest.fixture
async def page():
    async with open_page(WATCH_PAGE) as tab:
        yield tab


async def text_of(page: Page, selector: str) -> str:
    return await page.js(f"{q(selector)}?.textContent ?? null")


async def count(page: Page, selector: str) -> int:
    return await page.js(f"document.querySelectorAll({json.dumps(selector)}).length")


async def choose_mode(page: Page, mode: str) -> None:
    await page.js(
        "(() => { const m = document.getElementById('mode');"
        f" m.value = {json.dumps(mode)}; m.dispatchEvent(new Event('change')); }})()"
    )


async def turn_over(gateway, session_id: str, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        resp = await gateway.get(f"/v1/session/{session_id}", headers=AUTH)
        session = await resp.json()
        if session["state"] == "DETACHED" and session["agent_state"] == "idle":
            return
        assert loop.time() < deadline, json.dumps(session)
        await asyncio.sleep(0.05)


async def test_console_drives_a_demo_session(gateway, page):
    session_id = await log_in_and_create(page, gateway, "console test", TOKEN)
    assert await text_of(page, "#session-title") == "console test"
    assert await page.wait(f"{q('#sessions li.current')}?.dataset.sessionId") == session_id

    # The WebSocket carried a one-time ticket, never the token.
    [ws_url] = page.websocket_urls()
    assert re.search(r"[?&]ticket=[\w-]{20,}", ws_url)
    assert TOKEN not in ws_url

    # A prompt: Shift+Enter is a new line, Enter sends; thinking, text, a tool card, usage.
    await page.js("document.getElementById('prompt').focus()")
    await page.type_text("think about it")
    await page.key("Enter", shift=True)
    assert await page.js("document.getElementById('prompt').value") == "think about it\n"
    await page.type_text("and list files")
    await page.key("Enter")
    await turns_ended(page, 1)
    assert await text_of(page, ".prompt") == "think about it\nand list files"
    assert await page.js("document.getElementById('prompt').value") == ""
    thinking = "document.querySelector('.turn details.thinking')"
    assert await page.js(f"{thinking}.open") is False  # collapsed once done, and expandable
    assert "I will answer" in await page.js(
        f"{thinking}.querySelector('.thinking-body').textContent"
    )
    card = ".turn .tool-card[data-tool=Glob]"
    assert await page.js(f"{q(card)}.dataset.outputType") == "file_list"
    assert await page.js(
        f"[...{q(card)}.querySelectorAll('.file-list li')].map(li => li.textContent)"
    ) == ["a.txt"]
    usage = await text_of(page, ".turn .turn-footer .usage")
    assert re.fullmatch(r"[\d,]+ in / [\d,]+ out tokens · \d+\.\d{4} USD", usage), usage

    # A tool call that asks first: the dialog takes the focus and shows the time left; Enter on
    # the focused Allow button answers.
    await prompt(page, "write a.txt")
    await page.wait("document.getElementById('ask-dialog').open")
    assert await page.js("document.getElementById('ask-dialog').contains(document.activeElement)")
    assert await page.js("document.activeElement.dataset.value") == "allow"
    assert re.fullmatch(r"\d+ s left to answer", await text_of(page, "#ask-remaining"))
    target = gateway.server.app[CONFIG].server.workspace_root / "ws" / "a.txt"
    assert await text_of(page, "#ask-question") == f"Allow Write: {target}?"
    await shot(page, "permission")
    await page.key("Enter")
    await turns_ended(page, 2)
    assert not await page.js("document.getElementById('ask-dialog').open")
    write = "[...document.querySelectorAll('.tool-card[data-tool=Write]')].at(-1)"
    assert await page.js(f"{write}.dataset.state") == "success"
    assert await page.js(f"{write}.dataset.outputType") == "diff"
    added = await page.js(f"[...{write}.querySelectorAll('.diff .add')].map(e => e.textContent)")
    removed = await page.js(f"[...{write}.querySelectorAll('.diff .del')].map(e => e.textContent)")
    assert added == ["+Hello from the RAWP demo agent."] and removed == ["-one", "-two"]
    colours = await page.js(
        f"['add', 'del', 'ctx', 'hunk'].map(c => {write}.querySelector('.diff .' + c))"
        ".map(e => e && getComputedStyle(e).backgroundColor)"
    )
    assert colours[0] != colours[1] and "rgba(0, 0, 0, 0)" not in colours[:2]
    assert (await text_of(page, ".notice.ask[data-state=answered] .answer")).endswith("allow")
    await shot(page, "diff")

    # Deny: the tool is refused and says so.
    await prompt(page, "write b.txt")
    await page.wait("document.getElementById('ask-dialog').open")
    await page.click("#ask-options button[data-value=deny]")
    await turns_ended(page, 3)
    denied = "[...document.querySelectorAll('.tool-card[data-tool=Write]')].at(-1)"
    assert await page.js(f"{denied}.dataset.state") == "error"
    answers = await page.js(
        "[...document.querySelectorAll('.notice.ask .answer')].map(e => e.textContent)"
    )
    assert answers[-1].endswith("deny")

    # Esc cancels the running turn while it streams.
    await prompt(page, "hello there")
    streaming = "[...document.querySelectorAll('.turn')].at(-1).querySelector('.text[data-state=streaming]')"
    await page.wait(f"{streaming}?.textContent.length > 0")
    await page.key("Escape")
    await page.wait(
        "[...document.querySelectorAll('.turn')].at(-1).dataset.stopReason === 'cancelled'"
    )
    assert await page.js("document.body.dataset.turn") == "idle"
    last_text = await page.js("[...document.querySelectorAll('.text')].at(-1).textContent")
    assert len(last_text) > 0 and "/compact." not in last_text  # cut short

    # Mode switch and compaction, with the token counts before and after.
    await choose_mode(page, "plan")
    await page.wait(
        "[...document.querySelectorAll('.notice.mode')].at(-1)?.textContent === 'mode: plan'"
    )
    await choose_mode(page, "default")
    await page.wait(
        "[...document.querySelectorAll('.notice.mode')].at(-1)?.textContent === 'mode: default'"
    )
    await page.click("#compact")
    compacted = await page.wait(f"{q('.notice.compacted summary')}?.textContent", 15)
    assert re.fullmatch(r"compacted \(\w+\): [\d,]+ → [\d,]+ tokens", compacted), compacted
    await page.wait("document.body.dataset.turn === 'idle'")

    # Rename from the sessions list: the gateway's session.renamed comes back to the page.
    await page.click("#sessions li.current .rename")
    await page.js("document.querySelector('#sessions .rename-input').value = 'renamed here'")
    await page.click("#sessions .rename-save")
    await page.wait(f"{q('#session-title')}.textContent === 'renamed here'")
    await page.wait(
        "[...document.querySelectorAll('.notice.info')].some(n => n.textContent === 'renamed to “renamed here”')"
    )

    # Phone width: nothing overflows sideways, the sessions list folds behind a button.
    await page.viewport(390, 844)
    assert await page.js("document.documentElement.scrollWidth") <= 390
    assert await page.js("getComputedStyle(document.querySelector('aside')).display") == "none"
    await shot(page, "phone")
    await page.click("#toggle-sessions")
    assert await page.js("getComputedStyle(document.querySelector('aside')).display") == "block"
    await page.click("#toggle-sessions")
    await page.viewport(1200, 800)

    # Everything came from the gateway itself; nothing was blocked, nothing threw.
    own = url_of(gateway)
    requested = [
        e["params"]["request"]["url"]
        for e in page.events
        if e.get("method") == "Network.requestWillBeSent"
    ]
    assert requested and all(u.startswith(own) for u in requested), requested
    assert await page.js("window.__cspViolations") == []
    assert page.errors() == []

    # Delete (two clicks): the session ends and the page says so.
    await page.click("#sessions li.current .delete")
    await page.click("#sessions li.current .delete")
    await page.wait(f"{q('#banner')}.textContent.includes('deleted')")
    resp = await gateway.get(f"/v1/session/{session_id}", headers=AUTH)
    assert (await resp.json())["state"] == "TERMINATED"


async def test_reload_mid_turn_reattaches_and_restores(gateway, page):
    session_id = await log_in_and_create(page, gateway, "reload", TOKEN)
    await prompt(page, "think about it")
    await page.wait(
        "document.querySelector('.turn .text[data-state=streaming]')?.textContent.length > 0"
    )
    assert not await page.js("window.__sawInterrupted")
    await page.reload()

    # The page comes back to the same session and reattaches where it was (DPS-7.8-finalize,
    # DPS-7.8-unfinalize): what was open shows interrupted until the history restores it.
    await turns_ended(page, 1)
    first_url, second_url = page.websocket_urls()
    assert "last_message_id=" not in first_url
    assert re.search(r"[?&]last_message_id=[0-9a-f-]{36}", second_url)
    assert re.search(r"[?&]ticket=", second_url) and TOKEN not in second_url
    assert session_id in second_url
    assert await page.js("window.__sawInterrupted") is True
    assert await count(page, "[data-state=interrupted]") == 0
    assert await count(page, ".badge.interrupted") == 0
    assert await count(page, ".turn") == 1 and await count(page, ".prompt") == 1
    texts = await page.js(
        "[...document.querySelectorAll('.turn .text')].map(t => [t.dataset.state, t.textContent])"
    )
    assert texts and all(state == "done" for state, _ in texts)
    assert texts[-1][1] == THOUGHT_TEXT  # the demo's whole answer to "think about it"
    assert await page.js("document.getElementById('banner').hidden")
    assert page.errors() == []
    await shot(page, "after-reload")


async def test_lost_connection_mid_turn_reconnects_and_restores(gateway, page):
    session_id = await log_in_and_create(page, gateway, "network", TOKEN)
    await prompt(page, "think about it")
    await page.wait(
        "document.querySelector('.turn .text[data-state=streaming]')?.textContent.length > 0"
    )
    # The network drops: the gateway's side of the socket is cut with no close handshake.
    live = gateway.server.app[SESSIONS][session_id]
    for conn in list(live.connections.values()):
        conn._abort()
    await page.wait("window.__sawInterrupted", 5)  # finalised while away (DPS-7.8-finalize)
    await turns_ended(page, 1)  # ...then reattached and restored (DPS-7.8-unfinalize)
    first_url, second_url = page.websocket_urls()
    assert "last_message_id=" not in first_url
    assert re.search(r"[?&]last_message_id=[0-9a-f-]{36}", second_url)
    assert await count(page, "[data-state=interrupted]") == 0
    assert await count(page, ".turn") == 1
    texts = await page.js(
        "[...document.querySelectorAll('.turn .text')].map(t => [t.dataset.state, t.textContent])"
    )
    assert texts and all(state == "done" for state, _ in texts)
    assert texts[-1][1] == THOUGHT_TEXT
    assert await page.js("document.body.dataset.connection") == "open"
    assert page.errors() == []


async def test_a_new_tab_shows_the_conversation_so_far(gateway, page):
    """A second tab (no saved transcript) attaches with ?history=all and shows the earlier prompt
    and the whole answer, with no "truncated" notice; a reload of it reattaches as usual."""
    session_id = await log_in_and_create(page, gateway, "two tabs", TOKEN)
    await prompt(page, "think about it")
    await turns_ended(page, 1)
    tab = await page.browser.page()
    await tab.goto(url_of(gateway) + f"/ui#session={session_id}")
    await sign_in(tab, TOKEN)
    await tab.wait("document.body.dataset.connection === 'open'")
    await turns_ended(tab, 1)
    (first_url,) = tab.websocket_urls()
    assert re.search(r"[?&]history=all(&|$)", first_url) and "last_message_id=" not in first_url
    assert await tab.js("[...document.querySelectorAll('.prompt')].map(p => p.textContent)") == [
        "think about it"
    ]
    texts = await tab.js(
        "[...document.querySelectorAll('.turn .text')].map(t => [t.dataset.state, t.textContent])"
    )
    assert texts and all(state == "done" for state, _ in texts)
    assert texts[-1][1] == THOUGHT_TEXT
    assert await tab.js("document.getElementById('banner').hidden")
    assert await count(tab, "[data-state=interrupted]") == 0
    assert tab.errors() == []
    await shot(tab, "new-tab")
    # Once it has the conversation, the tab is an ordinary master: a reload reattaches after it.
    await tab.reload()
    await tab.wait("document.body.dataset.connection === 'open'")
    await turns_ended(tab, 1)
    assert re.search(r"[?&]last_message_id=[0-9a-f-]{36}", tab.websocket_urls()[-1])
    assert await count(tab, ".prompt") == 1
    assert await tab.js("document.getElementById('banner').hidden")


async def buffered_session(gateway, buffer: dict, **request) -> str:
    """A demo session in the workspace ``ws`` whose gateway keeps ``buffer`` for reattach (the
    session's ``buffer`` setting; ``request``: more of the request): its id."""
    body = {"agent": "demo", "workspace_path": "ws", "buffer": buffer}
    resp = await gateway.post("/v1/session", json=body, **request)
    return (await resp.json())["session_id"]


async def test_truncated_history_is_said_and_keeps_the_interruption(gateway, page):
    # A session whose gateway keeps no frames for reattach: anything missed is lost.
    session_id = await buffered_session(gateway, {"policy": "NONE", "max_bytes": 0}, headers=AUTH)
    await page.goto(url_of(gateway) + "/ui")
    await sign_in(page, TOKEN)
    # Attach from the sessions list.
    item = f"#sessions li[data-session-id='{session_id}']"
    await page.wait(q(item))
    await page.click(f"{item} .attach")
    await page.wait("document.body.dataset.connection === 'open'")
    assert await page.js("location.hash") == f"#session={session_id}"
    await prompt(page, "hello")
    await page.wait(
        "document.querySelector('.turn .text[data-state=streaming]')?.textContent.length > 0"
    )
    # Leave mid-turn and come back once the turn is over: the frames in between are gone.
    await page.goto("about:blank")
    await turn_over(gateway, session_id)
    await page.goto(url_of(gateway) + f"/ui#session={session_id}")
    await page.wait(f"{q('#banner')}.dataset.kind === 'warning'")
    banner = await text_of(page, "#banner")
    assert banner.startswith("History truncated")
    # The finalisation stands: the turn stays interrupted.
    assert await page.js("document.querySelector('.turn').dataset.state") == "interrupted"
    assert await text_of(page, ".turn .stop-reason") == "interrupted (connection lost)"
    await shot(page, "truncated")


def history_parts_received(page: Page) -> list[dict]:
    """The session.history frames the page's WebSockets received, in order."""
    out = []
    for e in page.events:
        if e.get("method") != "Network.webSocketFrameReceived":
            continue
        frame = json.loads(e["params"]["response"]["payloadData"])
        if frame.get("type") == "session.history":
            out.append(frame)
    return out


async def test_a_history_in_parts_is_applied_once(tmp_path, page):
    """A history split to fit max_frame_size (docs/protocol-notes.md) is applied as one: a
    truncated one says so once, and every frame of every part is shown (DPS-7.8-unfinalize)."""
    (tmp_path / "ws").mkdir()
    config = demo_config(tmp_path, delay_ms=1, max_frame_size=4096)
    gateway = await start_gateway(config)
    try:
        # A ring that holds about three of the six turns: the first fall out, the rest take 3+ parts.
        session_id = await buffered_session(gateway, {"policy": "RING", "max_bytes": 40000})
        # With the token the gateway made, in the URL as it prints one (each tab keeps its own).
        session_url = url_of(gateway) + f"/ui#session={session_id}&token={gateway.token}"
        await page.goto(session_url)
        await page.wait("document.body.dataset.connection === 'open'")
        turns = 6
        for n in range(turns):
            await prompt(page, f"think about it {n}")
            await turns_ended(page, n + 1)
        # A new tab has nothing of the session: it asks for all the gateway still holds.
        tab = await page.browser.page()
        await tab.send("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH_PAGE})
        await tab.goto(session_url)
        await tab.wait("document.body.dataset.connection === 'open'")
        await tab.wait(f"{q('#banner')}.dataset.kind === 'warning'")
        parts = history_parts_received(tab)
        assert len(parts) >= 3
        assert [p["metadata"]["history_part"] for p in parts] == list(range(1, len(parts) + 1))
        assert {p["metadata"]["history_parts"] for p in parts} == {len(parts)}
        assert all(p["payload"]["buffer_status"]["truncated"] for p in parts)
        notices = await tab.js("window.__notices")
        assert len(notices) == 1 and "no longer held by the gateway" in notices[0], notices
        # Every frame of every part is on the page: each turn, and each answer in full.
        frames = [f for p in parts for f in p["payload"]["frames"]]
        turn_ids = list(dict.fromkeys(f["turn_id"] for f in frames if f.get("turn_id")))
        assert 1 < len(turn_ids) < turns  # the oldest turns are gone, several are left
        shown = await tab.js(
            "[...document.querySelectorAll('.turn')].map(t => [t.dataset.turnId, t.dataset.state])"
        )
        assert [t for t, _ in shown] == turn_ids
        assert all(state == "ended" for _, state in shown[1:])
        done = [f["payload"]["full_text"] for f in frames if f["type"] == "agent.text.done"]
        texts = await tab.js(
            "[...document.querySelectorAll('.turn .text[data-state=done]')].map(t => t.textContent)"
        )
        assert done and texts[-len(done) :] == done
        prompts = [f["payload"] for f in frames if f["type"] == "control.prompt.request"]
        assert await count(tab, ".prompt") == len(prompts)
        assert tab.errors() == []
        await shot(tab, "history-in-parts")
    finally:
        await gateway.close()


def recorded_frames(name: str) -> list[dict]:
    """The frames a master receives for a recording of the real Claude Code CLI."""
    out = io.BytesIO()
    fixture = FIXTURES / "claude-code" / f"{name}.jsonl"
    translate(fixture.read_bytes().splitlines(), out, session_id=str(uuid.uuid4()))
    return [json.loads(line) for line in out.getvalue().splitlines()]


async def render_in_page(page: Page, frames: list[dict]) -> None:
    """The console's own modules render ``frames`` into a fresh element #fixture."""
    await page.js(
        "(async (frames) => {"
        " const { Renderer } = await import('/ui/render.js');"
        " const { SessionView } = await import('/ui/view.js');"
        " document.getElementById('fixture')?.remove();"
        " const root = Object.assign(document.createElement('div'), { id: 'fixture' });"
        " document.querySelector('main').prepend(root);"
        " const view = new SessionView(frames[0].session_id);"
        " const renderer = new Renderer(root, { fetchBlob: () => Promise.reject(new Error('none')) });"
        " for (const f of frames) if (view.apply(f)) renderer.render(f);"
        f" }})({json.dumps(frames)})"
    )


async def test_recorded_tool_output_renders_by_type(tmp_path, page):
    gateway = await start_gateway(make_config(tmp_path))
    try:
        await page.goto(url_of(gateway) + f"/ui#token={gateway.token}")
        fx = "#fixture"

        # A subagent (DPS §10): its calls and usage nest inside the parent's card, by depth.
        await render_in_page(page, recorded_frames("subagent"))
        parent = f"{fx} .tool-card[data-tool=Agent]"
        sub = f"{parent} > .subagents > .subagent"
        assert await page.js(f"{q(sub)}.dataset.depth") == "1"
        assert "general-purpose: Check the workspace" in await text_of(
            page, f"{sub} .subagent-head"
        )
        assert await text_of(page, f"{sub} .tool-card[data-tool=Bash] .text-output") == "sub"
        assert re.match(r"100 in / 20 out tokens", await text_of(page, f"{sub} > .subagent-usage"))
        assert await page.js(f"{q(parent)}.dataset.outputType") == "agent_result"
        assert await text_of(page, f"{parent} > .tool-stream") == "Running Echo sub"
        assert await text_of(page, f"{fx} .turn > .turn-footer .usage") != await text_of(
            page, f"{sub} > .subagent-usage"
        )

        # file_content with the agent's own line numbers; structured as a JSON tree.
        await render_in_page(page, recorded_frames("tool-read"))
        rows = await page.js(
            f"[...document.querySelectorAll('{fx} .file-content tr')]"
            ".map(r => [...r.cells].map(c => c.textContent))"
        )
        assert rows and [n for n, _ in rows] == [str(i) for i in range(1, len(rows) + 1)]
        assert not any("→" in code for _, code in rows)
        await render_in_page(page, recorded_frames("tool-todowrite"))
        tree = f"{fx} .tool-card[data-tool=TodoWrite] .tool-result .structured details.json"
        assert await page.js(f"{q(tree)}.open") is True
        keys = await page.js(
            f"[...document.querySelectorAll('{tree} .json-key')].map(k => k.textContent)"
        )
        assert "content: " in keys and "status: " in keys

        # Calls of one parallel group stand side by side. The recording made one call per
        # message, so the test puts the Grep call into the Glob call's group.
        frames = recorded_frames("tool-glob-grep")
        requests = [f for f in frames if f["type"] == "tool.invoke.request"]
        requests[1]["payload"]["parallel_group_id"] = requests[0]["payload"]["parallel_group_id"]
        await render_in_page(page, frames)
        group = f"{fx} .parallel"
        assert await count(page, f"{group} > .tool-card") == 2
        tops = await page.js(
            f"[...document.querySelectorAll('{group} > .tool-card')]"
            ".map(c => c.getBoundingClientRect().top)"
        )
        assert tops[0] == tops[1]
        files = f"[...document.querySelectorAll('{group} .file-list li')].map(li => li.textContent)"
        assert await page.js(files) == ["src/a.py", "src/b.py"]

    finally:
        await gateway.close()


def requests_to(page: Page, path_part: str) -> list[dict]:
    """The requests the page made whose URL contains ``path_part`` (method, URL, headers)."""
    return [
        e["params"]["request"]
        for e in page.events
        if e.get("method") == "Network.requestWillBeSent"
        and path_part in e["params"]["request"]["url"]
    ]


async def test_an_image_the_agent_reads_is_shown_in_the_page(gateway, page):
    """The demo agent reads a PNG as Claude Code does; the gateway sends agent.file.transfer and a
    binary_ref result; the page fetches the real file_url with the token and shows the image."""
    root = gateway.server.app[CONFIG].server.workspace_root
    (root / "ws" / "dot.png").write_bytes(PNG)
    session_id = await log_in_and_create(page, gateway, "image", TOKEN)
    await prompt(page, "read dot.png")
    await turns_ended(page, 1)
    card = ".tool-card[data-tool=Read][data-output-type=binary_ref]"
    img = f"{card} .binary-ref img"
    await page.wait(f"{q(img)}?.complete && {q(img)}.naturalWidth > 0")
    assert await page.js(f"[{q(img)}.naturalWidth, {q(img)}.naturalHeight]") == [4, 3]
    assert (await page.js(f"{q(img)}.src")).startswith("blob:")
    assert await text_of(page, f"{card} .binary-label") == f"dot.png · image/png · {len(PNG)} bytes"
    assert await page.js(f"{q(card)}.dataset.state") == "success"
    texts = await page.js("[...document.querySelectorAll('.turn .text')].map(t => t.textContent)")
    assert texts[-1] == "dot.png is a 4x3 image/png image."

    # The bytes came from the gateway's own file_url, fetched with the token in a header.
    (fetched,) = requests_to(page, f"/v1/session/{session_id}/files/")
    assert fetched["url"].startswith(url_of(gateway) + f"/v1/session/{session_id}/files/")
    assert fetched["headers"].get("Authorization") == f"Bearer {TOKEN}"
    assert TOKEN not in fetched["url"]
    got = await gateway.get(fetched["url"][len(url_of(gateway)) :], headers=AUTH)
    assert await got.read() == PNG
    assert await page.js("window.__cspViolations") == []
    assert page.errors() == []
    await shot(page, "image")

    # After a reload the transcript comes back from the tab's storage and the image is fetched
    # again, still with the token.
    await page.reload()
    await page.wait("document.body.dataset.connection === 'open'")
    await page.wait(f"{q(img)}?.complete && {q(img)}.naturalWidth === 4")
    assert len(requests_to(page, f"/v1/session/{session_id}/files/")) == 2
    assert page.errors() == []


# A file dropped on the page, as a drag from the desktop would deliver it.
DROP_FILE = """((name, text) => {
  const data = new DataTransfer();
  data.items.add(new File([text], name, { type: 'text/plain' }));
  const event = new DragEvent('drop', { dataTransfer: data, bubbles: true, cancelable: true });
  document.getElementById('transcript').dispatchEvent(event);
  return event.defaultPrevented;
})"""

# A 3x2 PNG drawn in the page, pasted into the message box as a screenshot would be.
PASTE_PNG = """(async (name) => {
  const blob = await new Promise((resolve) => {
    const c = Object.assign(document.createElement('canvas'), { width: 3, height: 2 });
    c.getContext('2d').fillRect(0, 0, 3, 2);
    c.toBlob(resolve, 'image/png');
  });
  const data = new DataTransfer();
  data.items.add(new File([blob], name, { type: 'image/png' }));
  const event = new ClipboardEvent('paste', { clipboardData: data, bubbles: true, cancelable: true });
  document.getElementById('prompt').dispatchEvent(event);
  return event.defaultPrevented;
})"""


async def test_files_attached_in_the_page_reach_the_agent(tmp_path, page):
    """Attach (the file input), paste and drop: each file is PUT into the session with its type and the
    token, shown as a chip, and named in the next prompt's context_files; the demo agent's answer
    names what it got. Refusals (413, 400, 507) are said on the page and attach nothing."""
    (tmp_path / "ws").mkdir()
    picked = tmp_path / "picked"
    picked.mkdir()
    (picked / "dot.png").write_bytes(PNG)
    (picked / "notes.txt").write_text("a note\n")
    (picked / "big.bin").write_bytes(b"x" * 5000)
    (picked / "fills.bin").write_bytes(b"y" * 3000)
    config = make_config(
        tmp_path,
        token=TOKEN,
        agents={"demo": fast_demo(DELAY_MS)},
        max_upload_bytes=4096,
        max_session_file_bytes=3000,
    )
    gateway = await start_gateway(config)
    try:
        session_id = await log_in_and_create(page, gateway, "attach", TOKEN)
        ready = "#attachments .chip[data-state=ready]"

        await page.set_files("#attach-input", [picked / "dot.png", picked / "notes.txt"])
        await page.wait(f"document.querySelectorAll({json.dumps(ready)}).length === 2")
        assert await page.js(
            "[...document.querySelectorAll('#attachments .chip-name')].map(c => c.textContent)"
        ) == ["dot.png", "notes.txt"]
        assert await page.js(f"{q('#attachments')}.hidden") is False
        assert await page.js(PASTE_PNG + "('pasted.png')") is True
        await page.wait(f"document.querySelectorAll({json.dumps(ready)}).length === 3")
        # One more, dropped, then removed again before sending: it does not go with the prompt.
        assert await page.js(DROP_FILE + "('extra.txt', 'not sent')") is True
        await page.wait(f"document.querySelectorAll({json.dumps(ready)}).length === 4")
        await page.click("#attachments .chip:last-child .chip-remove")
        assert await count(page, "#attachments .chip") == 3
        await shot(page, "attachments")

        puts = [r for r in requests_to(page, "/files?name=") if r["method"] == "PUT"]
        assert [(r["url"].split("name=")[1], r["headers"].get("Content-Type")) for r in puts] == [
            ("dot.png", "image/png"),
            ("notes.txt", "text/plain"),
            ("pasted.png", "image/png"),
            ("extra.txt", "text/plain"),
        ]
        assert all(r["headers"].get("Authorization") == f"Bearer {TOKEN}" for r in puts)

        await prompt(page, "what are these?")
        await turns_ended(page, 1)
        answer = await page.js("[...document.querySelectorAll('.turn .text')].at(-1).textContent")
        assert answer == (
            "I see the image dot.png (4x3). I see the image pasted.png (3x2)."
            " I see the file .rawp/uploads/notes.txt (7 bytes)."
        )
        assert await page.js(
            "[...document.querySelectorAll('.prompt .prompt-files .chip')].map(c => c.textContent)"
        ) == ["dot.png", "notes.txt", "pasted.png"]
        # The images in the prompt's bubble are thumbnails of the stored files.
        thumbs = "[...document.querySelectorAll('.prompt .prompt-files img.thumb')]"
        await page.wait(f"{thumbs}.length === 2 && {thumbs}.every(i => i.complete)")
        assert await page.js(f"{thumbs}.map(i => [i.alt, i.naturalWidth, i.naturalHeight])") == [
            ["dot.png", 4, 3],
            ["pasted.png", 3, 2],
        ]
        await shot(page, "attached")
        assert await count(page, "#attachments .chip") == 0
        assert await page.js(f"{q('#attachments')}.hidden") is True
        assert not (tmp_path / "ws" / ".rawp" / "uploads" / "extra.txt").exists()

        # Refusals are said, and nothing is attached.
        await page.set_files("#attach-input", [picked / "big.bin"])
        await page.wait(f"{q('#banner')}.textContent.includes('big.bin')")
        assert (await text_of(page, "#banner")).startswith(
            "Could not attach big.bin: FILE_TOO_LARGE"
        )
        assert await page.js(f"{q('#banner')}.dataset.kind") == "error"
        assert await page.js(PASTE_PNG + "('bad\\u0001name.png')") is True
        await page.wait(f"{q('#banner')}.textContent.includes('INVALID_FILE_NAME')")
        await page.set_files("#attach-input", [picked / "fills.bin"])
        await page.wait(f"{q('#banner')}.textContent.includes('fills.bin')")
        assert "SESSION_STORAGE_FULL" in await text_of(page, "#banner")
        assert await count(page, "#attachments .chip") == 0
        resp = await gateway.get(f"/v1/session/{session_id}", headers=AUTH)
        assert resp.status == 200
        assert await page.js("window.__cspViolations") == []
        assert page.errors() == []
    finally:
        await gateway.close()


async def test_a_session_deleted_elsewhere_leaves_nothing_to_send(gateway, page):
    """Another master (or the gateway's shutdown) deletes the attached session: the page says so
    and, once the socket has closed too, every control that would send something is off."""
    session_id = await log_in_and_create(page, gateway, "deleted elsewhere", TOKEN)
    resp = await gateway.delete(f"/v1/session/{session_id}", headers=AUTH)
    assert resp.status == 200
    await page.wait(f"{q('#banner')}.textContent.includes('deleted')")
    await page.wait("document.body.dataset.connection === 'ended'")
    await page.wait("document.getElementById('send').disabled")
    controls = "['prompt', 'send', 'attach', 'cancel', 'compact', 'mode']"
    disabled = await page.js(f"{controls}.map(id => document.getElementById(id).disabled)")
    assert disabled == [True] * 6, disabled
    assert page.errors() == []


async def test_an_agent_that_dies_shows_its_stderr_and_why_the_session_ended(tmp_path, page):
    """The fatal agent.error's details on the page: the end of stderr under the message, and a
    session.deleted that says the gateway ended it (not "by client", as if the user had)."""
    from dataclasses import replace

    (tmp_path / "ws").mkdir()
    script = "import sys; sys.stderr.write('starting\\nno model configured\\n'); sys.exit(3)"
    dying = replace(
        fast_demo(), command=(sys.executable, "-c", script, "{prompt}"), single_turn_process=True
    )
    client = await start_gateway(make_config(tmp_path, token=TOKEN, agents={"demo": dying}))
    try:
        await log_in_and_create(page, client, "dies", TOKEN)
        await prompt(page, "hello")
        await page.wait(f"{q('.notice pre.error-stderr')} !== null", 15)
        assert await text_of(page, ".notice pre.error-stderr") == "starting\nno model configured"
        error = await text_of(page, ".notice.error")
        assert error.startswith("agent fatal: AGENT_EXIT: the agent process ended with exit code 3")
        await page.wait(
            "[...document.querySelectorAll('.notice')].some(n => "
            "n.textContent.startsWith('session ended: the gateway ended it'))",
            15,
        )
        assert "by client" not in await page.js("document.body.textContent")
        assert page.errors() == []
    finally:
        await client.close()


async def test_the_demo_console_url_opens_on_the_terminals_session(tmp_path, page):
    """`rawp-gateway demo` prints the console's URL with its session: opened, the page is
    attached to the session the terminal client runs (its prompt is in the page), and a hash
    changed to another session moves the tab there."""
    import argparse
    import os

    from gateway.chat import add_chat_arguments
    from gateway.cli.demo import run_demo_async

    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace-root")
    add_chat_arguments(parser, with_url=False)
    args = parser.parse_args(["--workspace-root", str(tmp_path)])
    read_fd, write_fd = os.pipe()
    out = io.StringIO()
    with open(read_fd, encoding="utf-8") as stdin, open(write_fd, "w", encoding="utf-8") as typed:
        demo = asyncio.create_task(run_demo_async(args, stdin=stdin, stdout=out))
        typed.write("list files\n")
        typed.flush()
        found = None
        for _ in range(400):
            found = re.search(
                r"^browser console: (http://\S+/ui#session=([0-9a-f-]{36})&token=(\S+))$",
                out.getvalue(),
                re.M,
            )
            if found and "— end_turn" in out.getvalue():
                break
            await asyncio.sleep(0.05)
        assert found and "— end_turn" in out.getvalue(), out.getvalue()
        url, session_id, token = found.groups()
        assert f"session {session_id} · agent demo" in out.getvalue()
        await page.goto(url)
        await page.wait("document.body.dataset.connection === 'open'")
        await page.wait(f"{q('.prompt')}?.textContent === 'list files'")
        # The token was taken out of the address; the session stays in it.
        assert await page.js("location.hash") == f"#session={session_id}"
        # Another session, by changing the hash of the open tab.
        base = url.split("/ui#", 1)[0]
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{base}/v1/session",
                json={"agent": "demo"},
                headers={"Authorization": f"Bearer {token}"},
            ) as resp,
        ):
            other = (await resp.json())["session_id"]
        await page.js(f"location.hash = '#session={other}'")
        await page.wait(
            f"document.querySelector('#sessions li.current')?.dataset.sessionId === '{other}'",
            15,  # the list is refreshed every 5 s
        )
        assert await count(page, ".prompt") == 0
        assert page.errors() == []
        typed.close()  # end of input: the chat ends and deletes its session
        assert await asyncio.wait_for(demo, 30) == 0


async def test_the_url_demo_prints_signs_the_page_in_once_and_leaves_its_address(tmp_path, page):
    """``demo --ui`` makes its own token and prints the console's URL with it in the fragment:
    the page keeps it as a typed one (no dialog, the agents load), takes it out of its address at
    once, and a reload needs nothing more."""
    import contextlib

    from gateway.cli.demo import run_demo_async
    from tests.support.chat import demo_ui_args
    from tests.support.waiting import eventually

    args = demo_ui_args(tmp_path)
    out = io.StringIO()
    demo = asyncio.create_task(run_demo_async(args, stdin=io.StringIO(""), stdout=out))
    try:
        found = await eventually(
            lambda: re.search(r"^browser console: (\S+/ui)#token=(\S+) ", out.getvalue(), re.M),
            "the console's URL",
        )
        base, token = found.group(1), found.group(2)
        async with aiohttp.ClientSession() as http, http.get(base[:-3] + "/v1/agents") as resp:
            assert resp.status == 401  # the demo's gateway wants it too
        await page.goto(f"{base}#token={token}")
        await page.wait("document.getElementById('new-agent').options.length > 0")
        assert await page.js("document.getElementById('token-dialog').open") is False
        assert await page.js("sessionStorage.getItem('rawp-console.token')") == token
        assert token not in await page.js("location.href")
        assert await page.js("location.hash") == ""
        await page.goto(base)
        await page.wait("document.getElementById('new-agent').options.length > 0")
        assert await page.js("document.getElementById('token-dialog').open") is False
        assert page.errors() == []
    finally:
        demo.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await demo
