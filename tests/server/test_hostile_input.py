"""Hostile masters and hostile HTTP input never take the gateway down: each test plays one attack
against a real gateway on 127.0.0.1 (real server, demo agent process, real WebSocket clients) and
checks that the attacker gets a clear error while the session and the gateway go on."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.agent.profiles import builtin_profiles
from gateway.client import GatewayClient, MasterView
from gateway.config import with_made_token
from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.factory import FrameFactory
from gateway.protocol.history_frames import history_frames
from gateway.protocol.states import TimerKey, TimerKind
from gateway.server import SESSIONS, create_app, is_loopback
from gateway.session import LiveSession
from tests.support.gateway_peer import (
    SUBPROTOCOL,
    Master,
    create_session,
    demo_config,
    make_config,
    prompt_and_wait,
    prompted,
    start_gateway,
)
from tests.support.procs import session_processes
from tests.support.waiting import eventually

# --- deep nesting on the WebSocket -----------------------------------------------------------------


async def test_a_deeply_nested_frame_is_invalid_frame_and_the_socket_stays_usable(gw):
    """A 2 KB frame nested 1,000 levels deep is answered with a non-fatal
    INVALID_FRAME; the same connection then runs a prompt."""
    session = await create_session(gw)
    master = await Master.attach(gw, session["session_id"])
    deep = "[" * 1000 + "]" * 1000
    frame = (
        '{"v":1,"type":"control.prompt.request","message_id":"m-deep",'
        '"timestamp":"2026-11-29T00:00:00.000Z","session_id":"' + session["session_id"] + '",'
        '"payload":{"prompt_text":"hi","config_overrides":{"json_schema":{"a":' + deep + "}}}}"
    )
    await master.ws.send_str(frame)
    error = await master.until("session.error")
    assert error["payload"]["error_code"] == "INVALID_FRAME"
    assert error["payload"]["fatal"] is False
    assert "nests deeper" in error["payload"]["message"]
    await master.ws.send_str("[" * 1000)  # not even JSON: the same answer
    error = await master.until("session.error")
    assert error["payload"]["error_code"] == "INVALID_FRAME"
    frames = await prompt_and_wait(master, "still there?", timeout=30)
    assert frames[-1]["type"] == "session.usage"


async def test_an_error_after_the_upgrade_closes_the_websocket_never_writes_http(gw):
    """Once the WebSocket is prepared the response head is gone: an unexpected error in handling a
    frame ends the socket with close code 1011, not an HTTP 500 written into the stream (which a
    client reads as a broken frame)."""
    session = await create_session(gw)
    master = await Master.attach(gw, session["session_id"])
    live = gw.server.app[SESSIONS][session["session_id"]]

    def broken(conn_id: str, data: str | bytes) -> None:
        raise RuntimeError("a bug in handling a frame")

    live.receive = broken
    await master.send("control.prompt.request", {"prompt_text": "boom"})
    end = await master.ws.receive(timeout=10)
    while end.type == aiohttp.WSMsgType.TEXT:
        end = await master.ws.receive(timeout=10)
    assert end.type == aiohttp.WSMsgType.CLOSE, end
    assert master.ws.close_code == 1011
    assert (await gw.get("/healthz")).status == 200
    del live.receive  # the session still works for a new connection
    again = await Master.attach(gw, session["session_id"])
    frames = await prompt_and_wait(again, "after the bug", timeout=30)
    assert frames[-1]["type"] == "session.usage"
    assert json.dumps(frames)  # every frame was a well-formed JSON text


# --- file references ---------------------------------------------------------------------------------


def refs(*pairs: tuple[str, str]) -> list[dict]:
    return [
        {
            "ref_id": ref_id,
            "path": path,
            "name": path.rsplit("/", 1)[-1],
            "workspace_relative_path": path,
            "display_path": path,
        }
        for ref_id, path in pairs
    ]


async def echoed_text(master: Master) -> str:
    done = await master.until("agent.text.done", timeout=30)
    await master.until("session.turn.end", timeout=30)
    return done["payload"]["full_text"]


async def test_DPS_6_1_1_prompt_file_references_are_replaced_in_one_pass(gw):
    """DPS-6.1.1-prompt: forty references whose display_path contains their own ref_id used to double the prompt
    forty times (2^40 copies: the gateway ran out of memory on a 4 KB frame). Each token is now
    replaced once, in the original text; an empty ref_id names no token. The plain agent prints
    its prompt back, so the master sees exactly what the agent got."""
    session = await create_session(gw, agent="plain")
    master = await Master.attach(gw, session["session_id"])
    pairs = [(f"@r{i:02d}", f"src/@r{i:02d}/f{i}.py") for i in range(40)]
    text = "look at " + " and ".join(ref_id for ref_id, _ in pairs)
    references = refs(*pairs, ("", "inserted/between/every/character"))
    await master.send(
        "control.prompt.request", {"prompt_text": text, "file_references": references}
    )
    expected = "look at " + " and ".join(path for _, path in pairs)
    assert await echoed_text(master) == expected + "\n"


async def test_too_many_file_references_or_a_too_large_prompt_is_refused_and_the_session_goes_on(
    gw,
):
    """Past 64 references, or when replacing tokens would make the prompt larger than
    max_frame_size, the prompt is refused with a non-fatal session.error; no turn starts and the
    next prompt runs."""
    session = await create_session(gw, agent="plain")
    master = await Master.attach(gw, session["session_id"])
    many = refs(*[(f"@ref{i}", f"f{i}") for i in range(65)])
    await master.send("control.prompt.request", {"prompt_text": "@ref1", "file_references": many})
    error = await master.until("session.error")
    assert error["payload"]["error_code"] == "TOO_MANY_FILE_REFERENCES"
    assert error["payload"]["fatal"] is False
    # A one-character token 10,000 times, each replaced by a 1 KB path: 10 MB from a 20 KB frame.
    huge = refs(("x", "p" * 1024))
    await master.send(
        "control.prompt.request", {"prompt_text": "x " * 10_000, "file_references": huge}
    )
    error = await master.until("session.error")
    assert error["payload"]["error_code"] == "PROMPT_TOO_LARGE"
    assert error["payload"]["fatal"] is False
    assert "session.turn.start" not in master.types()
    await master.send(
        "control.prompt.request", {"prompt_text": "see x", "file_references": refs(("x", "a.py"))}
    )
    assert await echoed_text(master) == "see a.py\n"


# --- POST /v1/session: validation before anything is created ------------------------------------


def raw_post(body: bytes) -> dict:
    return {"data": body, "headers": {"Content-Type": "application/json"}}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        # NaN and Infinity are not JSON; 1e400 is beyond a double: all refused as the JSON they are
        (b'{"agent": "demo", "reattach_window_sec": NaN}', "INVALID_JSON"),
        (b'{"agent": "demo", "reattach_window_sec": Infinity}', "INVALID_JSON"),
        (b'{"agent": "demo", "reattach_window_sec": 1e400}', "INVALID_JSON"),
        (b'{"agent": "demo", "reattach_window_sec": 1' + b"0" * 400 + b"}", "INVALID_REQUEST"),
        (b'{"agent": "demo", "reattach_window_sec": 1e300}', "INVALID_REQUEST"),
        (b'{"agent": "demo", "reattach_window_sec": -1}', "INVALID_REQUEST"),
        (b'{"agent": "demo", "buffer": {"max_bytes": 1' + b"0" * 400 + b"}}", "INVALID_REQUEST"),
        (b'{"agent": "demo", "buffer": {"policy": ["RING"]}}', "INVALID_REQUEST"),
        (b'{"agent": "demo", "name": "' + b"n" * 257 + b'"}', "INVALID_REQUEST"),
        (b'{"agent": "demo", "name": 7}', "INVALID_REQUEST"),
        (b'{"agent": "demo", "workspace_path": "a\\u0000b"}', "INVALID_REQUEST"),
        (b'{"agent": "demo", "workspace_path": "' + b"x" * 300 + b'"}', "INVALID_REQUEST"),
        (b'{"agent": "demo", "workspace_path": "' + b"a/" * 2000 + b'"}', "INVALID_REQUEST"),
        (
            b'{"agent": "demo", "workspace_path": ' + b"[" * 5000 + b"]" * 5000 + b"}",
            "INVALID_JSON",
        ),
        (b'{"agent": ' + b'{"a":' * 3000 + b"1" + b"}" * 3001, "INVALID_JSON"),
        (b'{"agent": "demo", "origin": {"x": 1}}', "INVALID_REQUEST"),
        (b"\xff\xfe{}", "INVALID_JSON"),
    ],
)
async def test_bad_session_requests_are_400_and_create_nothing(gw, tmp_path, body, code):
    """Every field is checked (finite, ranged, bounded) before the session or its agent exists:
    a 400 with error_code, never a 500, and nothing left behind."""
    before = sorted(p.name for p in tmp_path.iterdir())
    resp = await gw.post("/v1/session", **raw_post(body))
    assert resp.status == 400, await resp.text()
    assert (await resp.json())["error_code"] == code
    assert (await (await gw.get("/v1/sessions")).json())["sessions"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == before


async def test_max_sessions_is_a_503_and_a_deleted_session_frees_its_place(tmp_path):
    config = demo_config(tmp_path, max_sessions=2)
    client = await start_gateway(config)
    try:
        first = await create_session(client)
        await create_session(client)
        resp = await client.post("/v1/session", json={"agent": "demo"})
        assert resp.status == 503
        assert (await resp.json())["error_code"] == "TOO_MANY_SESSIONS"
        assert len((await (await client.get("/v1/sessions")).json())["sessions"]) == 2
        await client.delete(f"/v1/session/{first['session_id']}")
        await create_session(client)
    finally:
        await client.close()


async def test_a_session_whose_start_fails_is_not_left_registered_nor_running(gw):
    """A failure after the session is registered and its agent started (as NaN once did) answers
    an error and leaves neither the session nor its process behind."""
    app = gw.server.app
    original = LiveSession._set_timer
    seen: list[str] = []

    def failing(self: LiveSession, key: TimerKey, seconds: float) -> None:
        if key.kind is not TimerKind.REATTACH_WINDOW:
            return original(self, key, seconds)
        seen.append(self.id)
        raise ValueError("a timer that cannot be armed")

    LiveSession._set_timer = failing  # type: ignore[method-assign]
    try:
        resp = await gw.post("/v1/session", json={"agent": "demo"})
    finally:
        LiveSession._set_timer = original  # type: ignore[method-assign]
    assert resp.status == 500
    assert (await resp.json())["error_code"] == "INTERNAL_ERROR"
    assert app[SESSIONS] == {}
    await eventually(lambda: not session_processes(seen[0]), "the agent to be stopped", timeout=5)


# --- authentication -----------------------------------------------------------------------------


@pytest.fixture
async def gw_token(tmp_path):
    client = await start_gateway(demo_config(tmp_path, token="s3cret"))
    yield client
    await client.close()


async def test_bearer_scheme_is_case_insensitive(gw_token):
    """RFC 7235: the auth-scheme is case-insensitive."""
    for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
        resp = await gw_token.get("/v1/sessions", headers={"Authorization": f"{scheme} s3cret"})
        assert resp.status == 200, scheme
    for header in ("Basic s3cret", "Bearer", "Bearer s3cre", "s3cret", "Bearers3cret"):
        resp = await gw_token.get("/v1/sessions", headers={"Authorization": header})
        assert resp.status == 401, header
        assert (await resp.json())["error_code"] == "UNAUTHORIZED"


async def test_a_non_utf8_authorization_header_is_401_not_500(gw_token):
    """Raw header bytes that are not UTF-8 (sent on a plain socket, as a hostile client would)."""
    port = gw_token.server.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"GET /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer \xff\xfe\xc3\x28\r\nConnection: close\r\n\r\n"
    )
    await writer.drain()
    response = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    status_line, _, rest = response.partition(b"\r\n")
    assert status_line.split()[1] == b"401", response
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["error_code"] == "UNAUTHORIZED"


# --- ?role=local-ui ---------------------------------------------------------------------------------


def test_local_ui_is_a_loopback_peer_only():
    for address in ("127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"):
        assert is_loopback(address), address
    for address in ("10.0.0.5", "192.168.1.2", "::ffff:10.0.0.5", "2001:db8::1", "", None, "x"):
        assert not is_loopback(address), address


async def test_DPS_2_4_local_ui_from_loopback_reaches_a_local_session(gw):
    """DPS-2.4-local: a local UI on the gateway's own machine attaches to a local session; a master
    does not."""
    session = await create_session(gw, origin="local")
    refused = await gw.get(
        f"/v1/session/{session['session_id']}/ws", headers={"Sec-WebSocket-Protocol": SUBPROTOCOL}
    )
    assert refused.status == 403
    assert (await refused.json())["error_code"] == "LOCAL_SESSION"
    ui = await Master.attach(gw, session["session_id"], role="local-ui")
    frames = await prompt_and_wait(ui, "hello", timeout=30)
    assert frames[-1]["type"] == "session.usage"


# --- a history larger than max_frame_size -----------------------------------------------------------


def printer():
    """A single-turn agent printing as many lines as its prompt says (the plain parser)."""
    code = "import sys\nfor i in range(int(sys.argv[1])): print('line', i, 'x' * 40)"
    plain = builtin_profiles()["plain"]
    return replace(plain, name="printer", command=(sys.executable, "-c", code, "{prompt}"))


async def test_DPS_7_1_a_long_history_comes_in_parts_that_each_fit_max_frame_size(tmp_path):
    """DPS-7.1-history: 20,000 lines buffered: the reattach history (about 6 MB) used to be one frame far over the
    announced 1 MiB. Every frame now fits max_frame_size, the history comes in
    ``metadata.history_part`` parts, and the client library (honouring the announced size as
    its max message size) joins them into the one history with every missed frame."""
    config = make_config(tmp_path, agents={"printer": printer()})
    client = await start_gateway(config)
    try:
        first = await prompted(client, "20000", agent="printer")
        sid = first.session_id
        start = await first.until("session.turn.start", timeout=30)
        await first.until("session.turn.end", timeout=120)
        await first.until("agent.state.changed", current_state="idle")  # what end_turn sends last
        produced = [f for f in first.frames if f["type"] not in ("session.capabilities",)]
        missed = produced[produced.index(start) + 1 :]
        assert len(missed) > 20_000

        raw = await Master.attach(client, sid, last_message_id=start["message_id"])
        parts = []
        while True:
            msg = await raw.ws.receive(timeout=30)
            assert len(msg.data.encode()) <= config.server.max_frame_size
            frame = json.loads(msg.data)
            if frame["type"] == "session.history":
                parts.append(frame)
                if frame["metadata"]["history_part"] == frame["metadata"]["history_parts"]:
                    break
        assert len(parts) > 4
        assert [p["metadata"]["history_part"] for p in parts] == list(range(1, len(parts) + 1))
        replayed = [f["message_id"] for p in parts for f in p["payload"]["frames"]]
        assert replayed == [f["message_id"] for f in missed]
        for p in parts:
            assert p["payload"]["buffer_status"]["truncated"] is False
            assert p["payload"]["buffer_status"]["lost_frame_count"] == 0
        # each part's last_message_id is its own last frame; the last part's the newest
        for p in parts:
            assert p["payload"]["last_message_id"] == p["payload"]["frames"][-1]["message_id"]

        url = str(client.make_url("/")).rstrip("/")
        async with GatewayClient(url, token=client.token) as gateway:
            conn = await gateway.attach(
                sid, last_message_id=start["message_id"], max_msg_size=config.server.max_frame_size
            )
            while True:
                frame = await conn.receive()
                assert frame is not None
                if isinstance(frame.payload, F.History):
                    break
            history = frame.payload
            assert [json.loads(bytes(f))["message_id"] for f in history.frames] == [
                f["message_id"] for f in missed
            ]
            assert conn.last_message_id == missed[-1]["message_id"]
            view = MasterView(sid)
            outcome = view.history(history)
            assert outcome.unfinalized and len(outcome.applied) == len(missed)
            await conn.close()
    finally:
        await client.close()


def test_history_parts_never_exceed_max_frame_size_and_count_what_cannot_fit():
    """A buffered frame too large for any part, and the oldest frames past the send queue's
    room, are lost frames: truncated, counted exactly."""
    factory = FrameFactory("0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a")
    frames = []
    for size in (100, 5000, 4090, 100, 3000, 100):
        text = F.TextDelta(content_index=0, text="x" * size)
        frames.append(codec.encode(factory.frame(text)))
    kwargs = dict(
        truncated=False,
        lost_frame_count=0,
        last_message_id="m",
        last_sync_timestamp="t",
        buffer_policy="RING",
        buffer_high_watermark=1,
        max_frame_size=4096,
    )
    parts, unsent = history_frames(factory, frames, **kwargs)
    out = [data for _, data in parts]
    assert unsent == 2  # the 5000 and the 4090 byte frames cannot fit with the history around them
    assert all(len(data) <= 4096 for data in out)
    payloads = [json.loads(data)["payload"] for data in out]
    assert sum(len(p["frames"]) for p in payloads) == 4
    assert all(p["buffer_status"] == payloads[0]["buffer_status"] for p in payloads)
    assert payloads[0]["buffer_status"]["truncated"] is True
    assert payloads[0]["buffer_status"]["lost_frame_count"] == 2
    parts, unsent = history_frames(factory, frames, **kwargs, max_total_bytes=4000)
    out = [data for _, data in parts]
    assert all(len(data) <= 4096 for data in out) and sum(map(len, out)) <= 4000
    kept = [f for data in out for f in json.loads(data)["payload"]["frames"]]
    assert kept == [json.loads(d) for d in frames[-len(kept) :]]  # the newest are kept
    assert unsent == len(frames) - len(kept)


async def test_an_over_long_or_non_ascii_last_message_id_is_a_400(gw):
    """It can come back in session.history: 5,000 characters, or header bytes that are not UTF-8
    (which the history could not even encode), are refused before the upgrade."""
    session = await create_session(gw)
    resp = await gw.get(
        f"/v1/session/{session['session_id']}/ws",
        params={"last_message_id": "m" * 5000},
        headers={"Sec-WebSocket-Protocol": SUBPROTOCOL},
    )
    assert resp.status == 400
    assert (await resp.json())["error_code"] == "INVALID_REQUEST"
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.server.port)
    writer.write(
        f"GET /v1/session/{session['session_id']}/ws HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
        + f"Authorization: Bearer {gw.token}\r\n".encode()
        + b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        + b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        + f"Sec-WebSocket-Protocol: {SUBPROTOCOL}\r\n".encode()
        + b"X-RAWP-Last-Message-Id: \xff\xfe\r\n\r\n"
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    assert head.split()[1] == b"400", head


async def test_a_prompt_with_a_nul_character_is_refused_not_fatal(gw):
    """A NUL cannot be passed in an argv: a single-turn agent's spawn failed and the session
    ended. Refused as INVALID_FRAME, non-fatal; the next prompt runs."""
    session = await create_session(gw, agent="plain")
    master = await Master.attach(gw, session["session_id"])
    for payload in (
        {"prompt_text": "a\u0000b"},
        {"prompt_text": "a", "config_overrides": {"allowed_tools": ["Bash\u0000"]}},
    ):
        await master.send("control.prompt.request", payload)
        error = await master.until("session.error")
        assert error["payload"]["error_code"] == "INVALID_FRAME"
        assert error["payload"]["fatal"] is False
    await master.send("control.prompt.request", {"prompt_text": "ok"})
    assert await echoed_text(master) == "ok\n"


async def test_rename_is_bounded_too(gw):
    session = await create_session(gw, name="")  # an empty name when creating, as before
    path = f"/v1/session/{session['session_id']}"
    for body in ({"name": ""}, {"name": "n" * 257}, {"name": ["x"]}):
        resp = await gw.patch(path, json=body)
        assert resp.status == 400
        assert (await resp.json())["error_code"] == "INVALID_REQUEST"
    resp = await gw.patch(path, json={"name": "n" * 256})
    assert resp.status == 200


async def test_local_ui_from_another_machine_is_403(tmp_path):
    """The peer address as the server sees it is set to another machine's (what a proxy-aware
    middleware does with X-Forwarded-For): ?role=local-ui is refused, the master role is not."""

    @web.middleware
    async def from_elsewhere(request: web.Request, handler):
        return await handler(request.clone(remote="192.0.2.7"))

    config = with_made_token(demo_config(tmp_path))
    app = create_app(config)
    app.middlewares.insert(0, from_elsewhere)
    client = TestClient(TestServer(app), headers={"Authorization": f"Bearer {config.token}"})
    await client.start_server()
    try:
        local = await create_session(client, origin="local")
        remote = await create_session(client)
        for session in (local, remote):
            resp = await client.get(
                f"/v1/session/{session['session_id']}/ws",
                params={"role": "local-ui"},
                headers={"Sec-WebSocket-Protocol": SUBPROTOCOL},
            )
            assert resp.status == 403
            assert (await resp.json())["error_code"] == "LOCAL_UI_FORBIDDEN"
        master = await Master.attach(client, remote["session_id"])
        assert (await prompt_and_wait(master, "hi", timeout=30))[-1]["type"] == "session.usage"
    finally:
        await client.close()


async def test_a_cross_site_post_is_403_and_creates_nothing(gw):
    """A web page of another origin may make the user's browser POST to a loopback gateway without
    asking first (a 'simple' request): anything but GET/HEAD with a foreign Origin is refused."""
    for origin in ("http://evil.example", "null"):
        resp = await gw.post(
            "/v1/session", data='{"agent": "demo"}', headers={"Origin": origin,
            "Content-Type": "text/plain"},
        )  # fmt: skip
        assert resp.status == 403
        assert (await resp.json())["error_code"] == "ORIGIN_FORBIDDEN"
    assert (await (await gw.get("/v1/sessions")).json())["sessions"] == []
    own = f"http://{gw.host}:{gw.port}"
    resp = await gw.post("/v1/session", json={"agent": "demo"}, headers={"Origin": own})
    assert resp.status == 201  # the gateway's own page (the browser console)
    resp = await gw.post("/v1/session", json={"agent": "demo"})
    assert resp.status == 201  # a master that is not a browser sends no Origin


async def test_without_a_token_only_loopback_host_names_are_answered(gw):
    """DNS rebinding: a page whose name now resolves to 127.0.0.1 is same-origin with itself, so
    the Origin check cannot see it; its requests carry its own name in Host and are refused."""
    for host in ("evil.example:8765", "evil.example", "10.0.0.1:8765"):
        resp = await gw.get("/v1/sessions", headers={"Host": host})
        assert resp.status == 403, host
        assert (await resp.json())["error_code"] == "HOST_FORBIDDEN"
    for host in ("127.0.0.1:8765", "localhost", "LOCALHOST.:1", "[::1]:8765", "127.1.2.3"):
        assert (await gw.get("/v1/sessions", headers={"Host": host})).status == 200, host


async def test_with_a_token_any_host_name_is_answered(tmp_path):
    token = "t0ken-for-hosts"
    gw = await start_gateway(demo_config(tmp_path, token=token))
    try:
        headers = {"Host": "gateway.internal:8765", "Authorization": f"Bearer {token}"}
        assert (await gw.get("/v1/sessions", headers=headers)).status == 200
    finally:
        await gw.close()
