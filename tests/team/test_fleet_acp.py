"""``/acp`` in a fleet (docs/acp-masters.md#in-a-fleet): two gateways peers of each other, an ACP
client on one of them. ``session/list`` shows both gateways' sessions with the ``/acp`` path of the
one that holds each; ``session/load`` of a session the other holds is refused with that path, and
the client loads it there (under that gateway's route prefix, as the router reaches it)."""

from __future__ import annotations

from tests.support.hostile.acp_client import RawAcp
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
        refused = await acp.call(
            "session/load", {"sessionId": there["session_id"], "cwd": str(tmp_path)}
        )
        data = refused["error"]["data"]
        assert data["error_code"] == "SESSION_ON_OTHER_POD"
        assert data["acpPath"] == "/pods/rawp-gateway-1/acp" and data["pod"] == "rawp-gateway-1"
        # The other gateway answers its prefixed /acp (the router's /pods/<pod>/acp) and loads it.
        other = RawAcp(await clients[1].ws_connect(data["acpPath"], headers=AUTH))
        loaded = await other.call(
            "session/load", {"sessionId": there["session_id"], "cwd": str(tmp_path)}
        )
        assert loaded["result"]["_meta"]["rawp"]["turnId"] is None
        missing = await acp.call("session/load", {"sessionId": "nope", "cwd": str(tmp_path)})
        assert missing["error"]["data"]["error_code"] == "SESSION_NOT_FOUND"
