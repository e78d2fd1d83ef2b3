"""Hostile ACP clients on ``/acp`` never take a session or the gateway down (beside the DPS ones of
test_hostile_input.py): each test plays one attack against a real gateway on 127.0.0.1 (real
server, demo agent process, a raw WebSocket client: tests/support/hostile/acp_client.py) and checks
that the attacker gets a JSON-RPC error or a clean close, never a 500 or a traceback, while the
session goes on for its other masters (docs/acp-masters.md#limits)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from gateway.server import SESSIONS
from tests.support.auth import bearer
from tests.support.gateway_peer import (
    Master,
    demo_config,
    prompt_and_wait,
    start_gateway,
)
from tests.support.hostile.acp_client import RawAcp
from tests.support.waiting import eventually


@pytest.fixture
async def gw(tmp_path):
    client = await start_gateway(demo_config(tmp_path, max_frame_size=64 * 1024))
    yield client
    await client.close()


async def a_turn(acp: RawAcp, session_id: str) -> dict:
    answer = await acp.call(
        "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "hi"}]}
    )
    assert answer["result"]["stopReason"] == "end_turn", answer
    return answer


async def test_the_upgrade_names_the_connection_and_initialize_answers_version_1(gw, tmp_path):
    acp = await RawAcp.connect(gw)
    assert len(acp.ws._response.headers["Acp-Connection-Id"]) == 36
    init = await acp.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    assert init["result"]["protocolVersion"] == 1
    assert init["result"]["agentCapabilities"]["loadSession"] is True
    # session/new is answered before anything is said about the session it names.
    await acp.send(
        {"jsonrpc": "2.0", "id": "n", "method": "session/new",
         "params": {"cwd": str(tmp_path), "_meta": {"rawp": {"agent": "demo"}}}}
    )  # fmt: skip
    first = await acp.next()
    assert first["id"] == "n" and "sessionId" in first["result"], first


@pytest.mark.parametrize(
    ("data", "code"),
    [
        ("{not json", -32700),
        ("[" * 60_000, -32700),  # deep nesting, never a RecursionError
        (
            '{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"_meta":'
            + "[" * 500
            + "]" * 500
            + "}}",
            -32700,
        ),
        ('[{"jsonrpc":"2.0","id":1,"method":"initialize"}]', -32600),
        ('{"jsonrpc":"1.0","id":1,"method":"initialize"}', -32600),
        ('{"jsonrpc":"2.0","id":1,"method":"fs/delete_everything"}', -32601),
        ('{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"prompt":7}}', -32602),
        (b"\x00\x01binary", -32700),
    ],
)
async def test_malformed_input_is_a_json_rpc_error_and_the_connection_goes_on(
    gw, tmp_path, data, code
):
    acp = await RawAcp.connect(gw, query="?agent=demo")
    await acp.send(data)
    error = await acp.next()
    assert error["error"]["code"] == code, error
    assert "Traceback" not in error["error"]["message"]
    new = await acp.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
    await a_turn(acp, new["result"]["sessionId"])


async def test_a_message_over_max_frame_size_closes_cleanly_and_the_session_goes_on(gw, tmp_path):
    acp = await RawAcp.connect(gw, query="?agent=demo")
    new = await acp.call("session/new", {"cwd": str(tmp_path)})
    sid = new["result"]["sessionId"]
    master = await Master.attach(gw, sid)
    await acp.send(
        '{"jsonrpc":"2.0","id":9,"method":"session/prompt","params":{"sessionId":"'
        + sid
        + '","prompt":[{"type":"text","text":"'
        + "x" * 70_000
        + '"}]}}'
    )
    closed = await acp.closed()
    assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    assert acp.ws.close_code == 1009
    frames = await prompt_and_wait(master, "still there?", timeout=30)
    assert frames[-1]["type"] == "session.usage"
    # The ACP client comes back and loads the session, history and all.
    again = await RawAcp.connect(gw)
    loaded = await again.call("session/load", {"sessionId": sid, "cwd": str(tmp_path)})
    assert "result" in loaded
    texts = [m["params"]["update"] for m in again.messages if m.get("method") == "session/update"]
    assert any(u["sessionUpdate"] == "user_message_chunk" for u in texts)
    assert (await gw.get("/healthz")).status == 200


async def test_a_flood_of_requests_is_refused_then_cut_off_never_a_500(gw, tmp_path):
    acp = await RawAcp.connect(gw, query="?agent=demo")
    new = await acp.call("session/new", {"cwd": str(tmp_path)})
    sid = new["result"]["sessionId"]
    for i in range(2000):
        await acp.send({"jsonrpc": "2.0", "id": 1000 + i, "method": "session/set_mode",
                        "params": {"sessionId": sid, "modeId": "nonsense"}})  # fmt: skip
    codes = []
    while True:
        try:
            message = await acp.next(timeout=30)
        except ConnectionError:
            break
        if "id" in message:
            codes.append(message["error"]["data"]["error_code"])
    assert "RATE_LIMITED" in codes and "INVALID_REQUEST" in codes
    assert acp.ws.close_code == 1008
    # The session it drove goes on.
    master = await Master.attach(gw, sid)
    frames = await prompt_and_wait(master, "after the flood", timeout=30)
    assert frames[-1]["type"] == "session.usage"


async def test_refusals_of_session_new_name_the_reason(gw, tmp_path):
    acp = await RawAcp.connect(gw)
    none = await acp.call("session/new", {"cwd": str(tmp_path)})
    assert none["error"]["data"]["error_code"] == "AGENT_REQUIRED"
    assert "demo" in none["error"]["message"]
    unknown = await acp.call(
        "session/new", {"cwd": str(tmp_path), "_meta": {"rawp": {"agent": "nope"}}}
    )
    assert unknown["error"]["data"]["error_code"] == "AGENT_NOT_FOUND"
    outside = await acp.call("session/new", {"cwd": "/", "_meta": {"rawp": {"agent": "demo"}}})
    assert outside["error"]["data"]["error_code"] == "WORKSPACE_FORBIDDEN"
    missing = await acp.call(
        "session/new", {"cwd": str(tmp_path / "nope"), "_meta": {"rawp": {"agent": "demo"}}}
    )
    assert missing["error"]["data"]["error_code"] == "WORKSPACE_NOT_FOUND"
    assert not gw.server.app[SESSIONS]  # nothing created for a refusal
    other = await acp.call("session/prompt", {"sessionId": "nope", "prompt": []})
    assert other["error"]["data"]["error_code"] == "SESSION_NOT_FOUND"
    gone = await acp.call("session/load", {"sessionId": "nope", "cwd": str(tmp_path)})
    assert gone["error"]["code"] == -32002
    resp = await gw.get("/acp", params={"agent": "nope"}, headers={"Upgrade": "websocket"})
    assert resp.status == 404 and (await resp.json())["error_code"] == "AGENT_NOT_FOUND"


async def test_a_second_prompt_while_one_runs_is_refused_and_the_first_one_ends(tmp_path):
    gw = await start_gateway(demo_config(tmp_path, delay_ms=30))
    try:
        acp = await RawAcp.connect(gw, query="?agent=demo")
        sid = (await acp.call("session/new", {"cwd": str(tmp_path)}))["result"]["sessionId"]
        long = "tell me a long story about " + " and ".join(["cats"] * 40)
        await acp.send({"jsonrpc": "2.0", "id": "first", "method": "session/prompt",
                        "params": {"sessionId": sid, "prompt": [{"type": "text", "text": long}]}})  # fmt: skip
        second = await acp.call(
            "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "b"}]}
        )
        assert second["error"]["data"]["error_code"] == "PROMPT_IN_PROGRESS"
        first = await acp.answer_to("first")
        assert first["result"]["stopReason"] == "end_turn"
    finally:
        await gw.close()


async def test_credentials_as_for_every_websocket_bearer_or_a_one_time_ticket(tmp_path):
    gw = await start_gateway(demo_config(tmp_path, token="s3cret"))
    try:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await RawAcp.connect(gw)
        assert refused.value.status == 401
        acp = await RawAcp.connect(gw, headers=bearer("s3cret"))
        assert "result" in await acp.call("session/list")
        resp = await gw.post("/v1/acp/ws-ticket", headers=bearer("s3cret"))
        ticket = (await resp.json())["ticket"]
        by_ticket = await RawAcp.connect(gw, query=f"?ticket={ticket}")
        assert "result" in await by_ticket.call("session/list")
        with pytest.raises(aiohttp.WSServerHandshakeError) as spent:
            await RawAcp.connect(gw, query=f"?ticket={ticket}")
        assert spent.value.status == 401
        # A session's ticket does not open /acp.
        resp = await gw.post("/v1/session", json={"agent": "demo"}, headers=bearer("s3cret"))
        sid = (await resp.json())["session_id"]
        resp = await gw.post(f"/v1/session/{sid}/ws-ticket", headers=bearer("s3cret"))
        with pytest.raises(aiohttp.WSServerHandshakeError) as wrong:
            await RawAcp.connect(gw, query=f"?ticket={(await resp.json())['ticket']}")
        assert wrong.value.status == 401
    finally:
        await gw.close()


async def test_a_client_that_leaves_mid_turn_leaves_the_session_running(gw, tmp_path):
    acp = await RawAcp.connect(gw, query="?agent=demo")
    sid = (await acp.call("session/new", {"cwd": str(tmp_path)}))["result"]["sessionId"]
    await acp.send({"jsonrpc": "2.0", "id": 5, "method": "session/prompt",
                    "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "think about it"}]}})  # fmt: skip
    await acp.ws.close()
    live = gw.server.app[SESSIONS][sid]
    await eventually(lambda: not live.connections, "the view to leave the session")
    master = await Master.attach(gw, sid)
    frames = await prompt_and_wait(master, "and now?", timeout=30)
    assert frames[-1]["type"] == "session.usage"


async def test_a_load_after_the_last_message_id_seen_neither_loses_nor_repeats_an_update(
    gw, tmp_path
):
    """What a relay does after a dropped connection: it loads with the last messageId it passed
    on and gets exactly the messages after it (docs/acp-masters.md, session/load)."""
    acp = await RawAcp.connect(gw, query="?agent=demo")
    sid = (await acp.call("session/new", {"cwd": str(tmp_path)}))["result"]["sessionId"]
    await a_turn(acp, sid)
    await a_turn(acp, sid)
    seen = [
        m["params"]["_meta"]["rawp"]["messageId"]
        for m in acp.messages
        if m.get("method") == "session/update"
    ]
    assert len(seen) == len(set(seen)) > 6
    mark = seen[len(seen) // 2]
    await acp.ws.close()
    again = await RawAcp.connect(gw)
    loaded = await again.call(
        "session/load",
        {"sessionId": sid, "cwd": str(tmp_path), "_meta": {"rawp": {"lastMessageId": mark}}},
    )
    replayed = [
        m["params"]["_meta"]["rawp"]["messageId"]
        for m in again.messages
        if m.get("method") == "session/update"
    ]
    # The first turn's and the second's prompts were this client's own (never echoed live); a
    # replay includes them as user messages: the live updates after the mark are a subsequence.
    after = seen[len(seen) // 2 + 1 :]
    assert [m for m in replayed if m in set(after)] == after
    # Before it, only the session's state is said again (its commands, as when they were first
    # sent): no update of the history.
    state = {
        m["params"]["_meta"]["rawp"]["messageId"]
        for m in again.messages
        if m.get("method") == "session/update" and m["params"]["_meta"]["rawp"].get("state")
    }
    assert state
    assert not (set(replayed) - state) & set(seen[: len(seen) // 2 + 1])
    assert loaded["result"]["_meta"]["rawp"]["lostFrames"] == 0
    assert loaded["result"]["_meta"]["rawp"]["lastMessageId"]
    # Nothing new since: a load after the last id replays nothing.
    last = loaded["result"]["_meta"]["rawp"]["lastMessageId"]
    before = len(again.messages)
    await again.call(
        "session/load",
        {"sessionId": sid, "cwd": str(tmp_path), "_meta": {"rawp": {"lastMessageId": last}}},
    )
    updates = [m for m in again.messages[before:] if m.get("method") == "session/update"]
    assert all(m["params"]["_meta"]["rawp"]["state"] for m in updates)


async def test_a_load_after_the_turn_started_knows_the_turn_and_a_cancel_reaches_it(gw, tmp_path):
    """A client that drops while a turn waits on its permission question and loads after the last
    messageId it saw replays no turn start: the load still names the running turn, and a
    session/cancel on the new connection ends that turn (docs/acp-masters.md, session/load)."""
    acp = await RawAcp.connect(gw, query="?agent=demo")
    sid = (await acp.call("session/new", {"cwd": str(tmp_path)}))["result"]["sessionId"]
    await acp.send({"jsonrpc": "2.0", "id": "p", "method": "session/prompt",
                    "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "write late.txt"}]}})  # fmt: skip
    while (await acp.next()).get("method") != "session/request_permission":
        pass
    last = [
        m["params"]["_meta"]["rawp"]["messageId"]
        for m in acp.messages
        if m.get("method") == "session/update" and not m["params"]["_meta"]["rawp"].get("state")
    ][-1]
    await acp.ws.close()
    again = await RawAcp.connect(gw)
    loaded = await again.call(
        "session/load",
        {"sessionId": sid, "cwd": str(tmp_path), "_meta": {"rawp": {"lastMessageId": last}}},
    )
    running = loaded["result"]["_meta"]["rawp"]["turnId"]
    assert running == gw.server.app[SESSIONS][sid].machine.turn.turn_id
    await again.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}})
    await eventually(lambda: gw.server.app[SESSIONS][sid].machine.turn is None, "the turn to end")
    assert not (tmp_path / "late.txt").exists()


async def test_a_gateway_restart_closes_with_1012_and_a_load_after_it_misses_nothing(tmp_path):
    """With a state directory the gateway's stop closes /acp with 1012 (the sessions live on);
    after the start, a load after the last messageId seen gets nothing twice and the session
    takes a prompt again (docs/acp-masters.md: access that changes)."""
    config = demo_config(tmp_path, state_dir=tmp_path / "state")
    gw = await start_gateway(config)
    acp = await RawAcp.connect(gw, query="?agent=demo")
    sid = (await acp.call("session/new", {"cwd": str(tmp_path)}))["result"]["sessionId"]
    await a_turn(acp, sid)
    last = [
        m["params"]["_meta"]["rawp"]["messageId"]
        for m in acp.messages
        if m.get("method") == "session/update" and not m["params"]["_meta"]["rawp"].get("state")
    ][-1]
    stopping = asyncio.ensure_future(gw.server.close())  # the server alone, as SIGTERM does
    closed = await acp.closed()
    assert closed.data == 1012
    await stopping
    await gw.close()
    gw = await start_gateway(config)
    try:
        again = await RawAcp.connect(gw, query="?agent=demo")
        loaded = await again.call(
            "session/load",
            {"sessionId": sid, "cwd": str(tmp_path), "_meta": {"rawp": {"lastMessageId": last}}},
        )
        assert loaded["result"]["_meta"]["rawp"]["lostFrames"] == 0
        news = [
            m
            for m in again.messages
            if m.get("method") == "session/update" and not m["params"]["_meta"]["rawp"].get("state")
        ]
        # Only what came after the last update seen: none of it was seen before (the replay is
        # news, not state: a usage the session reported after that update comes now).
        seen = {m.get("params", {}).get("_meta", {}).get("rawp", {}).get("messageId")
                for m in acp.messages}  # fmt: skip
        assert not [m for m in news if m["params"]["_meta"]["rawp"]["messageId"] in seen]
        assert {m["params"]["update"]["sessionUpdate"] for m in news} <= {"usage_update"}
        await a_turn(again, sid)
    finally:
        await gw.close()


async def test_a_bug_in_one_request_is_an_internal_error_answer_and_the_connection_goes_on(
    gw, tmp_path, monkeypatch, caplog
):
    acp = await RawAcp.connect(gw, query="?agent=demo")
    sid = (await acp.call("session/new", {"cwd": str(tmp_path)}))["result"]["sessionId"]

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in listing")

    monkeypatch.setattr("gateway.server.acp.fleet.sessions_answer", broken)
    answer = await acp.call("session/list")
    assert answer["error"]["code"] == -32603
    assert answer["error"]["data"]["error_code"] == "INTERNAL_ERROR"
    assert "a bug in listing" not in answer["error"]["message"]
    assert "a bug in listing" in caplog.text  # the trace is the gateway log's
    await a_turn(acp, sid)
