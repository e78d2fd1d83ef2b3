"""The sockets of an ``/acp`` connection's relayed sessions: to the ``/acp`` of the gateway of the
fleet that holds each (docs/acp-masters.md, "In a fleet"; the decisions are
gateway/protocol/acp_peers.py's, this module only connects, reads, writes and closes).

* A relay is opened by a ``session/load`` of a session a peer lists to the caller: a WebSocket to
  that peer's ``/acp`` with the caller's own ``Authorization`` (the owner checks it and applies the
  caller's identity and role, never this gateway's) and ``X-Forwarded-For`` (believed by an owner
  that trusts this gateway as a proxy), initialized with the client's own ``initialize`` params;
  then the load goes through. A relay that cannot be opened leaves the load refused
  ``SESSION_ON_OTHER_POD`` with the owner's ``acpPath`` (acp.py). A connection opened with a
  one-time ticket has no credential to present: peers list nothing to it, so it relays nothing.
* The owner's messages go to the client's one writer as they came (bounded by its
  ``send_queue_bytes``, as every message to the client), so a client that does not read closes
  its socket (1013) and with it every relay.
* The owner's socket closing closes the client's, with the owner's code (a restart: 1012, a user
  no longer allowed: 1008, a stop that kept no sessions: 1001) or 1012 when it just dropped: the client sees what it would see
  connected to the owner directly, reconnects and loads again with ``lastMessageId``. The client
  leaving closes every relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

import aiohttp
from aiohttp import WSCloseCode

from gateway.protocol.acp_peers import FromPeer, PeerRoutes, initialize_request, initialized
from gateway.session.acp_client import AcpWriter

__all__ = ["PeerSockets"]

log = logging.getLogger("rawp_gateway.acp")

MAX_PEER_MESSAGE: Final = 16 * 1024 * 1024  # one message from a peer's /acp
PEER_INIT_SEC: Final = 10.0  # the peer's answer to the relay's initialize
HEARTBEAT_SEC: Final = 30.0
# The owner's close codes the client gets as they are; any other end is a restart to the client.
# (1001: the owner stopped keeping no sessions, so the session ended with it.)
_MIRRORED: Final = frozenset(
    {WSCloseCode.SERVICE_RESTART, WSCloseCode.POLICY_VIOLATION, 1013, WSCloseCode.GOING_AWAY}
)


class PeerSockets:
    """The relays of one ``/acp`` connection (module docstring)."""

    def __init__(self, http: aiohttp.ClientSession, out: AcpWriter, conn_id: str) -> None:
        self.http = http
        self.out = out
        self.conn_id = conn_id
        self.routes = PeerRoutes()
        self._ws: dict[str, aiohttp.ClientWebSocketResponse] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closing = False

    async def open(
        self, session_id: str, url: str, headers: dict[str, str], init_params: bytes
    ) -> str | None:
        """Connect the relay of ``session_id`` to the ``/acp`` at ``url``; None, or why not."""
        try:
            ws = await self.http.ws_connect(
                url, headers=headers, heartbeat=HEARTBEAT_SEC, max_msg_size=MAX_PEER_MESSAGE
            )
        except aiohttp.WSServerHandshakeError as err:
            return f"its gateway refused the relay: HTTP {err.status}"
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            return f"its gateway could not be reached: {err or type(err).__name__}"
        try:
            async with asyncio.timeout(PEER_INIT_SEC):
                await ws.send_str(initialize_request(init_params).decode())
                msg = await ws.receive()
        except (TimeoutError, aiohttp.ClientError, OSError, ConnectionError):
            msg = None
        if msg is None or msg.type != aiohttp.WSMsgType.TEXT or not initialized(msg.data):
            await ws.close()
            return "its gateway did not initialize the relay"
        self._ws[session_id] = ws
        self._tasks[session_id] = asyncio.create_task(self._read(session_id, ws))
        log.info("relaying session %s to %s", session_id, url, extra={"conn": self.conn_id})
        return None

    async def send(self, session_id: str, data: str) -> None:
        ws = self._ws.get(session_id)
        if ws is None or ws.closed:
            return  # its end is being handled: the client's socket closes
        with contextlib.suppress(ConnectionError, aiohttp.ClientError):
            await ws.send_str(data)

    async def _read(self, session_id: str, ws: aiohttp.ClientWebSocketResponse) -> None:
        routes, out = self.routes, self.out
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            verdict = routes.peer_message(session_id, msg.data)
            if verdict is FromPeer.OWN:
                continue
            out.offer(msg.data.encode())
            if verdict is FromPeer.END:  # the load that opened it failed: nothing to relay
                self._end(session_id)
                await ws.close()
                return
        if self._closing or self._ws.get(session_id) is not ws:
            return
        code = ws.close_code
        code = code if code in _MIRRORED else WSCloseCode.SERVICE_RESTART
        why = f"the gateway that holds session {session_id} closed its relay: load it again"
        if code == WSCloseCode.GOING_AWAY:
            why = f"the gateway that held session {session_id} stopped; the session ended with it"
        log.info("relay of session %s ended (%s)", session_id, ws.close_code)
        self._end(session_id)
        out.close_after_flush(code, why[:120])

    def _end(self, session_id: str) -> None:
        self._ws.pop(session_id, None)
        self._tasks.pop(session_id, None)
        for message in self.routes.drop(session_id):
            self.out.offer(message)

    async def close(self) -> None:
        """The client left: every relay closes."""
        self._closing = True
        tasks = list(self._tasks.values())
        for ws in list(self._ws.values()):
            await ws.close()
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._ws.clear()
        self._tasks.clear()
