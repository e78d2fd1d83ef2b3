"""A raw ACP client of ``/acp`` over Streamable HTTP for hostile-input tests: it POSTs whatever
body and headers it is given (no SDK in the way to refuse them) and reads the gateway's messages
off the connection's ``GET /acp`` event stream one by one, and off the session streams it opens,
each message noted with the stream it came on (``came_on``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, Final

import aiohttp
from aiohttp.test_utils import TestClient

from tests.support.hostile.acp_client import JsonRpcPeer

__all__ = ["INITIALIZE", "RawHttpAcp"]

INITIALIZE: Final = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": 1, "clientCapabilities": {}},
}


class RawHttpAcp(JsonRpcPeer):
    """One Streamable HTTP connection; ``messages`` keeps every event received, in order, and
    ``came_on`` the stream each came on (a session id, or None: the connection's)."""

    def __init__(self, client: TestClient, conn_id: str, headers: dict[str, str], path: str):
        super().__init__()
        self.client = client
        self.conn_id = conn_id
        self.headers = {**headers, "Acp-Connection-Id": conn_id}
        self.path = path
        self._events: asyncio.Queue[tuple[str | None, dict[str, Any]] | None] = asyncio.Queue()
        self._readers: list[asyncio.Task[None]] = []
        self.came_on: list[str | None] = []

    @classmethod
    async def open(
        cls,
        client: TestClient,
        *,
        path: str = "/acp",
        headers: dict[str, str] | None = None,
        stream: bool = True,
    ) -> RawHttpAcp:
        """``initialize``, then (with ``stream``) the connection's event stream."""
        resp = await client.post(path, json=INITIALIZE, headers=headers)
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["result"]["protocolVersion"] == 1
        acp = cls(client, resp.headers["Acp-Connection-Id"], headers or {}, path)
        if stream:
            await acp.stream()
        return acp

    async def stream(self, session_id: str | None = None) -> aiohttp.ClientResponse:
        """Open the connection's event stream, or (``session_id``) that session's."""
        headers = {**self.headers, "Accept": "text/event-stream"}
        if session_id is not None:
            headers["Acp-Session-Id"] = session_id
        resp = await self.client.get(self.path, headers=headers)
        assert resp.status == 200, await resp.text()
        self._readers.append(asyncio.create_task(self._read(resp, session_id)))
        return resp

    async def _read(self, resp: aiohttp.ClientResponse, session_id: str | None) -> None:
        data: list[str] = []
        try:
            async for raw in resp.content:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                elif not line and data:
                    self._events.put_nowait((session_id, json.loads("\n".join(data))))
                    data = []
        except (aiohttp.ClientError, ConnectionError):
            pass
        finally:
            if session_id is None:
                self._events.put_nowait(None)  # the connection's stream ended

    async def close(self) -> None:
        for reader in self._readers:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def post(self, data: Any, **headers: str) -> int:
        """POST ``data`` (a dict as JSON, anything else as aiohttp sends it): the status."""
        body = json.dumps(data) if isinstance(data, dict) else data
        all_headers = {"Content-Type": "application/json", **self.headers, **headers}
        resp = await self.client.post(self.path, data=body, headers=all_headers)
        await resp.read()
        return resp.status

    async def send(self, data: Any) -> None:
        """POST one message the gateway must take (202)."""
        status = await self.post(data)
        assert status == 202, status

    async def next(self, timeout: float = 30.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            message = await self._events.get()
        if message is None:
            self._events.put_nowait(None)
            raise ConnectionError("the event stream ended")
        stream, data = message
        self.messages.append(data)
        self.came_on.append(stream)
        return data

    async def ended(self, timeout: float = 30.0) -> None:
        """Read until the event stream ends."""
        with contextlib.suppress(ConnectionError):
            while True:
                await self.next(timeout)
