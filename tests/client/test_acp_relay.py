"""The stdio relay's decisions (gateway/client/acp_relay.py), messages in and messages out: ids
kept apart, a reconnect that loads the sessions again, no update lost or repeated, requests in
flight at a drop, permission questions asked again, and every bound. The messages are ACP 1's
(an editor's ``initialize``, ``session/new``, ``session/prompt``, ``session/cancel``) and the
gateway's as docs/acp-masters.md's "Wire details" has them (``session/update`` with
``_meta.rawp.messageId``, ``session/request_permission`` with ``_meta.rawp.interactionId``,
``_rawp/turn``, ``session/load`` after ``_meta.rawp.lastMessageId``)."""

from __future__ import annotations

import json
from typing import Any

from gateway.client.acp_messages import (
    CONNECTION_LOST,
    GATEWAY_UNREACHABLE,
    TOO_MANY_REQUESTS,
    Connect,
    Log,
    RelayLimits,
    ToEditor,
    ToGateway,
)
from gateway.client.acp_relay import Relay

SESSION = "6f1c2a0e-3c1d-4b8e-9f43-0a1b2c3d4e5f"
INIT_PARAMS = {
    "protocolVersion": 1,
    "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}},
    "clientInfo": {"name": "zed", "version": "0.220.0"},
}
TURN_EVENTS_PARAMS = {
    **INIT_PARAMS,
    "clientCapabilities": {
        **INIT_PARAMS["clientCapabilities"],
        "_meta": {"rawp": {"turnEvents": True}},
    },
}
MCP = [{"name": "fs", "command": "mcp-fs", "args": [], "env": []}]


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode()


def to_editor(actions: list[Any]) -> list[dict[str, Any]]:
    out = []
    for a in actions:
        if isinstance(a, ToEditor):
            assert a.data.endswith(b"\n") and a.data.count(b"\n") == 1
            out.append(json.loads(a.data))
    return out


def to_gateway(actions: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(a.data) for a in actions if isinstance(a, ToGateway)]


def logs(actions: list[Any]) -> list[str]:
    return [a.text for a in actions if isinstance(a, Log)]


def request(id_: Any, method: str, params: dict[str, Any]) -> bytes:
    return line({"jsonrpc": "2.0", "id": id_, "method": method, "params": params})


def result(id_: Any, value: Any) -> bytes:
    return line({"jsonrpc": "2.0", "id": id_, "result": value})


def update(message_id: str | None, text: str, session: str = SESSION) -> bytes:
    params: dict[str, Any] = {
        "sessionId": session,
        "update": {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": text},
        },
    }
    if message_id is not None:
        params["_meta"] = {"rawp": {"messageId": message_id}}
    return line({"jsonrpc": "2.0", "method": "session/update", "params": params})


def turn(message_id: str, event: str, turn_id: str = "turn-1", stop: str | None = None) -> bytes:
    params: dict[str, Any] = {"sessionId": SESSION, "turnId": turn_id, "event": event}
    if stop is not None:
        params["stopReason"] = stop
    params["_meta"] = {"rawp": {"messageId": message_id}}
    return line({"jsonrpc": "2.0", "method": "_rawp/turn", "params": params})


def loaded(id_: int, last: str | None, turn_id: str | None = None, lost: int = 0) -> bytes:
    rawp = {"lastMessageId": last, "turnId": turn_id, "lostFrames": lost}
    return result(id_, {"_meta": {"rawp": rawp}})


def texts(messages: list[dict[str, Any]]) -> list[str]:
    return [
        m["params"]["update"]["content"]["text"]
        for m in messages
        if m.get("method") == "session/update"
    ]


def question(id_: Any, interaction: str = "int-1", message_id: str = "m-q") -> bytes:
    return request(
        id_,
        "session/request_permission",
        {
            "sessionId": SESSION,
            "toolCall": {"toolCallId": "toolu_01", "title": "Bash: ls", "kind": "execute"},
            "options": [
                {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
            ],
            "_meta": {"rawp": {"messageId": message_id, "interactionId": interaction}},
        },
    )


def allow(id_: Any) -> bytes:
    return result(id_, {"outcome": {"outcome": "selected", "optionId": "allow"}})


def live_session(relay: Relay | None = None) -> Relay:
    """A relay connected, initialized by the editor, with SESSION made by session/new."""
    relay = relay or Relay()
    relay.connected()
    [init] = to_gateway(relay.editor_line(request(0, "initialize", INIT_PARAMS)))
    assert init["params"] == TURN_EVENTS_PARAMS
    relay.gateway_message(result(init["id"], {"protocolVersion": 1, "agentCapabilities": {}}))
    [new] = to_gateway(
        relay.editor_line(request(1, "session/new", {"cwd": "/srv/app", "mcpServers": MCP}))
    )
    [answer] = to_editor(relay.gateway_message(result(new["id"], {"sessionId": SESSION})))
    assert answer["result"]["sessionId"] == SESSION and answer["id"] == 1
    return relay


def reinitialize(relay: Relay, pods: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Reconnect the link at --url and answer the relay's initialize, then its session/list (one
    gateway alone: no pods; ``pods``: where a fleet says the sessions are): what it sends next."""
    [init] = to_gateway(relay.connected())
    assert init["method"] == "initialize" and init["params"] == TURN_EVENTS_PARAMS
    [listing] = to_gateway(relay.gateway_message(result(init["id"], {"protocolVersion": 1})))
    assert listing["method"] == "session/list"
    sessions = [
        {"sessionId": s, "cwd": "/", "_meta": {"rawp": {"pod": p}}} for s, p in (pods or {}).items()
    ] + [{"sessionId": SESSION, "cwd": "/srv/app", "_meta": {"rawp": {}}}] * (not pods)
    return to_gateway(relay.gateway_message(result(listing["id"], {"sessions": sessions})))


def reconnect(
    relay: Relay,
    *,
    replay: list[bytes] = (),
    after: str | None = None,
    running: str | None = None,
) -> list[Any]:
    """Reconnect, answer the relay's initialize and session/load (replaying ``replay``; the load
    must ask for what came after ``after``; ``running``: the turn the load says runs)."""
    loads = reinitialize(relay)
    assert [m["method"] for m in loads] == ["session/load"]
    expected: dict[str, Any] = {"sessionId": SESSION, "cwd": "/srv/app", "mcpServers": MCP}
    if after is not None:
        expected["_meta"] = {"rawp": {"lastMessageId": after}}
    assert loads[0]["params"] == expected
    actions: list[Any] = []
    for message in replay:
        actions += relay.gateway_message(message)
    last = after
    for message in replay:
        last = json.loads(message)["params"]["_meta"]["rawp"]["messageId"]
    actions += relay.gateway_message(loaded(loads[0]["id"], last, running))
    return actions


def test_ids_on_the_socket_are_the_relays_and_answers_come_back_under_the_editors():
    relay = Relay()
    assert relay.connected() == []
    [sent] = to_gateway(relay.editor_line(request("init-a", "initialize", INIT_PARAMS)))
    assert sent["id"] != "init-a" and isinstance(sent["id"], int)
    # The editor's params, asking for the gateway's turn events too.
    assert sent["params"] == TURN_EVENTS_PARAMS
    reply = {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}}
    [back] = to_editor(relay.gateway_message(result(sent["id"], reply)))
    assert back == {"jsonrpc": "2.0", "id": "init-a", "result": reply}


def test_what_the_editor_sends_before_the_socket_opens_waits_in_order():
    relay = Relay()
    assert relay.editor_line(request(0, "initialize", INIT_PARAMS)) == []
    assert relay.editor_line(request(1, "session/list", {})) == []
    sent = to_gateway(relay.connected())
    assert [m["method"] for m in sent] == ["initialize", "session/list"]


def test_a_reconnect_initializes_again_and_loads_every_session_before_anything_else():
    relay = live_session()
    relay.disconnected("closed")
    # The editor prompts while the relay is away: it waits, it is not lost.
    assert (
        relay.editor_line(request(2, "session/prompt", {"sessionId": SESSION, "prompt": []})) == []
    )
    out = reconnect(relay)
    [prompt] = to_gateway(out)
    assert prompt["method"] == "session/prompt" and prompt["params"]["sessionId"] == SESSION
    assert relay.live
    assert any("loaded again" in text for text in logs(out))


def test_a_reload_asks_for_what_came_after_the_last_update_and_passes_on_only_that():
    relay = live_session()
    seen = relay.gateway_message(update("m1", "a")) + relay.gateway_message(update("m2", "b"))
    assert texts(to_editor(seen)) == ["a", "b"]
    relay.disconnected("reset by peer")
    out = reconnect(relay, replay=[update("m3", "c"), update("m4", "d")], after="m2")
    assert texts(to_editor(out)) == ["c", "d"]
    assert texts(to_editor(relay.gateway_message(update("m5", "e")))) == ["e"]


def test_a_replay_longer_than_the_gap_repeats_nothing():
    relay = live_session()
    relay.gateway_message(update("m1", "a"))
    relay.gateway_message(update("m2", "b"))
    relay.disconnected()
    # The gateway no longer knew m2 and replayed all it had.
    replay = [update("m1", "a"), update("m2", "b"), update("m3", "c")]
    out = reconnect(relay, replay=replay, after="m2")
    assert texts(to_editor(out)) == ["c"]
    assert relay.gateway_message(update("m2", "b")) == []


def test_updates_lost_from_the_gateways_buffer_are_said_on_stderr():
    relay = live_session()
    relay.gateway_message(update("m1", "a"))
    relay.disconnected()
    [load] = reinitialize(relay)
    out = relay.gateway_message(loaded(load["id"], "m9", lost=3))
    assert any("3 update(s)" in text for text in logs(out))


def test_the_editors_own_load_gets_its_whole_replay():
    relay = live_session()
    relay.gateway_message(update("m1", "a"))
    [load] = to_gateway(
        relay.editor_line(request(4, "session/load", {"sessionId": SESSION, "cwd": "/srv/app"}))
    )
    out = relay.gateway_message(update("m1", "a")) + relay.gateway_message(update("m2", "b"))
    assert texts(to_editor(out)) == ["a", "b"]
    [answer] = to_editor(relay.gateway_message(loaded(load["id"], "m2")))
    assert answer["id"] == 4
    assert relay.gateway_message(update("m2", "b")) == []


def test_a_prompt_in_flight_at_the_drop_is_answered_from_its_turns_end_never_sent_twice():
    relay = live_session()
    prompt_params = {"sessionId": SESSION, "prompt": [{"type": "text", "text": "hi"}]}
    relay.gateway_message(update("m0", "before"))
    [prompt] = to_gateway(relay.editor_line(request(5, "session/prompt", prompt_params)))
    assert relay.gateway_message(turn("m1", "start")) == []  # the relay keeps turn events
    relay.gateway_message(update("m2", "an"))
    assert to_editor(relay.disconnected("closed")) == []  # not answered yet: the turn goes on
    # The reload replays from before the turn's start (the gateway then knows the turn runs for
    # this connection); what the editor already got is dropped as seen.
    own = json.loads(update("mp", "hi"))  # its own prompt, which it never got as an update
    own["params"]["update"]["sessionUpdate"] = "user_message_chunk"
    replay = [
        line(own),
        turn("m1", "start"),
        update("m2", "an"),
        update("m3", "swer"),
        turn("m4", "end", stop="end_turn"),
    ]
    out = reconnect(relay, replay=replay, after="m0")
    assert [m for m in to_gateway(out) if m.get("method") == "session/prompt"] == []
    editor = to_editor(out)
    assert texts(editor) == ["swer"]  # nothing of the replay but the gap; its prompt not echoed
    answers = [m for m in editor if m.get("id") == 5]
    assert answers == [
        {
            "jsonrpc": "2.0",
            "id": 5,
            "result": {"stopReason": "end_turn", "_meta": {"rawp": {"turnId": "turn-1"}}},
        }
    ]
    # The old relay id means nothing any more.
    assert to_editor(relay.gateway_message(result(prompt["id"], {"stopReason": "end_turn"}))) == []


def test_a_prompt_whose_turn_still_runs_after_the_reload_is_answered_when_it_ends():
    relay = live_session()
    relay.editor_line(request(5, "session/prompt", {"sessionId": SESSION, "prompt": []}))
    relay.disconnected()
    # Its start came while the socket was down: in the replay.
    out = reconnect(relay, replay=[turn("m1", "start")], running="turn-1")
    assert [m for m in to_editor(out) if m.get("id") == 5] == []
    [answer] = to_editor(relay.gateway_message(turn("m2", "end", stop="error")))
    assert answer["id"] == 5 and answer["error"]["data"]["error_code"] == "TURN_FAILED"


def test_a_prompt_the_gateway_never_took_is_refused_after_the_reload_so_it_can_be_sent_again():
    relay = live_session()
    relay.editor_line(request(5, "session/prompt", {"sessionId": SESSION, "prompt": []}))
    relay.disconnected()
    [error] = [m for m in to_editor(reconnect(relay)) if m.get("id") == 5]
    assert error["error"]["data"]["error_code"] == CONNECTION_LOST
    assert "send it again" in error["error"]["message"]


def test_a_prompt_whose_turn_start_came_before_the_drop_waits_for_its_end():
    relay = live_session()
    relay.editor_line(request(5, "session/prompt", {"sessionId": SESSION, "prompt": []}))
    relay.gateway_message(turn("m1", "start"))
    relay.disconnected()
    # The replay has no end (and the buffer lost nothing): the turn still runs, even if the load
    # names no running turn.
    out = reconnect(relay, replay=[turn("m1", "start")])
    assert [m for m in to_editor(out) if m.get("id") == 5] == []
    [answer] = to_editor(relay.gateway_message(turn("m2", "end", stop="end_turn")))
    assert answer["id"] == 5 and answer["result"]["stopReason"] == "end_turn"


def test_a_prompt_whose_turn_ended_unseen_is_answered_with_an_error():
    relay = live_session()
    relay.editor_line(request(5, "session/prompt", {"sessionId": SESSION, "prompt": []}))
    relay.gateway_message(turn("m1", "start"))
    relay.disconnected()
    # The buffer no longer had everything after m1: its end may be among what was lost.
    [init] = to_gateway(relay.connected())
    [listing] = to_gateway(relay.gateway_message(result(init["id"], {})))
    [load] = to_gateway(relay.gateway_message(result(listing["id"], {"sessions": []})))
    out = relay.gateway_message(loaded(load["id"], "m9", lost=4))
    [error] = [m for m in to_editor(out) if m.get("id") == 5]
    assert error["error"]["data"]["error_code"] == CONNECTION_LOST
    assert "ended while" in error["error"]["message"]


def test_a_session_new_in_flight_is_refused_not_repeated():
    relay = live_session()
    relay.editor_line(request(6, "session/new", {"cwd": "/srv/b", "mcpServers": []}))
    [error] = to_editor(relay.disconnected())
    assert error["id"] == 6 and error["error"]["data"]["error_code"] == CONNECTION_LOST
    assert relay.sessions == [SESSION]


def test_retry_safe_requests_in_flight_are_sent_again_after_the_reload():
    relay = live_session()
    relay.editor_line(request(7, "session/list", {}))
    relay.editor_line(request(8, "session/set_mode", {"sessionId": SESSION, "modeId": "plan"}))
    assert to_editor(relay.disconnected()) == []
    out = reconnect(relay)
    again = to_gateway(out)
    assert [m["method"] for m in again] == ["session/list", "session/set_mode"]
    [answer] = to_editor(relay.gateway_message(result(again[0]["id"], {"sessions": []})))
    assert answer["id"] == 7


def test_an_editor_load_in_flight_is_sent_again_and_repeats_nothing_it_already_got():
    relay = live_session()
    other = "0d9e6b1a-1111-4222-8333-444455556666"
    params = {"sessionId": other, "cwd": "/w", "mcpServers": []}
    relay.editor_line(request(9, "session/load", params))
    relay.gateway_message(update("o1", "old", session=other))  # part of the first replay
    relay.disconnected()
    out = reconnect(relay)
    [load] = to_gateway(out)
    assert load["method"] == "session/load" and load["params"] == params
    replay = relay.gateway_message(update("o1", "old", session=other))
    replay += relay.gateway_message(update("o2", "new", session=other))
    assert texts(to_editor(replay)) == ["new"]
    [answer] = to_editor(relay.gateway_message(result(load["id"], {})))
    assert answer["id"] == 9
    assert relay.sessions == [SESSION, other]


def test_a_cancel_sent_while_away_reaches_the_gateway_after_the_reload():
    relay = live_session()
    relay.editor_line(request(5, "session/prompt", {"sessionId": SESSION, "prompt": []}))
    relay.gateway_message(turn("m1", "start"))
    relay.disconnected()
    cancel = {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": SESSION}}
    assert relay.editor_line(line(cancel)) == []
    out = reconnect(relay, replay=[turn("m1", "start")], running="turn-1")
    assert to_gateway(out) == [cancel]
    [answer] = to_editor(relay.gateway_message(turn("m2", "end", stop="cancelled")))
    assert answer["result"]["stopReason"] == "cancelled"


def test_a_permission_question_reaches_the_editor_under_the_relays_id_and_back():
    relay = live_session()
    [asked] = to_editor(relay.gateway_message(question("g-7")))
    assert asked["method"] == "session/request_permission" and asked["id"] != "g-7"
    [answer] = to_gateway(relay.editor_line(allow(asked["id"])))
    assert answer["id"] == "g-7" and answer["result"]["outcome"]["optionId"] == "allow"


def test_a_question_asked_again_after_a_reload_is_not_shown_twice():
    relay = live_session()
    [asked] = to_editor(relay.gateway_message(question(3)))
    relay.disconnected()
    relay.connected()
    # The gateway asks again on the new connection (ids restart): the editor is not asked again.
    assert relay.gateway_message(question(0)) == []
    [answer] = to_gateway(relay.editor_line(allow(asked["id"])))
    assert answer["id"] == 0


def test_an_answer_given_while_away_goes_to_the_question_asked_again():
    relay = live_session()
    [asked] = to_editor(relay.gateway_message(question(3)))
    relay.disconnected()
    assert relay.editor_line(allow(asked["id"])) == []
    [load] = reinitialize(relay)
    [answer] = to_gateway(relay.gateway_message(question(12)))
    assert answer["id"] == 12 and answer["result"]["outcome"]["optionId"] == "allow"
    relay.gateway_message(result(load["id"], {}))
    # Settled: a later answer to the same editor id is dropped.
    assert to_gateway(relay.editor_line(allow(asked["id"]))) == []


def test_a_session_that_cannot_be_loaded_again_is_forgotten_with_a_line_on_stderr():
    relay = live_session()
    relay.disconnected()
    [load] = reinitialize(relay)
    gone = {
        "jsonrpc": "2.0",
        "id": load["id"],
        "error": {
            "code": -32002,
            "message": "no such session",
            "data": {"error_code": "SESSION_NOT_FOUND"},
        },
    }
    out = relay.gateway_message(line(gone))
    assert any(SESSION in text and "SESSION_NOT_FOUND" in text for text in logs(out))
    assert relay.sessions == [] and relay.live


def test_queued_requests_are_refused_once_the_gateway_stays_unreachable():
    relay = Relay(RelayLimits(fail_queue_after=3))
    relay.editor_line(request(0, "initialize", INIT_PARAMS))
    cancel = {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": SESSION}}
    relay.editor_line(line(cancel))
    assert to_editor(relay.connect_failed("connection refused", 0.5)) == []
    assert to_editor(relay.connect_failed("connection refused", 1)) == []
    out = relay.connect_failed("connection refused", 2)
    [error] = to_editor(out)
    assert error["id"] == 0 and error["error"]["data"]["error_code"] == GATEWAY_UNREACHABLE
    assert any("connection refused" in text and "retrying in 2 s" in text for text in logs(out))
    assert any("session/cancel dropped" in text for text in logs(out))


def test_requests_in_flight_are_bounded():
    relay = Relay(RelayLimits(max_pending=2))
    relay.connected()
    assert len(to_gateway(relay.editor_line(request(1, "session/list", {})))) == 1
    assert len(to_gateway(relay.editor_line(request(2, "session/list", {})))) == 1
    [error] = to_editor(relay.editor_line(request(3, "session/list", {})))
    assert error["id"] == 3 and error["error"]["data"]["error_code"] == TOO_MANY_REQUESTS


def test_the_queue_is_bounded_in_messages_and_bytes():
    relay = Relay(RelayLimits(max_queued=1))
    assert relay.editor_line(request(1, "session/list", {})) == []
    [error] = to_editor(relay.editor_line(request(2, "session/list", {})))
    assert error["error"]["data"]["error_code"] == TOO_MANY_REQUESTS
    relay = Relay(RelayLimits(max_queued_bytes=100))
    [error] = to_editor(relay.editor_line(request(1, "session/list", {"x": "y" * 200})))
    assert error["id"] == 1


def test_sessions_are_bounded_before_anything_is_created():
    relay = live_session(Relay(RelayLimits(max_sessions=1)))
    out = relay.editor_line(request(2, "session/new", {"cwd": "/w", "mcpServers": []}))
    assert to_gateway(out) == []
    [error] = to_editor(out)
    assert error["error"]["data"]["error_code"] == "TOO_MANY_SESSIONS"


def test_malformed_editor_input_gets_a_json_rpc_error_and_the_relay_goes_on():
    relay = live_session()
    [parse] = to_editor(relay.editor_line(b'{"jsonrpc": "2.0", "id": 1, "method": '))
    assert parse["id"] is None and parse["error"]["code"] == -32700
    [deep] = to_editor(relay.editor_line(b"[" * 10_000 + b"]" * 10_000))
    assert deep["error"]["code"] == -32700
    [not_object] = to_editor(relay.editor_line(b"[1, 2]"))
    assert not_object["error"]["code"] == -32600
    [bad_id] = to_editor(relay.editor_line(line({"jsonrpc": "2.0", "id": {"x": 1}, "method": "m"})))
    assert bad_id["id"] is None and bad_id["error"]["code"] == -32600
    [too_long] = to_editor(
        Relay(RelayLimits(max_line_bytes=10)).editor_line(b'{"a": "bbbbbbbbbb"}')
    )
    assert too_long["error"]["data"]["error_code"] == "LINE_TOO_LONG"
    assert relay.editor_line(b"   ") == []
    # Still relaying.
    assert len(to_gateway(relay.editor_line(request(2, "session/list", {})))) == 1


def test_what_the_gateway_sends_that_the_relay_cannot_place_is_dropped_with_a_line():
    relay = live_session()
    assert logs(relay.gateway_message(b"not json")) and to_editor(relay.gateway_message(b"{")) == []
    assert logs(relay.gateway_message(result(999, {})))
    assert logs(relay.editor_line(allow(999)))


def test_an_update_without_a_sequence_is_passed_on_as_it_came():
    relay = live_session()
    raw = update(None, "plain")
    [out] = relay.gateway_message(raw)
    assert out == ToEditor(raw + b"\n")


def test_a_closed_session_is_not_loaded_again():
    relay = live_session()
    relay.editor_line(request(3, "session/close", {"sessionId": SESSION}))
    assert relay.sessions == []


def test_a_live_turn_start_is_the_prompts_only_when_it_names_that_prompt():
    relay = live_session()
    [sent] = to_gateway(
        relay.editor_line(request(5, "session/prompt", {"sessionId": SESSION, "prompt": []}))
    )
    other = json.loads(turn("m1", "start", turn_id="someone-elses"))
    other["params"]["requestId"] = sent["id"] + 100
    relay.gateway_message(line(other))
    mine = json.loads(turn("m2", "start", turn_id="mine"))
    mine["params"]["requestId"] = sent["id"]
    relay.gateway_message(line(mine))
    relay.disconnected()
    # The turn the load says runs is the prompt's own: its end answers the prompt.
    reconnect(relay, replay=[turn("m2", "start", turn_id="mine")], after="m1", running="mine")
    [answer] = to_editor(relay.gateway_message(turn("m3", "end", turn_id="mine", stop="end_turn")))
    assert answer["id"] == 5 and answer["result"]["stopReason"] == "end_turn"


def connects(actions: list[Any]) -> list[str]:
    return [a.link for a in actions if isinstance(a, Connect)]


def on(actions: list[Any], link: str) -> list[dict[str, Any]]:
    return [json.loads(a.data) for a in actions if isinstance(a, ToGateway) and a.link == link]


def test_after_a_reconnect_through_a_router_each_session_is_loaded_on_its_own_pod():
    relay = live_session()
    relay.gateway_message(update("m1", "a"))
    relay.disconnected("closed")
    # The router put the new socket on some gateway: the relay asks the fleet where SESSION is.
    [init] = to_gateway(relay.connected())
    [listing] = to_gateway(relay.gateway_message(result(init["id"], {})))
    where = {"sessions": [{"sessionId": SESSION, "cwd": "/", "_meta": {"rawp": {"pod": "gw-1"}}}]}
    out = relay.gateway_message(result(listing["id"], where))
    assert connects(out) == ["gw-1"] and on(out, "") == []
    assert any("sessions loaded again" in t for t in logs(out))
    # The pod's own socket: initialize, then the load after the last update passed on.
    [init] = on(relay.connected(link="gw-1"), "gw-1")
    [load] = on(relay.gateway_message(result(init["id"], {}), link="gw-1"), "gw-1")
    assert load["method"] == "session/load" and load["params"]["sessionId"] == SESSION
    assert load["params"]["_meta"] == {"rawp": {"lastMessageId": "m1"}}
    out = relay.gateway_message(update("m2", "b"), link="gw-1")
    out += relay.gateway_message(loaded(load["id"], "m2"), link="gw-1")
    assert texts(to_editor(out)) == ["b"] and relay.live
    # What the editor says about SESSION goes there from now on.
    sent = relay.editor_line(request(9, "session/prompt", {"sessionId": SESSION, "prompt": []}))
    assert [m["method"] for m in on(sent, "gw-1")] == ["session/prompt"]


def test_a_session_the_fleet_lists_on_another_pod_is_loaded_on_that_pods_socket():
    relay = live_session()
    other = "0d9e6b1a-1111-4222-8333-444455556666"
    [listing] = to_gateway(relay.editor_line(request(3, "session/list", {})))
    where = {"sessions": [{"sessionId": other, "cwd": "/w", "_meta": {"rawp": {"pod": "gw-2"}}}]}
    [answer] = to_editor(relay.gateway_message(result(listing["id"], where)))
    assert answer["id"] == 3 and answer["result"] == where  # passed on as it came
    out = relay.editor_line(request(4, "session/load", {"sessionId": other, "cwd": "/w"}))
    assert connects(out) == ["gw-2"] and to_gateway(out) == []  # waits for that socket
    [init] = on(relay.connected(link="gw-2"), "gw-2")
    [load] = on(relay.gateway_message(result(init["id"], {}), link="gw-2"), "gw-2")
    assert load["params"]["sessionId"] == other
    [answer] = to_editor(relay.gateway_message(loaded(load["id"], None), link="gw-2"))
    assert answer["id"] == 4
    assert relay.sessions == [SESSION, other]
    # A drop of one pod's socket leaves the other sessions alone.
    assert relay.disconnected("closed", link="gw-2")
    sent = relay.editor_line(request(5, "session/prompt", {"sessionId": SESSION, "prompt": []}))
    assert [m["method"] for m in on(sent, "")] == ["session/prompt"]


def on_other_pod(id_: int, pod: str) -> bytes:
    error = {
        "code": -32002,
        "message": "the session is on another gateway",
        "data": {"error_code": "SESSION_ON_OTHER_POD", "pod": pod, "acpPath": f"/pods/{pod}/acp"},
    }
    return line({"jsonrpc": "2.0", "id": id_, "error": error})


def test_a_load_refused_as_on_another_pod_is_made_there_without_the_editor_seeing_the_refusal():
    relay = live_session()
    other = "0d9e6b1a-1111-4222-8333-444455556666"
    [load] = to_gateway(relay.editor_line(request(4, "session/load", {"sessionId": other})))
    out = relay.gateway_message(on_other_pod(load["id"], "gw-2"))
    assert connects(out) == ["gw-2"] and to_editor(out) == []
    [init] = on(relay.connected(link="gw-2"), "gw-2")
    [again] = on(relay.gateway_message(result(init["id"], {}), link="gw-2"), "gw-2")
    assert again["method"] == "session/load" and again["params"]["sessionId"] == other
    [answer] = to_editor(relay.gateway_message(loaded(again["id"], None), link="gw-2"))
    assert answer["id"] == 4 and "result" in answer
    # A refusal naming a path instead of a pod name is passed on as it came.
    [load] = to_gateway(relay.editor_line(request(5, "session/load", {"sessionId": "x"})))
    [refused] = to_editor(relay.gateway_message(on_other_pod(load["id"], "../evil")))
    assert refused["error"]["data"]["error_code"] == "SESSION_ON_OTHER_POD"


def test_a_reload_refused_as_on_another_pod_moves_the_session_there():
    relay = live_session()
    relay.disconnected()
    [load] = reinitialize(relay)
    out = relay.gateway_message(on_other_pod(load["id"], "gw-1"))
    assert connects(out) == ["gw-1"] and relay.sessions == [SESSION]
    [init] = on(relay.connected(link="gw-1"), "gw-1")
    [again] = on(relay.gateway_message(result(init["id"], {}), link="gw-1"), "gw-1")
    assert again["params"]["sessionId"] == SESSION


def test_a_question_whose_turn_ended_while_away_is_forgotten():
    relay = live_session()
    relay.gateway_message(update("m1", "a"))
    [asked] = to_editor(relay.gateway_message(question(3)))
    relay.disconnected()
    # Another master answered it, the turn ended: the replay says so, nothing asks it again.
    reconnect(relay, replay=[turn("m2", "end", stop="end_turn")], after="m1")
    assert any("unknown request" in t for t in logs(relay.editor_line(allow(asked["id"]))))


def test_a_gateway_that_stopped_keeping_nothing_ended_its_sessions_and_the_relay_says_so():
    """Closed with 1001 (no state dir): the session is not loaded again; a prompt in flight and a
    later one are answered SESSION_TERMINATED saying it ended with the gateway, not "send it
    again" or "load it"; a new session goes to the gateway as ever."""
    relay = live_session()
    [sent] = to_gateway(relay.editor_line(request(5, "session/prompt", {"sessionId": SESSION})))
    out = relay.disconnected("closed by the gateway (code 1001)", code=1001)
    [answer] = to_editor(out)
    assert answer["id"] == 5 and answer["error"]["data"]["error_code"] == "SESSION_TERMINATED"
    assert "ended with the gateway" in answer["error"]["message"]
    assert any("the gateway stopped" in text and "1 session(s) ended" in text for text in logs(out))
    [init] = to_gateway(relay.connected())  # initialized again, nothing to load
    assert init["method"] == "initialize"
    assert to_gateway(relay.gateway_message(result(init["id"], {"protocolVersion": 1}))) == []
    [refused] = to_editor(relay.editor_line(request(6, "session/prompt", {"sessionId": SESSION})))
    assert refused["error"]["data"]["error_code"] == "SESSION_TERMINATED"
    assert "start a new session" in refused["error"]["message"]
    [new] = to_gateway(relay.editor_line(request(7, "session/new", {"cwd": "/srv/app"})))
    assert new["method"] == "session/new"
    assert sent["method"] == "session/prompt"
