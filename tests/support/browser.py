"""A headless Chromium driven over the DevTools protocol, for the browser console's tests.

Debian's ``chromium`` (``scripts/install-chromium.sh``) is started with a fresh profile and
``--remote-debugging-port=0``; the port it picked is read from ``DevToolsActivePort`` in that
profile. ``Browser.page()`` opens a tab and attaches to it (flat sessions); ``Page`` sends commands,
evaluates JavaScript, waits for conditions, types with real key events and takes screenshots. No
package beyond aiohttp is needed, and nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = os.environ.get("RAWP_TEST_CHROMIUM", "/usr/bin/chromium")
FLAGS = (
    "--headless",
    "--no-sandbox",  # the tests run as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--mute-audio",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)
START_TIMEOUT_SEC = 20.0


def chromium_path() -> str | None:
    """The Chromium binary, or None when it is not installed."""
    path = shutil.which(CHROMIUM) if not os.path.isabs(CHROMIUM) else CHROMIUM
    return path if path and os.access(path, os.X_OK) else None


class CdpError(Exception):
    pass


class Browser:
    """One Chromium process and its browser-level DevTools WebSocket."""

    def __init__(self) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="rawp-chromium-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.http: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> Browser:
        binary = chromium_path()
        if binary is None:
            raise RuntimeError(f"{CHROMIUM} is not installed (scripts/install-chromium.sh)")
        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        port_file = self.profile / "DevToolsActivePort"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_SEC
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            if loop.time() > deadline:
                raise RuntimeError("chromium did not open its DevTools port")
            await asyncio.sleep(0.05)
        port, path = port_file.read_text().split("\n")[:2]
        self.http = aiohttp.ClientSession()
        self.ws = await self.http.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self.ws is not None
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if "id" in data:
                fut = self._pending.pop(data["id"], None)
                if fut is not None and not fut.done():
                    if "error" in data:
                        fut.set_exception(CdpError(data["error"].get("message", "error")))
                    else:
                        fut.set_result(data.get("result", {}))
            else:
                for listener in list(self._listeners):
                    listener(data)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(CdpError("the DevTools connection closed"))

    async def send(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        assert self.ws is not None
        msg_id = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = fut
        await self.ws.send_str(
            json.dumps({"id": msg_id, "method": method, "params": params or {}, **kw})
        )
        return await asyncio.wait_for(fut, 30)

    async def page(self, width: int = 1200, height: int = 800) -> Page:
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self, attached["sessionId"])
        self._listeners.append(page._on_event)
        for domain in ("Page", "Runtime", "Network"):
            await page.send(f"{domain}.enable")
        await page.viewport(width, height)
        return page

    async def close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.send("Browser.close")
            await self.ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self.http is not None:
            await self.http.close()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    """One tab: commands, JavaScript, waiting, keys, screenshots; events it saw are kept."""

    def __init__(self, browser: Browser, session_id: str) -> None:
        self.browser = browser
        self.session_id = session_id
        self.events: list[dict[str, Any]] = []
        self._loaded = asyncio.Event()

    def _on_event(self, data: dict[str, Any]) -> None:
        if data.get("sessionId") != self.session_id:
            return
        self.events.append(data)
        if data.get("method") == "Page.loadEventFired":
            self._loaded.set()

    async def send(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return await self.browser.send(method, params, sessionId=self.session_id)

    async def viewport(self, width: int, height: int) -> None:
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600},
        )

    async def goto(self, url: str) -> None:
        self._loaded.clear()
        await self.send("Page.navigate", {"url": url})
        await asyncio.wait_for(self._loaded.wait(), 15)

    async def reload(self) -> None:
        self._loaded.clear()
        await self.send("Page.reload")
        await asyncio.wait_for(self._loaded.wait(), 15)

    async def js(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise CdpError(f"{expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait(self, expression: str, timeout: float = 10.0) -> Any:
        """Poll until ``expression`` is truthy in the page; its value."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # A DOM node does not come back by value: it counts as found.
        probe = f"(() => {{ const v = ({expression}); return v instanceof Node ? true : v; }})()"
        while True:
            value = await self.js(probe)
            if value:
                return value
            if loop.time() > deadline:
                raise TimeoutError(f"page never satisfied: {expression}")
            await asyncio.sleep(0.05)

    async def click(self, selector: str) -> None:
        found = await self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return false; e.click(); return true; })()"
        )
        if not found:
            raise CdpError(f"no element {selector}")

    async def set_files(self, selector: str, paths: list[Path]) -> None:
        """Choose files in an ``<input type=file>``, as the file dialog would (it fires change)."""
        found = await self.send(
            "Runtime.evaluate", {"expression": f"document.querySelector({json.dumps(selector)})"}
        )
        object_id = found["result"].get("objectId")
        if object_id is None:
            raise CdpError(f"no element {selector}")
        await self.send(
            "DOM.setFileInputFiles", {"files": [str(p) for p in paths], "objectId": object_id}
        )

    async def type_text(self, text: str) -> None:
        await self.send("Input.insertText", {"text": text})

    async def key(self, key: str, *, shift: bool = False) -> None:
        """A real key press (keydown, char, keyup) on the focused element."""
        codes = {"Enter": 13, "Escape": 27, "Tab": 9}
        base = {
            "key": key,
            "code": key,
            "windowsVirtualKeyCode": codes[key],
            "modifiers": 8 if shift else 0,
        }
        await self.send("Input.dispatchKeyEvent", {"type": "rawKeyDown", **base})
        if key == "Enter":
            await self.send("Input.dispatchKeyEvent", {"type": "char", "text": "\r", **base})
        await self.send("Input.dispatchKeyEvent", {"type": "keyUp", **base})

    async def screenshot(self, path: Path) -> Path:
        data = await self.send("Page.captureScreenshot", {"format": "png"})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def errors(self) -> list[str]:
        """Uncaught exceptions and console errors the page reported."""
        out = []
        for e in self.events:
            if e.get("method") == "Runtime.exceptionThrown":
                out.append(e["params"]["exceptionDetails"].get("text", "exception"))
            elif e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] == "error":
                out.append(" ".join(str(a.get("value", "")) for a in e["params"]["args"]))
        return out

    def websocket_urls(self) -> list[str]:
        return [
            e["params"]["url"] for e in self.events if e.get("method") == "Network.webSocketCreated"
        ]
