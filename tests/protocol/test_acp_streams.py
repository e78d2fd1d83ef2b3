"""Which stream of a Streamable HTTP ``/acp`` connection each message goes on
(gateway/protocol/acp_streams.py): the session a message names, or the one of the request an
answer answers; nothing named or nothing readable: the connection's."""

from __future__ import annotations

import json
from typing import Any

from gateway.protocol.acp_streams import MAX_EXPECTED, SessionRoutes


def wire(**message: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **message}).encode()


def test_notifications_and_requests_go_on_the_session_they_name():
    routes = SessionRoutes()
    update = wire(method="session/update", params={"sessionId": "s1", "update": {}})
    ask = wire(id="rawp-ask-1", method="session/request_permission", params={"sessionId": "s2"})
    assert routes.route(update) == "s1"
    assert routes.route(ask) == "s2"
    assert routes.route(wire(method="_rawp/turn", params={"sessionId": "s1"})) == "s1"


def test_an_answer_goes_where_its_request_named_once():
    routes = SessionRoutes()
    routes.expect(wire(id=7, method="session/prompt", params={"sessionId": "s1"}))
    routes.expect(wire(id="7", method="session/load", params={"sessionId": "s2"}))
    routes.expect(wire(id=8, method="session/new", params={"cwd": "/w"}))
    assert routes.route(wire(id="7", result={})) == "s2"  # "7" and 7 are two ids
    assert routes.route(wire(id=7, result={"stopReason": "end_turn"})) == "s1"
    assert routes.route(wire(id=7, result={})) is None  # answered already
    assert routes.route(wire(id=8, result={"sessionId": "s3"})) is None  # names none yet


def test_what_cannot_be_read_or_names_nothing_goes_on_the_connections():
    routes = SessionRoutes()
    for junk in (b"", b"[1]", b'{"params": 3}', b'{"params": {"sessionId": 5}}', b"{" * 5000):
        routes.expect(junk)
        assert routes.route(junk) is None
    routes.expect(wire(id=True, method="session/prompt", params={"sessionId": "s"}))
    assert routes.route(wire(id=True, result={})) is None
    long_id = "x" * 300
    assert routes.route(wire(method="session/update", params={"sessionId": long_id})) is None


def test_requests_remembered_are_bounded():
    routes = SessionRoutes()
    for n in range(MAX_EXPECTED + 10):
        routes.expect(wire(id=n, method="session/prompt", params={"sessionId": "s"}))
    assert routes.route(wire(id=MAX_EXPECTED + 5, result={})) is None
    assert routes.route(wire(id=0, result={})) == "s"
