"""Make docs/browser-console.png: the browser console attached to a demo session, as it is today.

    .venv/bin/python scripts/browser-console-screenshot.py [OUT.png]

The same every time: a gateway with the embedded demo agent (no model, no network) on a loopback
port, its workspace root /tmp/rawp-demo (emptied, then main.py and notes.txt), Debian's Chromium
(scripts/install-chromium.sh) driven by tests/support/browser.py at 1100x720. In the page, as a person
would: create the session "refactor notes", ask "think about it and list files", then
"write notes.txt" and allow it in the dialog; the shot is taken once both turns have ended, with
the thinking block unfolded. Look at the result before committing it.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aiohttp import web  # noqa: E402

from gateway.config import Config, ServerSettings, builtin_profiles  # noqa: E402
from gateway.server import create_app  # noqa: E402
from tests.support.browser import Browser  # noqa: E402

WORKSPACE = Path("/tmp/rawp-demo")  # shown in the picture: the same on every machine
WIDTH, HEIGHT = 1100, 720
# The sessions list (refreshed every 5 s) says the session is idle again.
IDLE_IN_LIST = "document.querySelector('#sessions li.current')?.textContent.includes('idle')"


async def make(out: Path) -> None:
    shutil.rmtree(WORKSPACE, ignore_errors=True)
    WORKSPACE.mkdir(parents=True)
    (WORKSPACE / "main.py").write_text("print('hello')\n")
    (WORKSPACE / "notes.txt").write_text("first draft\nto be replaced\n")
    config = Config(
        server=ServerSettings(host="127.0.0.1", port=0, workspace_root=WORKSPACE),
        agents=builtin_profiles(),
    )
    runner = web.AppRunner(create_app(config), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    browser = await Browser().start()
    try:
        page = await browser.page(WIDTH, HEIGHT)
        await page.goto(url + "/ui")
        await page.wait("document.querySelectorAll('#new-agent option').length > 0")
        await page.js(
            "document.getElementById('new-agent').value = 'demo';"
            "document.getElementById('new-name').value = 'refactor notes';"
        )
        await page.click("#new-session button[type=submit]")
        await page.wait("document.body.dataset.connection === 'open'")
        for n, text in enumerate(("think about it and list files", "write notes.txt"), 1):
            await page.js("document.getElementById('prompt').focus()")
            await page.type_text(text)
            await page.key("Enter")
            if text.startswith("write"):
                await page.wait("document.getElementById('ask-dialog').open", 15)
                await page.key("Enter")  # the focused Allow button
            await page.wait(
                f"document.querySelectorAll('.turn[data-state=ended]').length >= {n}", 15
            )
        # Thinking folds once done: shown unfolded, as a click on it does. No focus ring.
        await page.js(
            "document.querySelector('.turn details.thinking').open = true;"
            "document.activeElement.blur()"
        )
        await page.wait(f"{IDLE_IN_LIST} && document.body.dataset.connection === 'open'", 15)
        await asyncio.sleep(0.5)  # a script, not a test: let the last repaint land
        await page.screenshot(out)
        errors = page.errors()
        if errors:
            raise SystemExit(f"the page reported errors: {errors}")
    finally:
        await browser.close()
        await runner.cleanup()
        shutil.rmtree(WORKSPACE, ignore_errors=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "browser-console.png"
    asyncio.run(make(target))
