"""What docs/http-api.md ("Conventions") promises for requests the server refuses before any route
runs, checked on the wire: raw bytes over a TCP socket, so that nothing of a client library
cleans up the request or the answer. And the WebSocket's answer to a binary message."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.support.gateway_peer import Master, create_session
from tests.support.servers import serving


async def raw_exchange(client: TestClient | str, request: bytes) -> tuple[int, dict[str, str], Any]:
    """Send ``request`` as it is to the test client's server (or to a URL) and read the answer to
    its end (the server closes after an error): the status, the headers (lower-case names), the
    JSON body."""
    if isinstance(client, str):
        host, port = client.removeprefix("http://").split(":")
    else:
        host, port = client.host, client.port
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, json.loads(body)


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"G(ET / HTTP/1.1\r\nHost: x\r\n\r\n", id="a bad method"),
        pytest.param(b"GET /healthz HTTP/9\r\nHost: x\r\n\r\n", id="a bad version"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n", id="a space"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A\x01: 1\r\n\r\n", id="a control"),
    ],
)
async def test_a_malformed_request_line_or_header_is_a_json_400_bad_request(
    gw: TestClient, request_bytes: bytes
):
    status, headers, body = await raw_exchange(gw, request_bytes)
    assert status == 400
    assert headers["content-type"].startswith("application/json")
    assert body["error_code"] == "BAD_REQUEST"
    assert body["message"] and "\n" not in body["message"]
    assert set(body) == {"error_code", "message"}


async def test_a_known_path_with_another_method_is_405_method_not_allowed(gw: TestClient):
    status, headers, body = await raw_exchange(
        gw,
        b"DELETE /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        + f"Authorization: Bearer {gw.token}\r\n\r\n".encode(),
    )
    assert status == 405
    assert headers["content-type"].startswith("application/json")
    assert body["error_code"] == "METHOD_NOT_ALLOWED"


async def test_the_server_still_serves_after_a_malformed_request(gw: TestClient):
    await raw_exchange(gw, b"G(ET / HTTP/1.1\r\n\r\n")
    assert (await (await gw.get("/healthz")).json()) == {"status": "ok"}


async def test_a_binary_websocket_message_is_answered_with_invalid_frame(gw: TestClient):
    session = await create_session(gw)
    master = await Master.attach(gw, session["session_id"])
    await master.until("session.capabilities")
    await master.ws.send_bytes(b'{"v": 1}')
    error = await master.until("session.error")
    assert error["payload"]["error_code"] == "INVALID_FRAME"
    assert error["payload"]["fatal"] is False
    assert not master.ws.closed  # the session goes on


async def test_serve_answers_a_malformed_request_in_json_too(tmp_path):
    """The same answer from ``rawp-gateway serve`` (whose runner also bounds connections)."""
    async with serving(tmp_path) as url:
        status, headers, body = await raw_exchange(url, b"G(ET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 400
    assert headers["content-type"].startswith("application/json")
    assert body["error_code"] == "BAD_REQUEST"
