"""Connection limits (docs/limits.md, "Connections"): headers that trickle in are cut off after
``header_timeout_sec``, connections not yet authenticated are bounded in number
(``max_pending_connections``), and a session takes at most ``max_connections_per_session``
WebSockets. The first two against ``rawp-gateway serve`` itself (its runner counts connections),
on 127.0.0.1, with a bounded number of connections for a bounded time."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from gateway.server import SESSIONS
from gateway.server.limits import ConnectionGuard
from tests.support.gateway_peer import (
    SUBPROTOCOL,
    UPGRADE,
    Master,
    create_session,
    fast_demo,
    make_config,
    start_gateway,
)
from tests.support.servers import serving, user_headers
from tests.support.waiting import eventually


async def trickle(port: int) -> tuple[asyncio.StreamReader, asyncio.Task[None]]:
    """A connection that sends a request line, then one header line every 0.2 s, never the end."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def drip() -> None:
        with contextlib.suppress(ConnectionError):
            writer.write(b"GET /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            for n in range(200):
                await asyncio.sleep(0.2)
                writer.write(b"X-Slow-%d: 1\r\n" % n)
                await writer.drain()
        writer.close()

    return reader, asyncio.ensure_future(drip())


async def closed_after(reader: asyncio.StreamReader) -> float:
    """Seconds until the server closed the connection (EOF or reset)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    with contextlib.suppress(ConnectionError):
        await reader.read()
    return loop.time() - start


async def served(url: str) -> int:
    async with (
        aiohttp.ClientSession(headers=user_headers(url)) as http,
        http.get(url + "/v1/sessions") as resp,
    ):
        return resp.status


async def test_trickling_headers_are_cut_off_and_a_normal_client_is_served(tmp_path):
    """20 connections dripping header lines: each is closed about header_timeout_sec (1 s) after
    it opened, although it keeps sending; meanwhile a client that sends its request at once is
    answered."""
    async with serving(tmp_path, header_timeout_sec=1, max_pending_connections=64) as url:
        port = int(url.rpartition(":")[2])
        conns = [await trickle(port) for _ in range(20)]
        assert await served(url) == 200
        waits = await asyncio.wait_for(
            asyncio.gather(*(closed_after(reader) for reader, _ in conns)), 15
        )
        assert max(waits) < 5, waits
        for _, task in conns:
            task.cancel()
        assert await served(url) == 200


async def test_connections_not_yet_authenticated_are_bounded(tmp_path):
    """With max_pending_connections = 8, of 24 connections that never finish their headers at most
    8 stay open (the others are closed at once, long before the header timeout); once the timeout
    has closed those, a normal client is answered."""
    async with serving(tmp_path, header_timeout_sec=3, max_pending_connections=8) as url:
        port = int(url.rpartition(":")[2])
        conns = [await trickle(port) for _ in range(24)]
        waits = await asyncio.wait_for(
            asyncio.gather(*(closed_after(reader) for reader, _ in conns)), 20
        )
        at_once = [w for w in waits if w < 1.5]
        assert len(at_once) >= 16, waits
        assert max(waits) < 8, waits
        for _, task in conns:
            task.cancel()
        assert await served(url) == 200


def test_the_guard_counts_pending_until_authenticated_or_lost():
    guard = ConnectionGuard(max_pending=2)
    a, b, c = object(), object(), object()
    assert guard.admit(a) and guard.admit(b) and not guard.admit(c)
    guard.authenticated(a)
    assert guard.pending == 1 and guard.admit(c)
    guard.lost(b)
    guard.lost(c)
    assert guard.pending == 0 and guard.refused == 1


async def test_a_session_takes_at_most_max_connections_per_session(tmp_path):
    """A WebSocket upgrade beyond max_connections_per_session is 503 TOO_MANY_CONNECTIONS; when
    one of them closes, the next upgrade is accepted."""
    config = make_config(tmp_path, agents={"demo": fast_demo()}, max_connections_per_session=3)
    gw = await start_gateway(config)
    try:
        sid = (await create_session(gw))["session_id"]
        masters = [await Master.attach(gw, sid) for _ in range(3)]
        refused = await gw.get(
            f"/v1/session/{sid}/ws",
            headers={**UPGRADE, "Sec-WebSocket-Protocol": SUBPROTOCOL},
        )
        assert refused.status == 503
        assert (await refused.json())["error_code"] == "TOO_MANY_CONNECTIONS"
        await masters[0].ws.close()
        session = gw.server.app[SESSIONS][sid]
        await eventually(lambda: len(session.connections) == 2, "the closed master to go")
        again = await Master.attach(gw, sid)
        assert (await again.next())["type"] == "session.capabilities"
        for master in (*masters[1:], again):
            await master.ws.close()
    finally:
        await gw.close()
