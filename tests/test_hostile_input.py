"""Hostile masters and hostile HTTP input never take the gateway down: each test plays one attack
against a real gateway on 127.0.0.1 (real server, demo agent process, real WebSocket clients) and
checks that the attacker gets a clear error while the session and the gateway go on."""

from __future__ import annotations

import json

import aiohttp
import pytest

from gateway.server import SESSIONS
from tests.gateway_peer import Master, create_session, fast_demo, make_config, start_gateway


@pytest.fixture
async def gw(tmp_path):
    client = await start_gateway(make_config(tmp_path, agents={"demo": fast_demo()}))
    yield client
    await client.close()


async def prompt_and_wait(master: Master, text: str) -> list[dict]:
    start = len(master.frames)
    await master.send("control.prompt.request", {"prompt_text": text})
    await master.until("session.usage", timeout=30)
    return master.frames[start:]


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
    frames = await prompt_and_wait(master, "still there?")
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
    frames = await prompt_and_wait(again, "after the bug")
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
    """Forty references whose display_path contains their own ref_id used to double the prompt
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
    many = refs(*[(f"#{i}", f"f{i}") for i in range(65)])
    await master.send("control.prompt.request", {"prompt_text": "#1", "file_references": many})
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
