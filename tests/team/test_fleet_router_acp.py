"""An ACP client connected to the fleet router's ``/acp`` directly (the official ACP Python SDK's
WebSocket transport, no relay of ours in front of it) drives every pod's sessions: the gateway the
router chose relays a session another gateway holds to that gateway's ``/acp`` with the client's
own credentials (docs/acp-masters.md, "In a fleet"). Real parts: Debian's nginx running the
router template, three ``rawp-gateway serve`` processes (tests/support/fleet_rig.py)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import aiohttp
import pytest
from acp import PROTOCOL_VERSION, RequestError, connect_to_agent, text_block
from acp.schema import ClientCapabilities, UserMessageChunk
from acp.ws.client import create_websocket_stream

from gateway.client import GatewayClient
from tests.server.test_acp_master_sdk import Recorder
from tests.support.acp_editors import a_turn_with_a_permission_then_a_cancel, node_ready, ts_editor
from tests.support.auth import bearer, users_toml
from tests.support.fleet_rig import Fleet, nginx_path
from tests.support.waiting import eventually
from tests.team.test_fleet_router import ACP_TURN, dps_turn

pytestmark = pytest.mark.nginx
TOKENS = {"alice": "alice-token-aaaa", "bob": "bob-token-bbbb"}
ROLES = {"alice": "operator", "bob": "viewer"}


@pytest.fixture
async def fleet(tmp_path):
    if nginx_path() is None:
        pytest.fail("nginx is not installed (scripts/install-nginx.sh)")
    users = tmp_path / "users.toml"
    users.write_text(users_toml({n: (ROLES[n], TOKENS[n]) for n in TOKENS}))
    extras = tuple(
        f"[auth]\nusers_file = {json.dumps(str(users))}\n"
        f"audit_log = {json.dumps(str(tmp_path / f'pod-{i}' / 'audit.jsonl'))}\n"
        for i in range(3)
    )
    f = Fleet(tmp_path, extras=extras)  # type: ignore[arg-type]
    try:
        await f.start()
        yield f
    finally:
        f.close()


async def sessions_on_every_pod(fleet: Fleet) -> dict[str, str]:
    """One session of alice's on each pod, started by a DPS master inside the cluster, with a
    turn in its history and shared with bob as a viewer: pod -> session id."""
    made = {}
    for pod in fleet.pods:
        async with GatewayClient(pod.url, token=TOKENS["alice"]) as client:
            sid = (await client.create_session("demo"))["session_id"]
            await dps_turn(client, sid, f"hello {pod.name}")
        async with aiohttp.ClientSession() as http:
            members = {"members": {"bob": "viewer"}}
            url = f"{pod.url}/v1/session/{sid}"
            async with http.patch(url, json=members, headers=bearer(TOKENS["alice"])) as resp:
                assert resp.status == 200
        made[pod.name] = sid
    return made


async def sdk(fleet: Fleet, user: str, recorder: Recorder):
    """The official SDK on the router's ``/acp``; the connection and the pod that answered."""
    url = fleet.router.url.replace("http", "ws", 1) + "/acp"
    transport = await create_websocket_stream(url, headers=bearer(TOKENS[user]))
    conn = connect_to_agent(recorder, transport)
    init = await conn.initialize(
        protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities()
    )
    return conn, init.field_meta["rawp"]["pod"]


async def test_the_sdk_on_the_routers_acp_lists_loads_and_drives_another_pods_session(fleet):
    """List shows every pod's sessions; a session a DPS master started on another pod than the
    one the router chose loads (its history replayed), takes a prompt with a permission
    question answered by the client, and a cancel; a viewer loads it and is refused a prompt."""
    sessions = await sessions_on_every_pod(fleet)
    rec = Recorder()
    conn, front = await sdk(fleet, "alice", rec)
    try:
        async with asyncio.timeout(ACP_TURN):
            listed = await conn.list_sessions()
            pods = {s.session_id: s.field_meta["rawp"]["pod"] for s in listed.sessions}
            assert {pods[sid] for sid in sessions.values()} == set(sessions)
            others = [pod for pod in sessions if pod != front]
            assert len(others) == 2  # the router chose one pod: two sessions are relayed
            for pod in others:
                sid = sessions[pod]
                loaded = await conn.load_session(cwd=str(fleet.workspace), session_id=sid)
                assert loaded.field_meta["rawp"]["turnId"] is None
                said = [u for s, u in rec.updates if s == sid and isinstance(u, UserMessageChunk)]
                assert f"hello {pod}" in "".join(u.content.text for u in said)
            # A prompt whose tool asks: the question reaches the client, its answer goes back.
            pod = others[0]
            sid = sessions[pod]
            done = await conn.prompt(
                session_id=sid, prompt=[text_block(f"write {pod}.txt with hi")]
            )
            assert done.stop_reason == "end_turn"
            assert [asked[0] for asked in rec.asked] == [sid]
            assert (fleet.workspace / f"{pod}.txt").exists()
            # A cancel while the question is open ends the turn cancelled.
            rec.choose, rec.asked_event = None, asyncio.Event()
            turn = asyncio.ensure_future(
                conn.prompt(session_id=sid, prompt=[text_block("write never.txt")])
            )
            await rec.asked_event.wait()
            await conn.cancel(session_id=sid)
            rec.release.set()
            assert (await turn).stop_reason == "cancelled"
            assert not (fleet.workspace / "never.txt").exists()
            # The other relayed session, and the front's own, still take prompts.
            rec.choose = "allow"
            for pod in (others[1], front):
                if pod == front:
                    await conn.load_session(cwd=str(fleet.workspace), session_id=sessions[pod])
                done = await conn.prompt(session_id=sessions[pod], prompt=[text_block("hello")])
                assert done.stop_reason == "end_turn"
        # A viewer: loads another pod's session, and its prompt is refused there, by its role.
        bob_rec = Recorder()
        bob, bob_front = await sdk(fleet, "bob", bob_rec)
        try:
            async with asyncio.timeout(ACP_TURN):
                bobs = next(p for p in others if p != bob_front)
                await bob.load_session(cwd=str(fleet.workspace), session_id=sessions[bobs])
                with pytest.raises(RequestError) as refused:
                    await bob.prompt(session_id=sessions[bobs], prompt=[text_block("no")])
                assert refused.value.data["error_code"] == "FORBIDDEN"
        finally:
            await bob.close()
        # The gateway that holds the session applied the callers' own identities and roles.
        await eventually(
            lambda: (
                {("prompt", "alice", "ok"), ("permission", "alice", "ok")}
                <= audited(fleet, others[0])
                and ("prompt", "bob", "refused") in audited(fleet, bobs)
            ),
            "the owner's audit log names the callers",
        )
    finally:
        await conn.close()


def audited(fleet: Fleet, pod: str) -> set[tuple[str, str, str]]:
    path = fleet.pod(pod).home / "audit.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return {(r["action"], r.get("user"), r.get("result")) for r in map(json.loads, lines)}


async def test_the_owner_pod_restarting_closes_the_relayed_connection_1012_and_a_load_resumes(
    fleet,
):
    """The gateway that holds a relayed session restarts (SIGTERM, same name and state): the
    client's connection to the router closes with 1012, as a connection to that gateway itself
    would; the client connects again and loads after the last ``messageId`` it saw: nothing is
    repeated, and the session takes a prompt."""
    sessions = await sessions_on_every_pod(fleet)
    url = fleet.router.url.replace("http", "ws", 1) + "/acp"
    headers = bearer(TOKENS["alice"])
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(url, headers=headers)
        init = await call(ws, 1, "initialize", {"protocolVersion": 1})
        front = init["result"]["_meta"]["rawp"]["pod"]
        pod = next(p for p in sessions if p != front)
        sid = sessions[pod]
        seen: list[str] = []
        loaded = await call(ws, 2, "session/load", {"sessionId": sid, "cwd": "/"}, seen)
        synced = loaded["result"]["_meta"]["rawp"]["lastMessageId"]
        assert seen
        restarting = fleet.pod(pod)
        assert restarting.stop() == 0
        async with asyncio.timeout(ACP_TURN):
            while (await ws.receive()).type == aiohttp.WSMsgType.TEXT:
                pass
        assert ws.close_code == 1012
        await restarting.start(fleet.workspace)
        ws = await http.ws_connect(url, headers=headers)
        await call(ws, 1, "initialize", {"protocolVersion": 1})
        params = {"sessionId": sid, "cwd": "/", "_meta": {"rawp": {"lastMessageId": synced}}}
        again: list[str] = []
        loaded = await call(ws, 2, "session/load", params, again)
        assert "result" in loaded, loaded
        assert not set(again) & set(seen), "an update was repeated"
        prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "after the restart"}]}
        done = await call(ws, 3, "session/prompt", prompt, again)
        assert done["result"]["stopReason"] == "end_turn"
        await ws.close()


async def call(
    ws: aiohttp.ClientWebSocketResponse,
    rpc_id: int,
    method: str,
    params: dict[str, Any],
    seen: list[str] | None = None,
) -> dict[str, Any]:
    """A request and its answer; the ``messageId`` of each message chunk (the session's news, not
    its state said again) before it goes to ``seen``."""
    await ws.send_json({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
    async with asyncio.timeout(ACP_TURN):
        while True:
            message = json.loads((await ws.receive()).data)
            if message.get("id") == rpc_id and "method" not in message:
                return message
            params = message.get("params") or {}
            kind = params.get("update", {}).get("sessionUpdate", "")
            if seen is not None and kind.endswith("message_chunk"):
                seen.append(params["_meta"]["rawp"]["messageId"])


async def test_the_ts_sdk_over_streamable_http_through_the_router(fleet, tmp_path):
    """The TypeScript SDK's Streamable HTTP client at a pod's ``/pods/<pod>/acp`` through the
    router (nginx over HTTP/1.1 both ways): its connection's and session's event streams pass
    each event at once (a turn waits on its question, which only comes on a stream that is not
    buffered), and a turn with a permission and a cancel goes as on a gateway itself."""
    if why := node_ready():
        pytest.fail(why)
    pod = fleet.pods[1].name
    env = {**os.environ, "ACP_HEADERS": json.dumps(bearer(TOKENS["alice"]))}
    url = f"{fleet.router.url}/pods/{pod}/acp?agent=demo"
    async with ts_editor(["--http", url], env, tmp_path) as ed:
        init = await ed.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        assert init["_meta"]["rawp"]["pod"] == pod
        async with asyncio.timeout(ACP_TURN):
            sid = await a_turn_with_a_permission_then_a_cancel(ed, fleet.workspace)
        listed = await ed.request("session/list", {})
        assert {"sessionId": sid, "pod": pod} in [
            {"sessionId": s["sessionId"], "pod": s["_meta"]["rawp"]["pod"]}
            for s in listed["sessions"]
        ]


async def test_the_ts_sdk_over_streamable_http_at_the_routers_acp_stays_on_its_gateway(
    fleet, tmp_path
):
    """The router's ``/acp`` sends a Streamable HTTP ``initialize`` to any ready gateway, which
    names itself in a cookie; the SDK keeps it (as the RFD asks of clients) and the router sends
    every later request of the connection to that gateway: a turn with a permission and a cancel,
    and the load of a session another pod holds (relayed), all on one connection."""
    if why := node_ready():
        pytest.fail(why)
    sessions = await sessions_on_every_pod(fleet)
    env = {**os.environ, "ACP_HEADERS": json.dumps(bearer(TOKENS["alice"]))}
    async with ts_editor(["--http", f"{fleet.router.url}/acp?agent=demo"], env, tmp_path) as ed:
        init = await ed.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        front = init["_meta"]["rawp"]["pod"]
        async with asyncio.timeout(ACP_TURN):
            sid = await a_turn_with_a_permission_then_a_cancel(ed, fleet.workspace)
            other = next(pod for pod in sessions if pod != front)
            load = {"sessionId": sessions[other], "cwd": str(fleet.workspace)}
            await ed.request("session/load", load)
            assert f"hello {other}" in ed.text(sessions[other], "user_message_chunk")
        listed = await ed.request("session/list", {})
        pods = {s["sessionId"]: s["_meta"]["rawp"]["pod"] for s in listed["sessions"]}
        assert pods[sid] == front
