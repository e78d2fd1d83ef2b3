"""Hostile clients of ``/acp`` over Streamable HTTP (beside test_acp_hostile.py's WebSocket ones):
each test plays one attack against a real gateway on 127.0.0.1 (real server, demo agent process, a
raw HTTP client: tests/support/hostile/acp_http_client.py) and checks that the attacker gets a
clear HTTP or JSON-RPC error, that nothing is created for a request that is refused, and that what
a connection holds is bounded (docs/acp-masters.md#streamable-http)."""

from __future__ import annotations

import json
import uuid

import aiohttp
import pytest

from gateway.server import SESSIONS
from gateway.server.acp import ACP_OPEN
from gateway.server.acp_http import ACP_HTTP
from tests.support.auth import bearer
from tests.support.gateway_peer import Master, demo_config, prompt_and_wait, start_gateway
from tests.support.hostile.acp_http_client import INITIALIZE, RawHttpAcp
from tests.support.waiting import eventually

FRAME = 64 * 1024


@pytest.fixture
async def gw(tmp_path):
    client = await start_gateway(demo_config(tmp_path, max_frame_size=FRAME))
    yield client
    await client.close()


async def error_of(resp: aiohttp.ClientResponse) -> str:
    return str((await resp.json())["error_code"])


async def test_initialize_names_the_connection_and_later_posts_are_answered_on_the_stream(
    gw, tmp_path
):
    acp = await RawHttpAcp.open(gw, path="/acp?agent=demo")
    assert len(acp.conn_id) == 36
    new = {"jsonrpc": "2.0", "id": "n", "method": "session/new", "params": {"cwd": str(tmp_path)}}
    assert await acp.post(new) == 202
    # session/new is answered before anything is said about the session it names.
    first = await acp.next()
    assert first["id"] == "n" and "sessionId" in first["result"], first
    sid = first["result"]["sessionId"]
    done = await acp.call(
        "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}
    )
    assert done["result"]["stopReason"] == "end_turn"
    await acp.close()


async def test_a_post_before_initialize_is_refused_and_creates_nothing(gw, tmp_path):
    new = {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": str(tmp_path)}}
    resp = await gw.post("/acp?agent=demo", json=new)
    assert resp.status == 400
    assert "initialize" in (await resp.json())["message"]
    # An initialize that is a notification, or not JSON-RPC, opens nothing either.
    notify = {k: v for k, v in INITIALIZE.items() if k != "id"}
    assert (await gw.post("/acp", json=notify)).status == 400
    resp = await gw.post("/acp", data="{not json", headers={"Content-Type": "application/json"})
    assert resp.status == 400
    resp = await gw.post("/acp", data=json.dumps(INITIALIZE))  # no application/json
    assert resp.status == 415
    assert not gw.app[SESSIONS] and not gw.app[ACP_HTTP] and not gw.app[ACP_OPEN]


async def test_an_unknown_connection_id_is_404_on_every_method(gw):
    made_up = {"Acp-Connection-Id": str(uuid.uuid4())}
    message = {"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}}
    resp = await gw.post("/acp", json=message, headers=made_up)
    assert resp.status == 404 and await error_of(resp) == "CONNECTION_NOT_FOUND"
    resp = await gw.get("/acp", headers={**made_up, "Accept": "text/event-stream"})
    assert resp.status == 404
    assert (await gw.delete("/acp", headers=made_up)).status == 404
    # Without the header at all: told what to do first.
    resp = await gw.get("/acp", headers={"Accept": "text/event-stream"})
    assert resp.status == 400 and "initialize" in (await resp.json())["message"]
    # A closed connection's id is unknown from then on.
    acp = await RawHttpAcp.open(gw)
    assert (await gw.delete("/acp", headers=acp.headers)).status == 202
    await acp.ended()
    assert await acp.post(message) == 404
    assert not gw.app[ACP_HTTP] and not gw.app[ACP_OPEN]


async def test_an_oversize_post_is_413_and_the_connection_goes_on(gw, tmp_path):
    big = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session/list",
                      "params": {"cwd": "x" * FRAME}})  # fmt: skip
    resp = await gw.post("/acp", data=big.replace("session/list", "initialize"),
                         headers={"Content-Type": "application/json"})  # fmt: skip
    assert resp.status == 413 and await error_of(resp) == "MESSAGE_TOO_LARGE"
    assert not gw.app[ACP_HTTP]
    acp = await RawHttpAcp.open(gw)
    assert await acp.post(big) == 413

    async def chunked():  # no Content-Length: the limit holds as the body comes
        for _ in range(8):
            yield b"x" * (FRAME // 4)

    assert await acp.post(chunked()) == 413
    assert "result" in await acp.call("session/list")
    await acp.close()


async def test_malformed_messages_are_json_rpc_errors_on_the_stream(gw):
    acp = await RawHttpAcp.open(gw)
    for data, code in [
        ("{not json", -32700),
        ("[" * 60_000, -32700),
        ('[{"jsonrpc":"2.0","id":1,"method":"initialize"}]', -32600),
        ('{"jsonrpc":"2.0","id":1,"method":"fs/delete_everything"}', -32601),
    ]:
        assert await acp.post(data) == 202
        error = await acp.next()
        assert error["error"]["code"] == code, error
    # A second initialize on a connection is an ordinary message: answered, not a new connection.
    assert len(gw.app[ACP_HTTP]) == 1
    await acp.close()


async def test_streams_are_event_streams_one_receiver_each(gw):
    acp = await RawHttpAcp.open(gw)
    resp = await gw.get("/acp", headers=acp.headers)
    assert resp.status == 406
    resp = await gw.get("/acp", headers={**acp.headers, "Accept": "text/event-stream"})
    assert resp.status == 409 and await error_of(resp) == "STREAM_OPEN"
    session = {**acp.headers, "Accept": "text/event-stream", "Acp-Session-Id": "x" * 300}
    assert (await gw.get("/acp", headers=session)).status == 400
    await acp.close()


async def test_many_connection_ids_are_bounded_and_idle_ones_expire(gw, monkeypatch):
    monkeypatch.setattr("gateway.server.acp_http.MAX_ACP_CONNECTIONS", 4)
    monkeypatch.setattr("gateway.server.acp_http.IDLE_SEC", 0.2)
    for _ in range(4):
        await RawHttpAcp.open(gw, stream=False)
    resp = await gw.post("/acp", json=INITIALIZE)
    assert resp.status == 503 and await error_of(resp) == "TOO_MANY_CONNECTIONS"
    # None of them opened its event stream: each is closed and forgotten.
    await eventually(lambda: not gw.app[ACP_HTTP] and not gw.app[ACP_OPEN], "idle ones closed")
    acp = await RawHttpAcp.open(gw)
    assert "result" in await acp.call("session/list")
    await acp.close()


async def test_a_client_that_reads_nothing_is_cut_off_and_its_session_goes_on(tmp_path):
    gw = await start_gateway(demo_config(tmp_path, send_queue_bytes=65536))
    try:
        resp = await gw.post("/v1/session", json={"agent": "demo"})
        sid = (await resp.json())["session_id"]
        master = await Master.attach(gw, sid)
        await prompt_and_wait(master, "y" * 30_000, timeout=30)
        acp = await RawHttpAcp.open(gw, stream=False)
        load = {"jsonrpc": "2.0", "id": 1, "method": "session/load",
                "params": {"sessionId": sid, "cwd": str(tmp_path)}}  # fmt: skip
        assert await acp.post(load) == 202  # its history waits for a stream that never comes
        # What the session says next piles up unread past send_queue_bytes: the connection is
        # closed, not grown, and says so to its next request.
        for _ in range(3):  # each turn says over 40 KB, well past 64 KB in all
            await prompt_and_wait(master, "z" * 40_000, timeout=30)
        assert await acp.post({**load, "id": 2}) == 404
        assert not gw.app[ACP_HTTP] and not gw.app[ACP_OPEN]
        frames = await prompt_and_wait(master, "still there?", timeout=30)
        assert frames[-1]["type"] == "session.usage"
    finally:
        await gw.close()


async def test_credentials_bearer_or_the_ticket_that_opened_the_connection(tmp_path):
    gw = await start_gateway(demo_config(tmp_path, token="s3cret"))
    try:
        resp = await gw.post("/acp", json=INITIALIZE)
        assert resp.status == 401
        assert not gw.app[ACP_HTTP]
        resp = await gw.post("/v1/acp/ws-ticket", headers=bearer("s3cret"))
        ticket = (await resp.json())["ticket"]
        path = f"/acp?ticket={ticket}"
        # The SDK sends the URL it was given with every request: the spent ticket still opens
        # the connection it opened, and nothing else.
        acp = await RawHttpAcp.open(gw, path=path)
        assert "result" in await acp.call("session/list")
        resp = await gw.post(path, json=INITIALIZE)
        assert resp.status == 401
        other = {"Acp-Connection-Id": str(uuid.uuid4()), "Content-Type": "application/json"}
        resp = await gw.post(path, data=json.dumps(INITIALIZE), headers=other)
        assert resp.status == 401
        by_bearer = await RawHttpAcp.open(gw, headers=bearer("s3cret"))
        assert "result" in await by_bearer.call("session/list")
        await acp.close()
        await by_bearer.close()
    finally:
        await gw.close()


def update_ids(messages: list[dict]) -> list[str]:
    return [
        m["params"]["_meta"]["rawp"]["messageId"]
        for m in messages
        if m.get("method") == "session/update"
    ]


async def test_a_new_connection_loads_after_the_last_message_id_and_misses_nothing(gw, tmp_path):
    """What a client does after its stream broke (the SDK does not reopen it): initialize again
    and load after the last messageId it saw: exactly the updates after it come, as on the
    WebSocket (test_acp_hostile.py)."""
    acp = await RawHttpAcp.open(gw, path="/acp?agent=demo")
    sid = (await acp.call("session/new", {"cwd": str(tmp_path)}))["result"]["sessionId"]
    hi = {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}
    for _ in range(2):
        assert (await acp.call("session/prompt", hi))["result"]["stopReason"] == "end_turn"
    seen = update_ids(acp.messages)
    assert len(seen) == len(set(seen)) > 6
    mark = seen[len(seen) // 2]
    await acp.close()  # the stream breaks; the connection expires on its own
    again = await RawHttpAcp.open(gw)
    loaded = await again.call(
        "session/load",
        {"sessionId": sid, "cwd": str(tmp_path), "_meta": {"rawp": {"lastMessageId": mark}}},
    )
    after = seen[len(seen) // 2 + 1 :]
    assert [m for m in update_ids(again.messages) if m in set(after)] == after
    assert not set(update_ids(again.messages)) & set(seen[: len(seen) // 2 + 1]) - {
        m["params"]["_meta"]["rawp"]["messageId"]
        for m in again.messages
        if m.get("method") == "session/update" and m["params"]["_meta"]["rawp"].get("state")
    }
    assert loaded["result"]["_meta"]["rawp"]["lostFrames"] == 0
    await again.close()


async def test_a_stopping_gateway_ends_every_event_stream(tmp_path):
    gw = await start_gateway(demo_config(tmp_path))
    try:
        acp = await RawHttpAcp.open(gw)
        session = {**acp.headers, "Accept": "text/event-stream", "Acp-Session-Id": "s"}
        session_stream = await gw.get("/acp", headers=session)
        assert session_stream.status == 200
        await gw.app.shutdown()
        await acp.ended()  # the connection's stream ends, not left open until a timeout
        assert await session_stream.content.read() == b""  # and the session's
        assert not gw.app[ACP_HTTP] and not gw.app[ACP_OPEN]
    finally:
        await gw.close()
