"""``/acp`` in a fleet (docs/acp-masters.md#in-a-fleet): two gateways peers of each other, an ACP
client on one of them. ``session/list`` shows both gateways' sessions with the ``/acp`` path of the
one that holds each; ``session/load`` of a session the other holds is relayed there, with the
client's own credentials; one the other gateway refuses to relay (a connection with no
credential to present) is refused ``SESSION_ON_OTHER_POD`` with that path, which the client may
load directly (under that gateway's route prefix, as the router reaches it)."""

from __future__ import annotations

from gateway.server.acp import ACP_OPEN, MAX_ACP_CONNECTIONS
from tests.support.hostile.acp_client import RawAcp
from tests.support.waiting import eventually
from tests.team.test_fleet import AUTH, peered_gateways


async def test_list_and_load_across_the_fleet_name_the_gateway_that_holds_the_session(tmp_path):
    async with peered_gateways(tmp_path) as clients:
        resp = await clients[1].post("/v1/session", json={"agent": "demo"}, headers=AUTH)
        there = await resp.json()
        acp = await RawAcp.connect(clients[0], headers=AUTH)
        init = await acp.call("initialize", {"protocolVersion": 1})
        assert init["result"]["_meta"]["rawp"] == {
            "pod": "rawp-gateway-0",
            "routePrefix": "/pods/rawp-gateway-0",
            "acpPath": "/pods/rawp-gateway-0/acp",
        }
        listed = (await acp.call("session/list"))["result"]["sessions"]
        [entry] = [s for s in listed if s["sessionId"] == there["session_id"]]
        assert entry["_meta"]["rawp"]["pod"] == "rawp-gateway-1"
        assert entry["_meta"]["rawp"]["acpPath"] == "/pods/rawp-gateway-1/acp"
        # Loaded through this gateway: relayed to the one that holds it, ids as they were.
        loaded = await acp.call(
            "session/load", {"sessionId": there["session_id"], "cwd": str(tmp_path)}
        )
        assert loaded["result"]["_meta"]["rawp"]["turnId"] is None
        prompt = {"sessionId": there["session_id"], "prompt": [{"type": "text", "text": "hi"}]}
        await acp.send({"jsonrpc": "2.0", "id": "mine-7", "method": "session/prompt",
                        "params": prompt})  # fmt: skip
        done = await acp.answer_to("mine-7")
        assert done["result"]["stopReason"] == "end_turn"
        missing = await acp.call("session/load", {"sessionId": "nope", "cwd": str(tmp_path)})
        assert missing["error"]["data"]["error_code"] == "SESSION_NOT_FOUND"
        # The client leaving closes the relay's socket on the other gateway.
        assert len(clients[1].server.app[ACP_OPEN]) == 1
        await acp.ws.close()
        await eventually(lambda: not clients[1].server.app[ACP_OPEN], "the relay's socket closed")
        # A wrong token is refused by this gateway, before anything; a connection the other
        # gateway will not take (here: it holds at most as many /acp connections as it holds)
        # leaves the load refused with the path to load it at directly.
        clients[1].server.app[ACP_OPEN].update(object() for _ in range(MAX_ACP_CONNECTIONS))
        try:
            other = await RawAcp.connect(clients[0], headers=AUTH)
            refused = await other.call(
                "session/load", {"sessionId": there["session_id"], "cwd": str(tmp_path)}
            )
        finally:
            clients[1].server.app[ACP_OPEN].clear()
        data = refused["error"]["data"]
        assert data["error_code"] == "SESSION_ON_OTHER_POD", data
        assert data["acpPath"] == "/pods/rawp-gateway-1/acp" and data["pod"] == "rawp-gateway-1"
        direct = RawAcp(await clients[1].ws_connect(data["acpPath"], headers=AUTH))
        loaded = await direct.call(
            "session/load", {"sessionId": there["session_id"], "cwd": str(tmp_path)}
        )
        assert loaded["result"]["_meta"]["rawp"]["turnId"] is None
