"""A webhook receiver on 127.0.0.1 for the notification tests (gateway/team/notify.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer


class Receiver:
    """A webhook receiver: ``mode`` "ok" (204), "500", "500-once" (500 to the first request, then
    204), or "hang" (answers only at close)."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.got: asyncio.Queue[tuple[dict[str, str], bytes]] = asyncio.Queue()
        self.count = 0
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self.server = TestServer(app, host="127.0.0.1")

    async def _hook(self, request: web.Request) -> web.Response:
        self.count += 1
        await self.got.put((dict(request.headers), await request.read()))
        if self.mode == "hang":
            await self._release.wait()
        if self.mode == "500" or (self.mode == "500-once" and self.count == 1):
            return web.Response(status=500)
        return web.Response(status=204)

    @property
    def url(self) -> str:
        return str(self.server.make_url("/hook"))

    async def __aenter__(self) -> Receiver:
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._release.set()
        await self.server.close()

    async def next(self, event: str, timeout: float = 15.0) -> tuple[dict[str, str], bytes]:
        """The next delivery of ``event`` (JSON bodies), skipping others."""
        async with asyncio.timeout(timeout):
            while True:
                headers, body = await self.got.get()
                if json.loads(body).get("event") == event:
                    return headers, body
