"""Every way a DPS master opens a WebSocket meets the subprotocol it asks for, ``rawp-dps-1.0``
(docs/http-api.md: the gateway selects it), so aiohttp never logs "Client
protocols ['rawp-dps-1.0'] don't overlap server-known ones": the session's WebSocket (a bare
master, and the client library ``rawp-gateway chat`` is made of), and ``/acp``, which speaks ACP
with no subprotocol, refuses such an upgrade with a clear error instead of taking a DPS master as
an ACP client. (The router passes the header through to these same endpoints; the browser console
opens the session's WebSocket: tests/team/test_fleet_router.py, tests/console.)"""

from __future__ import annotations

import logging

import aiohttp
import pytest

from gateway.client import GatewayClient
from tests.support.gateway_peer import (
    SUBPROTOCOL,
    Master,
    base_url,
    create_session,
    demo_config,
    prompt_and_wait,
    start_gateway,
    token_header,
)


@pytest.fixture
async def gw(tmp_path):
    client = await start_gateway(demo_config(tmp_path, acp_default_agent="demo"))
    yield client
    await client.close()


def overlaps(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "overlap" in r.getMessage()]


async def test_the_sessions_websocket_meets_the_dps_subprotocol(gw, caplog):
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    sid = (await create_session(gw))["session_id"]
    master = await Master.attach(gw, sid, headers=token_header(gw))
    assert master.ws.protocol == SUBPROTOCOL
    await prompt_and_wait(master, "hi", timeout=30)
    await master.ws.close()
    token = token_header(gw)["Authorization"].removeprefix("Bearer ")
    async with GatewayClient(base_url(gw), token=token) as client:
        conn = await client.attach(sid)
        assert conn.ws.protocol == SUBPROTOCOL
        await conn.close()
    assert overlaps(caplog) == []


async def test_acp_refuses_a_dps_master_instead_of_upgrading_without_its_subprotocol(gw, caplog):
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(
                base_url(gw) + "/acp", protocols=(SUBPROTOCOL,), headers=token_header(gw)
            )
        assert refused.value.status == 400
        async with http.get(
            base_url(gw) + "/acp",
            headers={
                **token_header(gw),
                "Connection": "Upgrade",
                "Upgrade": "websocket",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                "Sec-WebSocket-Protocol": SUBPROTOCOL,
            },
        ) as resp:
            body = await resp.json()
        assert resp.status == 400 and body["error_code"] == "BAD_REQUEST"
        assert "ws_path" in body["message"] and SUBPROTOCOL in body["message"]
        # An ACP client (no subprotocol) is upgraded as ever.
        ws = await http.ws_connect(base_url(gw) + "/acp", headers=token_header(gw))
        assert ws.protocol is None
        await ws.close()
    assert overlaps(caplog) == []
