"""The routing of an ``/acp`` connection's relayed sessions (gateway/protocol/acp_peers.py):
messages in, decisions out. Ids are never changed, so they are only looked at here."""

from __future__ import annotations

import json

from gateway.protocol.acp_peers import (
    PEER_INIT_ID,
    FromPeer,
    PeerRoutes,
    initialize_request,
    initialized,
    session_of,
)

S = "4f1c7b9e-8a3d-4c2e-9f10-1b2c3d4e5f60"


def params(session_id: str = S) -> bytes:
    return json.dumps({"sessionId": session_id, "prompt": []}).encode()


def routed() -> PeerRoutes:
    routes = PeerRoutes(max_pending=3, max_asked=2)
    routes.add(S, 7)
    return routes


def test_a_relayed_sessions_requests_and_notifications_go_to_it_others_stay_here():
    routes = routed()
    assert routes.client_message(8, "session/prompt", params()) == S
    assert routes.client_message(None, "session/cancel", params()) == S
    assert routes.client_message(9, "session/prompt", params("another")) is None
    assert routes.client_message(10, "session/list", b"{}") is None
    assert routes.client_message(11, "session/list", b"") is None
    assert routes.client_message(12, "session/prompt", b'{"sessionId": 5}') is None
    assert S in routes and len(routes) == 1


def test_answers_go_to_the_gateway_that_asked_and_only_once():
    routes = routed()
    ask = {"jsonrpc": "2.0", "id": "rawp-ask-1", "method": "session/request_permission"}
    assert routes.peer_message(S, json.dumps(ask)) is FromPeer.PASS
    assert routes.client_message("rawp-ask-1", None, b"") == S
    assert routes.client_message("rawp-ask-1", None, b"") is None  # answered: a local one now
    # At most max_asked questions are remembered: the oldest is forgotten.
    for n in range(3):
        routes.peer_message(S, json.dumps({**ask, "id": f"q{n}"}))
    assert routes.client_message("q0", None, b"") is None
    assert routes.client_message("q2", None, b"") == S


def test_the_owners_answer_to_the_relays_own_initialize_is_not_the_clients():
    init = json.loads(initialize_request(b'{"protocolVersion":1,"clientCapabilities":{}}'))
    assert init["id"] == PEER_INIT_ID and init["params"]["protocolVersion"] == 1
    answer = json.dumps({"jsonrpc": "2.0", "id": PEER_INIT_ID, "result": {}})
    assert initialized(answer)
    assert not initialized(json.dumps({"jsonrpc": "2.0", "id": PEER_INIT_ID, "error": {}}))
    assert not initialized("not json")
    assert routed().peer_message(S, answer) is FromPeer.OWN
    # Without the client's params, the protocol version alone.
    assert json.loads(initialize_request(b""))["params"] == {"protocolVersion": 1}


def test_a_failed_opening_load_ends_the_relay_and_answers_what_waits():
    routes = routed()
    assert routes.client_message(8, "session/prompt", params()) == S  # pipelined after the load
    error = {"jsonrpc": "2.0", "id": 7, "error": {"code": -32000, "message": "no"}}
    assert routes.peer_message(S, json.dumps(error)) is FromPeer.END
    [answer] = routes.drop(S)
    assert json.loads(answer)["id"] == 8
    assert json.loads(answer)["error"]["data"]["error_code"] == "SESSION_NOT_FOUND"
    assert S not in routes and routes.drop(S) == []


def test_a_successful_load_keeps_it_and_a_later_failed_load_does_not_end_it():
    routes = routed()
    assert routes.peer_message(S, '{"jsonrpc":"2.0","id":7,"result":{}}') is FromPeer.PASS
    assert routes.client_message(8, "session/load", params()) == S
    error = '{"jsonrpc":"2.0","id":8,"error":{"code":-32000,"message":"x"}}'
    assert routes.peer_message(S, error) is FromPeer.PASS
    assert S in routes


def test_requests_waiting_for_other_gateways_are_bounded():
    routes = routed()  # the opening load waits: 1 of 3
    assert routes.client_message(8, "session/prompt", params()) == S
    assert routes.client_message(9, "session/set_mode", params()) == S
    refused = routes.client_message(10, "session/prompt", params())
    assert isinstance(refused, bytes)
    assert json.loads(refused)["error"]["data"]["error_code"] == "TOO_MANY_REQUESTS"
    # A notification never waits, so it is never refused; an answer frees a place.
    assert routes.client_message(None, "session/cancel", params()) == S
    routes.peer_message(S, '{"jsonrpc":"2.0","id":8,"result":{"stopReason":"end_turn"}}')
    assert routes.client_message(10, "session/prompt", params()) == S


def test_updates_and_odd_messages_from_the_owner_pass_as_they_are():
    routes = routed()
    update = {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": S}}
    assert routes.peer_message(S, json.dumps(update)) is FromPeer.PASS
    assert routes.peer_message(S, "not json") is FromPeer.PASS
    assert routes.peer_message(S, '{"id": true, "result": 1}') is FromPeer.PASS
    assert routes.peer_message("unknown", '{"id": 7, "result": 1}') is FromPeer.PASS
    assert session_of(b"[1]") is None and session_of(b"") is None
