"""``/acp`` over Streamable HTTP: which event stream each message goes on, as the remote-transport
RFD has it (docs/acp-masters.md#streamable-http): a session's messages on that session's stream
while the client has one open, the rest on the connection's, all in the one order. A raw client
(tests/support/hostile/acp_http_client.py) that notes the stream each message came on, against
the real gateway with the demo agent behind it."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.server.acp_http import ACP_HTTP
from tests.support.gateway_peer import demo_config, start_gateway
from tests.support.hostile.acp_http_client import RawHttpAcp
from tests.support.waiting import eventually


@pytest.fixture
async def gw(tmp_path):
    client = await start_gateway(demo_config(tmp_path, acp_default_agent="demo"))
    yield client
    await client.close()


def about(acp: RawHttpAcp, sid: str) -> list[tuple[str | None, dict[str, Any]]]:
    """(the stream it came on, the message) of every message that names ``sid``."""
    return [
        (on, m)
        for on, m in zip(acp.came_on, acp.messages, strict=True)
        if (m.get("params") or {}).get("sessionId") == sid
    ]


async def a_turn_with_a_permission(acp: RawHttpAcp, sid: str, text: str) -> dict[str, Any]:
    """A prompt whose question is answered allow: its answer."""
    prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
    await acp.send({"jsonrpc": "2.0", "id": "turn", "method": "session/prompt", "params": prompt})
    while (m := await acp.next()).get("method") != "session/request_permission":
        pass
    chosen = {"outcome": {"outcome": "selected", "optionId": "allow"}}
    await acp.send({"jsonrpc": "2.0", "id": m["id"], "result": chosen})
    return await acp.answer_to("turn")


async def test_a_sessions_messages_go_on_its_stream_and_the_rest_on_the_connections(gw, tmp_path):
    acp = await RawHttpAcp.open(gw)
    new = await acp.call("session/new", {"cwd": str(tmp_path)})
    sid = new["result"]["sessionId"]
    assert acp.came_on[acp.messages.index(new)] is None  # no session id before this answer
    seen = len(acp.messages)
    await acp.stream(sid)
    conn = next(iter(gw.app[ACP_HTTP].values()))
    await eventually(lambda: sid in conn.writer.session_streams, "the session's stream")
    done = await a_turn_with_a_permission(acp, sid, "write streams.txt")
    assert done["result"]["stopReason"] == "end_turn"
    assert (tmp_path / "streams.txt").exists()
    # Its updates, the question and the prompt's answer: all on the session's stream, the
    # turn's usage_update before the answer.
    after = list(zip(acp.came_on[seen:], acp.messages[seen:], strict=True))
    assert {on for on, _ in after} == {sid}, after
    kinds = [
        m["params"]["update"]["sessionUpdate"]
        for _, m in after
        if m.get("method") == "session/update"
    ]
    assert any(m.get("method") == "session/request_permission" for _, m in after)
    assert "tool_call" in kinds and kinds[-1] == "usage_update"
    assert after[-1][1] is done
    # What names no session stays on the connection's stream.
    listed = await acp.call("session/list", {})
    assert acp.came_on[acp.messages.index(listed)] is None
    await acp.close()


async def test_a_session_without_a_stream_is_said_on_the_connections(gw, tmp_path):
    """A client that opens no session stream (the RFD's earlier revision, one stream) gets
    everything on the connection's; another session's stream changes nothing for it."""
    acp = await RawHttpAcp.open(gw)
    sid = (await acp.call("session/new", {"cwd": str(tmp_path)}))["result"]["sessionId"]
    other = (await acp.call("session/new", {"cwd": str(tmp_path)}))["result"]["sessionId"]
    await acp.stream(other)
    conn = next(iter(gw.app[ACP_HTTP].values()))
    await eventually(lambda: other in conn.writer.session_streams, "the other session's stream")
    done = await a_turn_with_a_permission(acp, sid, "write one.txt")
    assert done["result"]["stopReason"] == "end_turn"
    assert acp.came_on[acp.messages.index(done)] is None
    assert {on for on, _ in about(acp, sid)} == {None}
    await acp.close()


async def test_a_load_replays_then_answers_on_the_sessions_stream(gw, tmp_path):
    """As the SDK loads: the session's stream first, then session/load; the replay and then the
    load's answer come on that one stream, so no client reads the answer before the replay."""
    first = await RawHttpAcp.open(gw)
    sid = (await first.call("session/new", {"cwd": str(tmp_path)}))["result"]["sessionId"]
    hi = {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}
    assert (await first.call("session/prompt", hi))["result"]["stopReason"] == "end_turn"
    await first.close()
    acp = await RawHttpAcp.open(gw)
    await acp.stream(sid)
    conn = next(c for c in gw.app[ACP_HTTP].values() if c.client.id == acp.conn_id)
    await eventually(lambda: sid in conn.writer.session_streams, "the session's stream")
    loaded = await acp.call("session/load", {"sessionId": sid, "cwd": str(tmp_path)})
    assert "result" in loaded, loaded
    replay = [m for on, m in about(acp, sid) if m.get("method") == "session/update"]
    assert any(m["params"]["update"]["sessionUpdate"] == "agent_message_chunk" for m in replay)
    assert set(acp.came_on) == {sid}  # the replay, and the answer after it
    assert acp.messages[-1] is loaded
    await acp.close()
