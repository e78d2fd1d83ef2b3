"""A raw ACP client on ``/acp`` for hostile-input tests: it sends whatever text or bytes it is
given (no SDK in the way to refuse them) and reads the gateway's JSON-RPC messages one by one."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient

from tests.support.gateway_peer import receive_json

__all__ = ["JsonRpcPeer", "RawAcp"]


class JsonRpcPeer:
    """What both raw clients share: every message received kept in ``messages``, in order, and a
    request's answer found among them; each transport says how to ``send`` and read the ``next``."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._ids = itertools.count(1)

    async def send(self, data: Any) -> None:
        raise NotImplementedError

    async def next(self, timeout: float = 30.0) -> dict[str, Any]:
        raise NotImplementedError

    async def answer_to(self, rpc_id: Any, timeout: float = 30.0) -> dict[str, Any]:
        """The next response with this id (what comes before it is kept in ``messages``)."""
        while True:
            message = await self.next(timeout)
            if message.get("id") == rpc_id and "method" not in message:
                return message

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        rpc_id = next(self._ids)
        await self.send({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params or {}})
        return await self.answer_to(rpc_id)


class RawAcp(JsonRpcPeer):
    """One ``/acp`` WebSocket; ``messages`` keeps every message received, in order."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        super().__init__()
        self.ws = ws

    @classmethod
    async def connect(
        cls, client: TestClient, *, query: str = "", headers: dict[str, str] | None = None
    ) -> RawAcp:
        return cls(await client.ws_connect("/acp" + query, headers=headers))

    async def send(self, data: str | bytes | dict[str, Any]) -> None:
        if isinstance(data, bytes):
            await self.ws.send_bytes(data)
        else:
            await self.ws.send_str(data if isinstance(data, str) else json.dumps(data))

    async def next(self, timeout: float = 30.0) -> dict[str, Any]:
        message = await receive_json(self.ws, timeout)
        self.messages.append(message)
        return message

    async def closed(self, timeout: float = 30.0) -> aiohttp.WSMessage:
        """Read until the gateway closes; the close message."""
        while True:
            async with asyncio.timeout(timeout):
                msg = await self.ws.receive()
            if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                return msg
