"""Files both ways (DPS §4.5, docs/files.md): the per-session store, the step that takes
binary tool output out of events, the frames a master gets for it, a prompt's ``context_files``,
and the HTTP endpoints on a real server (the demo agent behind it)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from pathlib import Path

import pytest

from gateway.protocol import actions as act
from gateway.protocol import codec, prompts
from gateway.protocol import machine as sm
from gateway.server import SESSIONS
from gateway.server.routes.files import byte_range
from gateway.storage import files as gf
from parsers import events as ev
from parsers.base import PromptImage
from parsers.claude_code import ClaudeCodeInput, ClaudeCodeParser
from tests.support.gateway_peer import (
    Master,
    create_session,
    demo_config,
    start_gateway,
)
from tests.support.paths import FIXTURES
from tests.support.waiting import eventually

SESSION = "0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a"
# The 4x3 red PNG the rig's image scenarios put in the workspace.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAQAAAADCAIAAAA7ljmRAAAAEElEQVR4nGP4z8AARww4OQD1MQv1NXv7ggAAAABJRU5ErkJggg=="
)

PNG_B64_HEAD = "iVBORw0KGgo"  # how the base64 of any PNG begins


def store(**kw) -> gf.FileStore:
    limits = {"max_session_bytes": 1 << 20, "max_upload_bytes": 1 << 16, **kw}
    return gf.FileStore(SESSION, **limits)


async def chunks_of(data: bytes, size: int = 1000):
    for i in range(0, len(data), size):
        yield data[i : i + size]


# --- the store ------------------------------------------------------------------------------------


def test_put_keeps_bytes_on_disk_with_checksum_and_url():
    s = store()
    stored = s.put(PNG, file_name="dot.png", mime_type="image/png")
    assert stored.file_url == f"/v1/session/{SESSION}/files/{stored.transfer_id}"
    assert stored.checksum == "sha256:" + hashlib.sha256(PNG).hexdigest()
    assert stored.size_bytes == len(PNG) and s.used_bytes == len(PNG)
    _, path = s.get(stored.transfer_id)
    assert path.read_bytes() == PNG and path.name == stored.transfer_id  # never the given name
    s.close()
    assert not path.parent.exists()  # freed with the session
    with pytest.raises(gf.FileError) as err:
        s.get(stored.transfer_id)
    assert (err.value.status, err.value.error_code) == (404, "TRANSFER_NOT_FOUND")


def test_nothing_is_created_before_the_first_file():
    s = store()
    assert s.directory is None
    with pytest.raises(gf.FileError):
        s.put(b"x", file_name="../x", mime_type="text/plain")
    assert s.directory is None


def test_session_bound_is_507_and_keeps_nothing():
    s = store(max_session_bytes=100)
    s.put(b"a" * 60, file_name="a", mime_type="text/plain")
    with pytest.raises(gf.FileError) as err:
        s.put(b"b" * 60, file_name="b", mime_type="text/plain")
    assert (err.value.status, err.value.error_code) == (507, "SESSION_STORAGE_FULL")
    assert s.used_bytes == 60 and len(s.files) == 1
    s.close()


async def test_upload_over_the_limit_is_413_while_streaming_and_leaves_nothing():
    s = store(max_upload_bytes=2500)
    with pytest.raises(gf.FileError) as err:
        await s.receive(chunks_of(b"x" * 5000), file_name="big.bin", mime_type="text/plain")
    assert (err.value.status, err.value.error_code) == (413, "FILE_TOO_LARGE")
    assert s.used_bytes == 0 and not s.files
    assert s.directory is not None and not list(s.directory.iterdir())
    ok = await s.receive(chunks_of(b"y" * 2500), file_name="ok.bin", mime_type="text/plain")
    assert ok.size_bytes == 2500 and s.read(ok.transfer_id) == b"y" * 2500
    s.close()


async def test_an_image_type_must_start_like_one():
    s = store()
    with pytest.raises(gf.FileError) as err:
        await s.receive(chunks_of(b"not a png"), file_name="x.png", mime_type="image/png")
    assert (err.value.status, err.value.error_code) == (400, "INVALID_REQUEST")
    assert s.used_bytes == 0
    good = await s.receive(chunks_of(PNG, 10), file_name="x.png", mime_type="image/png")
    assert s.read(good.transfer_id) == PNG
    s.close()


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "/etc", "nul\x00", "line\nbreak", "x" * 256, "é" * 128]
)
def test_names_are_base_names_only(name):
    with pytest.raises(gf.FileError) as err:
        gf.check_file_name(name)
    assert (err.value.status, err.value.error_code) == (400, "INVALID_FILE_NAME")


# What a name must not hold besides "/": C1 controls, bidi and other format characters, line and
# paragraph separators (Unicode Cc, Cf, Zl, Zp), and characters drawn as a slash.
LOOKS_HARMLESS = [
    "a\x85b",  # NEL, C1 control
    "a\x9bb",  # CSI, C1 control
    "gpj.\u202eexe",  # RIGHT-TO-LEFT OVERRIDE: shown as exe.jpg
    "a\u200bb",  # ZERO WIDTH SPACE
    "a\ufeffb",  # BOM
    "a\u2028b",  # LINE SEPARATOR
    "a\u2029b",  # PARAGRAPH SEPARATOR
    "etc\u2215passwd",  # DIVISION SLASH
    "etc\u2044passwd",  # FRACTION SLASH
    "etc\uff0fpasswd",  # FULLWIDTH SOLIDUS
    "etc\u29f8passwd",  # BIG SOLIDUS
    "etc\u2571passwd",  # BOX DRAWINGS LIGHT DIAGONAL
    "a\u0338b",  # COMBINING LONG SOLIDUS OVERLAY
]


@pytest.mark.parametrize("name", LOOKS_HARMLESS)
def test_names_refuse_invisible_and_slash_like_characters(name):
    with pytest.raises(gf.FileError) as err:
        gf.check_file_name(name)
    assert (err.value.status, err.value.error_code) == (400, "INVALID_FILE_NAME")
    assert not prompts.valid_file_name(name)  # the check of context_files[].file_name is the same


async def test_put_refuses_invisible_and_slash_like_names_and_keeps_nothing(gw):
    sid = (await create_session(gw))["session_id"]
    store = gw.server.app[SESSIONS][sid].files
    for name in LOOKS_HARMLESS:
        resp = await asyncio.wait_for(put(gw, sid, name, b"x", "text/plain"), 10)
        assert resp.status == 400, name
        assert (await resp.json())["error_code"] == "INVALID_FILE_NAME"
    assert store.used_bytes == 0 and not store.files and store.directory is None


async def prompted_with_a_log(gw, sid: str, file_name: str) -> Master:
    """A log uploaded to the session, and a master that has sent a prompt naming it in
    ``context_files`` as ``file_name``."""
    stored = await (await put(gw, sid, "app.log", b"boom\n", "text/plain")).json()
    master = await Master.attach(gw, sid)
    files = [{"file_url": stored["file_url"], "file_name": file_name}]
    await master.send("control.prompt.request", {"prompt_text": "hi", "context_files": files})
    return master


async def test_a_context_file_name_with_a_bidi_override_never_reaches_the_agent(gw, tmp_path):
    """The name a prompt gives an attached file is checked as ?name= is: refused, the prompt is
    not run, nothing is written into the workspace."""
    (tmp_path / "ws").mkdir()
    sid = (await create_session(gw, workspace_path="ws"))["session_id"]
    master = await prompted_with_a_log(gw, sid, "gol.\u202eexe")
    error = await master.until("session.error")
    assert error["payload"]["error_code"] == "INVALID_FRAME"
    assert "\u202e" not in json.dumps(error, ensure_ascii=False).replace("gol.\u202eexe", "")
    assert not (tmp_path / "ws" / ".rawp").exists()
    assert not any(f["type"] == "session.turn.start" for f in master.frames)
    await master.ws.close()


@pytest.mark.parametrize("name", ["dot.png", "Screen Shot 2026.png", "x" * 255, "..hidden", "a\\b"])
def test_good_names(name):
    assert gf.check_file_name(name) == name


# --- agent -> master: parser, store step, frames ------------------------------------------------------


def _fixture_lines(agent: str, name: str) -> list[bytes]:
    return (FIXTURES / agent / f"{name}.jsonl").read_bytes().splitlines()


def test_claude_code_read_of_a_png_is_binary_content():
    """The real CLI's Read of a PNG (fixture tool-read-image): the tool_result's image block."""
    parser = ClaudeCodeParser()
    results = [
        e
        for line in _fixture_lines("claude-code", "tool-read-image")
        for e in parser.feed(line)
        if isinstance(e, ev.ToolResult)
    ]
    assert len(results) == 1
    (binary,) = results[0].binary
    assert base64.b64decode(binary.data) == PNG
    assert binary.mime_type == "image/png"
    assert binary.path is not None and binary.path.endswith("/dot.png")


def test_transfer_then_binary_ref_and_no_base64_on_the_wire(tmp_path):
    """§4.5: agent.file.transfer (download) first, then the result with output_type binary_ref
    pointing at the same transfer; the file's base64 is in no frame."""
    lines = _fixture_lines("claude-code", "tool-read-image")
    workspace = Path(json.loads(lines[0])["cwd"])
    s = store()
    m = sm.SessionMachine(SESSION, ClaudeCodeParser(), ClaudeCodeInput(), files=s.files)
    frames = []
    for line in lines:
        events = gf.store_tool_files(m.parser.feed(line), s, workspace)
        frames += [a.frame for a in m.agent_events(events) if isinstance(a, act.Emit)]
    wire = b"".join(codec.encode(f) for f in frames)
    assert base64.b64encode(PNG) not in wire
    types = [f.TYPE for f in frames]
    i = types.index("agent.file.transfer")
    assert types[i + 1] == "tool.invoke.result"
    transfer, result = frames[i].payload, frames[i + 1].payload
    request = next(f.payload for f in frames if f.TYPE == "tool.invoke.request")
    assert transfer.direction == "download" and transfer.file_name == "dot.png"
    assert transfer.mime_type == "image/png" and transfer.size_bytes == len(PNG)
    assert transfer.checksum == "sha256:" + hashlib.sha256(PNG).hexdigest()
    assert transfer.context.related_tool_invocation_id == request.invocation_id
    assert transfer.context.workspace_relative_path == "dot.png"
    assert result.output_type == "binary_ref" and result.status == "success"
    assert result.output == {
        "transfer_id": transfer.transfer_id,
        "file_url": transfer.file_url,
        "mime_type": "image/png",
        "size_bytes": len(PNG),
    }
    assert s.read(transfer.transfer_id) == PNG
    s.close()


def test_content_that_cannot_be_stored_is_named_not_relayed():
    s = store(max_session_bytes=10)
    result = ev.ToolResult(
        call_id="t1",
        is_error=False,
        output="",
        binary=[ev.BinaryData(data=base64.b64encode(PNG).decode(), mime_type="image/png")],
    )
    (out,) = gf.store_tool_files([result], s, None)
    assert out.binary == [] and out.files == []
    assert "image/png" in out.output and "not relayed" in out.output
    bad = ev.ToolResult(
        call_id="t2", is_error=False, output="", binary=[ev.BinaryData(data="%%", mime_type="x")]
    )
    (out,) = gf.store_tool_files([bad], s, None)
    assert "not valid base64" in out.output and "application/octet-stream" in out.output


# --- master -> agent: context_files in the session machine --------------------------------------


def _prompt_frame(context_files: list[dict]) -> bytes:
    import uuid

    return json.dumps(
        {
            "v": 1,
            "type": "control.prompt.request",
            "message_id": str(uuid.uuid4()),
            "timestamp": "2026-11-29T00:00:00.000Z",
            "session_id": SESSION,
            "payload": {"prompt_text": "What is in it?", "context_files": context_files},
        }
    ).encode()


def _machine(s: gf.FileStore, **config) -> sm.SessionMachine:
    m = sm.SessionMachine(
        SESSION, ClaudeCodeParser(), ClaudeCodeInput(), sm.SessionConfig(**config), files=s.files
    )
    m.start()
    return m


def _errors(actions) -> list[tuple[str, str]]:
    return [
        (a.frame.payload.error_code, a.frame.payload.message)
        for a in actions
        if isinstance(a, act.Emit) and a.frame.TYPE == "session.error"
    ]


def test_an_image_reaches_an_agent_that_takes_images_as_an_image():
    s = store()
    shot = s.put(PNG, file_name="shot.png", mime_type="image/png")
    m = _machine(s, accepts_images=True)
    actions = m.receive("c1", _prompt_frame([{"file_url": shot.file_url, "file_name": "s.png"}]))
    (write,) = [a for a in actions if isinstance(a, act.WritePrompt)]
    assert write.images == [shot]
    assert "What is in it?" in write.text and "s.png" not in write.text  # the stored name
    assert "shot.png (image/png, attached as an image)" in write.text
    assert not [a for a in actions if isinstance(a, act.PlaceFile | act.WriteStdin)]
    s.close()


def test_other_files_and_images_for_other_agents_go_into_the_workspace():
    s = store()
    log = s.put(b"boom\n", file_name="app.log", mime_type="text/plain")
    shot = s.put(PNG, file_name="shot.png", mime_type="image/png")
    m = _machine(s, accepts_images=False)
    files = [
        {"file_url": log.file_url, "file_name": "app.log"},
        {"file_url": shot.file_url, "file_name": "screen.png"},
    ]
    actions = m.receive("c1", _prompt_frame(files))
    places = [(a.transfer_id, a.name) for a in actions if isinstance(a, act.PlaceFile)]
    assert places == [(log.transfer_id, "app.log"), (shot.transfer_id, "screen.png")]
    (write,) = [a for a in actions if isinstance(a, act.WriteStdin)]
    text = json.loads(write.data)["message"]["content"]
    assert ".rawp/uploads/app.log (text/plain, 5 bytes)" in text
    assert ".rawp/uploads/screen.png (image/png" in text
    assert log.file_url not in text  # a path the agent can open, not a URL
    # the file is placed before the prompt is written
    kinds = [type(a) for a in actions if isinstance(a, act.PlaceFile | act.WriteStdin)]
    assert kinds == [act.PlaceFile, act.PlaceFile, act.WriteStdin]
    s.close()


def test_single_turn_agent_gets_images_with_its_spawn():
    s = store()
    shot = s.put(PNG, file_name="shot.png", mime_type="image/png")
    m = _machine(s, accepts_images=True, single_turn_process=True)
    actions = m.receive("c1", _prompt_frame([{"file_url": shot.file_url, "file_name": "a.png"}]))
    (spawn,) = [a for a in actions if isinstance(a, act.Spawn)]
    assert spawn.images == [shot]
    s.close()


@pytest.mark.parametrize(
    "url, why",
    [
        ("https://example.com/cat.png", "not a file of this session"),
        ("file:///etc/passwd", "not a file of this session"),
        (f"/v1/session/{SESSION}/files/00000000-0000-4000-8000-000000000000", "not a file of"),
        ("http://127.0.0.1:1/v1/session/{id}/files/{tid}", "not a file of this session"),
    ],
)
def test_foreign_or_unknown_file_urls_are_refused(url, why):
    """The gateway never fetches a URL from a frame: anything but its own URL of a file of this
    session is session.error INVALID_FRAME, and nothing is started."""
    s = store()
    stored = s.put(b"x", file_name="x.txt", mime_type="text/plain")
    url = url.replace("{id}", SESSION).replace("{tid}", stored.transfer_id)
    m = _machine(s)
    actions = m.receive("c1", _prompt_frame([{"file_url": url, "file_name": "x.txt"}]))
    ((code, message),) = _errors(actions)
    assert code == "INVALID_FRAME" and why in message
    assert m.turn is None
    assert not [a for a in actions if isinstance(a, act.WriteStdin | act.PlaceFile | act.Spawn)]
    s.close()


def test_bad_name_and_too_many_files_are_refused():
    s = store()
    stored = s.put(b"x", file_name="x.txt", mime_type="text/plain")
    m = _machine(s)
    bad = m.receive("c1", _prompt_frame([{"file_url": stored.file_url, "file_name": "../x"}]))
    assert [c for c, _ in _errors(bad)] == ["INVALID_FRAME"]
    many = [{"file_url": stored.file_url, "file_name": "x.txt"}] * (prompts.MAX_CONTEXT_FILES + 1)
    refused = m.receive("c1", _prompt_frame(many))
    assert [c for c, _ in _errors(refused)] == ["INVALID_FRAME"]
    assert m.turn is None
    s.close()


def test_claude_code_input_puts_images_before_the_text():
    data = ClaudeCodeInput().prompt("Look.", images=[PromptImage("image/png", PNG)])
    message = json.loads(data)
    assert message["type"] == "user"
    image, text = message["message"]["content"]
    assert image == {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(PNG).decode(),
        },
    }
    assert text == {"type": "text", "text": "Look."}
    assert json.loads(ClaudeCodeInput().prompt("Plain."))["message"]["content"] == "Plain."


# --- the HTTP endpoints on a real server ------------------------------------------------------------


@pytest.fixture
async def gw(tmp_path):
    config = demo_config(
        tmp_path,
        max_upload_bytes=4096,
        max_session_file_bytes=10_000,
    )
    client = await start_gateway(config)
    yield client
    await client.close()


async def put(gw, session_id: str, name: str, body: bytes, mime: str = "image/png", **kw):
    return await gw.put(
        f"/v1/session/{session_id}/files",
        params={"name": name},
        data=body,
        headers={"Content-Type": mime, **kw.pop("headers", {})},
        **kw,
    )


async def test_put_then_get_the_same_bytes_with_range(gw):
    session = await create_session(gw)
    resp = await put(gw, session["session_id"], "dot.png", PNG)
    assert resp.status == 201, await resp.text()
    body = await resp.json()
    assert set(body) == {
        "transfer_id",
        "file_url",
        "file_name",
        "mime_type",
        "size_bytes",
        "checksum",
    }
    assert body["file_name"] == "dot.png" and body["mime_type"] == "image/png"
    assert body["checksum"] == "sha256:" + hashlib.sha256(PNG).hexdigest()
    got = await gw.get(body["file_url"])
    assert got.status == 200
    assert await got.read() == PNG
    assert got.headers["Content-Type"] == "image/png"
    assert got.headers["ETag"] == f'"{hashlib.sha256(PNG).hexdigest()}"'
    assert int(got.headers["Content-Length"]) == len(PNG)
    part = await gw.get(body["file_url"], headers={"Range": "bytes=8-15"})
    assert part.status == 206 and await part.read() == PNG[8:16]
    assert part.headers["Content-Range"] == f"bytes 8-15/{len(PNG)}"
    tail = await gw.get(body["file_url"], headers={"Range": "bytes=-4"})
    assert tail.status == 206 and await tail.read() == PNG[-4:]
    beyond = await gw.get(body["file_url"], headers={"Range": f"bytes={len(PNG)}-"})
    assert beyond.status == 416
    assert (await beyond.json())["error_code"] == "RANGE_NOT_SATISFIABLE"


async def test_upload_errors(gw):
    sid = (await create_session(gw))["session_id"]
    too_big = await put(gw, sid, "big.bin", b"x" * 5000, "application/octet-stream")
    assert too_big.status == 413
    assert (await too_big.json())["error_code"] == "FILE_TOO_LARGE"

    async def stream():  # no Content-Length: counted as it arrives
        for _ in range(5):
            yield b"x" * 1000

    chunked = await put(gw, sid, "big.bin", stream(), "application/octet-stream")
    assert chunked.status == 413
    assert (await chunked.json())["error_code"] == "FILE_TOO_LARGE"
    for name in ("../etc/passwd", "..", "a/b"):
        bad = await put(gw, sid, name, b"x", "text/plain")
        assert bad.status == 400
        assert (await bad.json())["error_code"] == "INVALID_FILE_NAME"
    no_name = await gw.put(f"/v1/session/{sid}/files", data=b"x")
    assert (no_name.status, (await no_name.json())["error_code"]) == (400, "INVALID_FILE_NAME")
    fake = await put(gw, sid, "fake.png", b"GIF89a not a png")
    assert (fake.status, (await fake.json())["error_code"]) == (400, "INVALID_REQUEST")
    # A Content-Type that is not type/subtype is refused, not taken as application/octet-stream.
    for garbage in ("garbage", "text/plain/extra", "/png"):
        bad_type = await put(gw, sid, "x.txt", b"x", garbage)
        assert (bad_type.status, (await bad_type.json())["error_code"]) == (400, "INVALID_REQUEST")
    with_params = await put(gw, sid, "p.txt", b"x", "Text/Plain; charset=utf-8")
    assert (await with_params.json())["mime_type"] == "text/plain"
    for _ in range(2):
        assert (await put(gw, sid, "a.bin", b"a" * 4000, "text/plain")).status == 201
    full = await put(gw, sid, "c.bin", b"c" * 4000, "text/plain")
    assert (full.status, (await full.json())["error_code"]) == (507, "SESSION_STORAGE_FULL")
    unknown = await gw.get(f"/v1/session/{sid}/files/00000000-0000-4000-8000-000000000000")
    assert (unknown.status, (await unknown.json())["error_code"]) == (404, "TRANSFER_NOT_FOUND")
    no_session = await put(gw, "nope", "a.txt", b"a", "text/plain")
    assert (no_session.status, (await no_session.json())["error_code"]) == (
        404,
        "SESSION_NOT_FOUND",
    )


async def test_files_are_gone_with_the_session(gw):
    sid = (await create_session(gw))["session_id"]
    body = await (await put(gw, sid, "dot.png", PNG)).json()
    live = gw.server.app[SESSIONS][sid]
    assert (await gw.delete(f"/v1/session/{sid}")).status == 200
    # The files go when the session's connections are closed: at its end.
    await asyncio.wait_for(live.terminated.wait(), 10)
    gone = await gw.get(body["file_url"])
    assert (gone.status, (await gone.json())["error_code"]) == (404, "TRANSFER_NOT_FOUND")
    late = await put(gw, sid, "late.png", PNG)
    assert late.status == 409


async def test_files_need_the_token(tmp_path):
    config = demo_config(tmp_path, token="s3cret")
    gw = await start_gateway(config)
    auth = {"Authorization": "Bearer s3cret"}
    try:
        resp = await gw.post("/v1/session", json={"agent": "demo"}, headers=auth)
        sid = (await resp.json())["session_id"]
        refused = await put(gw, sid, "dot.png", PNG)
        assert refused.status == 401
        stored = await (await put(gw, sid, "dot.png", PNG, headers=auth)).json()
        assert (await gw.get(stored["file_url"])).status == 401
        got = await gw.get(stored["file_url"], headers=auth)
        assert got.status == 200 and await got.read() == PNG
    finally:
        await gw.close()


async def test_a_prompt_with_an_uploaded_file_over_the_wire(gw, tmp_path):
    """A master uploads a log, names it in context_files: the file is in the workspace under
    .rawp/uploads before the agent runs; a foreign URL gets session.error INVALID_FRAME."""
    (tmp_path / "ws").mkdir()
    session = await create_session(gw, workspace_path="ws")
    sid = session["session_id"]
    stored = await (await put(gw, sid, "app.log", b"boom\n", "text/plain")).json()
    master = await Master.attach(gw, sid)
    await master.send(
        "control.prompt.request",
        {
            "prompt_text": "list files",
            "context_files": [{"file_url": "https://example.com/x.png", "file_name": "x.png"}],
        },
    )
    error = await master.until("session.error")
    assert error["payload"]["error_code"] == "INVALID_FRAME"
    await master.send(
        "control.prompt.request",
        {
            "prompt_text": "list files",
            "context_files": [{"file_url": stored["file_url"], "file_name": "app.log"}],
        },
    )
    await master.until("session.turn.end")
    assert (tmp_path / "ws" / ".rawp" / "uploads" / "app.log").read_bytes() == b"boom\n"
    await master.ws.close()


async def test_demo_agent_reads_a_png_and_sees_an_uploaded_one(gw, tmp_path):
    """The embedded demo agent does images as the real CLI does: its Read of a PNG reaches the
    master as agent.file.transfer + binary_ref (the bytes downloadable, none on the socket); an
    uploaded image goes to it as an image block and a log into .rawp/uploads, and its answer names
    both."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "dot.png").write_bytes(PNG)
    session = await create_session(gw, workspace_path="ws")
    sid = session["session_id"]
    master = await Master.attach(gw, sid)
    await master.send("control.prompt.request", {"prompt_text": "read dot.png"})
    transfer = await master.until("agent.file.transfer")
    result = await master.until("tool.invoke.result")
    await master.until("session.turn.end")
    p = transfer["payload"]
    assert (p["direction"], p["file_name"], p["mime_type"]) == ("download", "dot.png", "image/png")
    assert p["context"]["workspace_relative_path"] == "dot.png"
    assert result["payload"]["output_type"] == "binary_ref"
    assert result["payload"]["output"]["transfer_id"] == p["transfer_id"]
    got = await gw.get(p["file_url"])
    assert await got.read() == PNG
    assert not any(PNG_B64_HEAD in json.dumps(f) for f in master.frames)

    shot = await (await put(gw, sid, "shot.png", PNG)).json()
    log = await (await put(gw, sid, "app.log", b"boom\n", "text/plain")).json()
    files = [
        {"file_url": log["file_url"], "file_name": "app.log"},
        {"file_url": shot["file_url"], "file_name": "shot.png"},
    ]
    await master.send("control.prompt.request", {"prompt_text": "look", "context_files": files})
    done = await master.until("agent.text.done")
    assert done["payload"]["full_text"] == (
        "I see the image shot.png (4x3). I see the file .rawp/uploads/app.log (5 bytes)."
    )
    await master.ws.close()


def test_translate_shows_the_transfer(tmp_path):
    """``rawp-gateway translate`` writes the file and its transfer frame carries a file:// URL."""
    import io

    from gateway.cli.translate import translate

    out, err = io.BytesIO(), io.StringIO()
    translate(_fixture_lines("claude-code", "tool-read-image"), out, err=err)
    frames = [json.loads(line) for line in out.getvalue().splitlines()]
    (transfer,) = [f["payload"] for f in frames if f["type"] == "agent.file.transfer"]
    path = Path(transfer["file_url"].removeprefix("file://"))
    try:
        assert path.read_bytes() == PNG
        assert f"dot.png (image/png, {len(PNG)} bytes) written to {transfer['file_url']}" in (
            err.getvalue()
        )
        result = next(f["payload"] for f in frames if f["type"] == "tool.invoke.result")
        assert result["output_type"] == "binary_ref"
    finally:
        path.unlink()
        path.parent.rmdir()


async def test_file_metrics(gw):
    """rawp_gateway_session_file_bytes follows what the stores hold; every file offered is
    counted by direction and outcome."""
    sid = (await create_session(gw))["session_id"]
    assert (await put(gw, sid, "dot.png", PNG)).status == 201
    assert (await put(gw, sid, "big.bin", b"x" * 5000, "text/plain")).status == 413
    text = await (await gw.get("/metrics")).text()
    assert f"rawp_gateway_session_file_bytes {float(len(PNG))}" in text
    assert 'rawp_gateway_session_files_total{direction="upload",outcome="stored"} 1.0' in text
    assert 'rawp_gateway_session_files_total{direction="upload",outcome="refused"} 1.0' in text
    live = gw.server.app[SESSIONS][sid]
    await gw.delete(f"/v1/session/{sid}")
    await asyncio.wait_for(live.terminated.wait(), 10)
    text = await (await gw.get("/metrics")).text()
    assert "rawp_gateway_session_file_bytes 0.0" in text


async def test_uploads_are_bounded_by_max_upload_bytes_not_the_json_body_limit(tmp_path):
    """A PUT body streams to disk: [server] max_request_bytes (JSON bodies) does not apply."""
    config = demo_config(tmp_path, max_request_bytes=1024, max_upload_bytes=8192)
    gw = await start_gateway(config)
    try:
        sid = (await create_session(gw))["session_id"]
        body = bytes(range(256)) * 24  # 6144 bytes
        resp = await put(gw, sid, "blob.bin", body, "application/octet-stream")
        assert resp.status == 201, await resp.text()
        assert await (await gw.get((await resp.json())["file_url"])).read() == body
    finally:
        await gw.close()


async def test_an_upload_never_lands_outside_the_workspace(gw, tmp_path):
    """The agent made .rawp a link out of its workspace: the upload is not written there (nor is
    any directory made there), the masters are told (agent.error warning UPLOAD_NOT_PLACED in the
    turn), and the prompt still runs."""
    (tmp_path / "ws2").mkdir()
    session = await create_session(gw, workspace_path="ws2")
    sid = session["session_id"]
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "ws2" / ".rawp").symlink_to(outside)
    master = await prompted_with_a_log(gw, sid, "app.log")
    warning = await master.until("agent.error")
    assert warning["payload"]["error_code"] == "UPLOAD_NOT_PLACED"
    assert (
        warning["payload"]["severity"] == "warning" and "app.log" in warning["payload"]["message"]
    )
    assert warning["turn_id"]
    await master.until("session.turn.end")
    assert list(outside.iterdir()) == []
    await master.ws.close()


async def test_an_upload_replaces_a_hard_link_planted_under_its_name(gw, tmp_path):
    """The agent hard-linked .rawp/uploads/app.log to a file outside its workspace: the upload is
    written to a new file renamed over the name, so the outside file keeps its bytes."""
    ws = tmp_path / "ws3"
    (ws / ".rawp" / "uploads").mkdir(parents=True)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"precious\n")
    os.link(outside, ws / ".rawp" / "uploads" / "app.log")
    sid = (await create_session(gw, workspace_path="ws3"))["session_id"]
    master = await prompted_with_a_log(gw, sid, "app.log")
    await asyncio.wait_for(master.until("session.turn.end"), 20)
    assert outside.read_bytes() == b"precious\n" and outside.stat().st_nlink == 1
    assert (ws / ".rawp" / "uploads" / "app.log").read_bytes() == b"boom\n"
    assert not any(f["type"] == "agent.error" for f in master.frames)
    assert sorted(p.name for p in (ws / ".rawp" / "uploads").iterdir()) == ["app.log"]
    await master.ws.close()


async def upload_begun(gw, name: str, sent: int):
    """A new session, and an upload of a 4000-byte body to it of which ``sent`` bytes have
    reached its file store: the session's id, its store, and the connection still open."""
    sid = (await create_session(gw))["session_id"]
    store = gw.server.app[SESSIONS][sid].files
    reader, writer = await asyncio.open_connection(gw.host, gw.port)
    auth = gw.session.headers["Authorization"]  # the gateway's own, as every client of it sends
    writer.write(
        f"PUT /v1/session/{sid}/files?name={name} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: {auth}\r\n"
        "Content-Type: text/plain\r\nContent-Length: 4000\r\n\r\n".encode()
        + b"x" * sent
    )
    await writer.drain()
    await eventually(lambda: store.used_bytes, "the server to read what was sent")
    return sid, store, reader, writer


async def test_an_upload_that_finishes_after_delete_is_404_and_releases_its_bytes(gw):
    """The session is deleted while a body streams in: the rest is refused with 404
    SESSION_NOT_FOUND (no transfer_id), and rawp_gateway_session_file_bytes is back to what is
    really stored (nothing)."""
    sid, store, reader, writer = await upload_begun(gw, "late.bin", 2000)
    assert (await gw.delete(f"/v1/session/{sid}")).status == 200
    writer.write(b"y" * 2000)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 404"), head
    length = int(next(v for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n"))
                      if k.lower() == b"content-length"))  # fmt: skip
    body = json.loads(await asyncio.wait_for(reader.readexactly(length), 10))
    assert body["error_code"] == "SESSION_NOT_FOUND" and "transfer_id" not in body
    writer.close()
    metrics = await (await gw.get("/metrics")).text()
    assert "rawp_gateway_session_file_bytes 0.0" in metrics
    assert store.used_bytes == 0 and not store.files


def test_file_limits_and_image_flag_are_configurable(tmp_path):
    from gateway.config import Config, load_config

    toml = tmp_path / "gw.toml"
    toml.write_text(
        "[server]\nmax_upload_bytes = 1000\nmax_session_file_bytes = 5000\n"
        '[agents.mine]\nparser = "plain"\ncommand = ["x", "{prompt}"]\n'
        'image_flag = "--attach {path}"\n'
    )
    config = load_config(toml, environ={})
    assert (config.server.max_upload_bytes, config.server.max_session_file_bytes) == (1000, 5000)
    assert config.agents["mine"].image_flag == "--attach {path}"
    assert config.agents["codex"].image_flag == "--image {path}"
    assert (Config().server.max_upload_bytes, Config().server.max_session_file_bytes) == (
        20 << 20,
        256 << 20,
    )


async def test_client_uploads_and_downloads(gw):
    from gateway.client import GatewayClient, GatewayError

    sid = (await create_session(gw))["session_id"]
    async with GatewayClient(str(gw.make_url("")).rstrip("/")) as client:
        stored = await client.upload_file(sid, "dot.png", PNG, "image/png")
        assert stored["size_bytes"] == len(PNG)
        assert await client.download_file(stored["file_url"]) == PNG
        with pytest.raises(GatewayError) as err:
            await client.upload_file(sid, "../x", b"x", "text/plain")
        assert err.value.error_code == "INVALID_FILE_NAME"
        with pytest.raises(GatewayError) as err:
            await client.download_file(f"/v1/session/{sid}/files/nope")
        assert err.value.error_code == "TRANSFER_NOT_FOUND"


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        (None, 10, True),
        ("bytes=0-3", 10, (0, 4)),
        ("bytes=8-", 10, (8, 10)),
        ("bytes=8-100", 10, (8, 10)),
        ("bytes=-3", 10, (7, 10)),
        ("bytes=-30", 10, (0, 10)),
        ("bytes=-0", 10, False),  # RFC 9110 §14.1.2: a suffix of 0 is unsatisfiable
        ("bytes=-5", 0, False),  # an empty file has no range at all, never "bytes 0--1/0"
        ("bytes=0-", 0, False),
        ("bytes=10-", 10, False),
        ("bytes=5-2", 10, True),  # backwards: invalid, ignored
        ("bytes=0-1,4-5", 10, True),  # several: ignored
        ("items=0-1", 10, True),
        ("bytes=-", 10, True),
        ("bytes=" + "9" * 30 + "-", 10, True),  # not a number this gateway reads
    ],
)
def test_byte_range(header, size, expected):
    assert byte_range(header, size) == expected


async def test_range_edge_cases_and_conditional_requests(gw):
    """bytes=-0 is 416, as is any range of an empty file (never "bytes 0--1/0"); If-None-Match
    with the ETag (the SHA-256) is 304; If-Range with it honours the Range, with anything else
    (another tag, a date) gives the whole file."""
    sid = (await create_session(gw))["session_id"]
    url = (await (await put(gw, sid, "a.txt", b"hello world", "text/plain")).json())["file_url"]
    empty = (await (await put(gw, sid, "e.txt", b"", "text/plain")).json())["file_url"]
    zero = await gw.get(url, headers={"Range": "bytes=-0"})
    assert zero.status == 416 and zero.headers["Content-Range"] == "bytes */11"
    nothing = await gw.get(empty, headers={"Range": "bytes=-5"})
    assert nothing.status == 416 and nothing.headers["Content-Range"] == "bytes */0"
    whole_empty = await gw.get(empty)
    assert whole_empty.status == 200 and await whole_empty.read() == b""
    etag = (await gw.get(url)).headers["ETag"]
    assert etag == f'"{hashlib.sha256(b"hello world").hexdigest()}"'
    same = await gw.get(url, headers={"If-None-Match": etag})
    assert same.status == 304 and await same.read() == b"" and same.headers["ETag"] == etag
    assert (await gw.get(url, headers={"If-None-Match": '"other"'})).status == 200
    assert (await gw.head(url, headers={"If-None-Match": f'"x", {etag}'})).status == 304
    part = await gw.get(url, headers={"Range": "bytes=0-4", "If-Range": etag})
    assert part.status == 206 and await part.read() == b"hello"
    for stale in ('"other"', "Wed, 21 Oct 2015 07:28:00 GMT", f"W/{etag}"):
        full = await gw.get(url, headers={"Range": "bytes=0-4", "If-Range": stale})
        assert full.status == 200 and await full.read() == b"hello world", stale


async def test_head_gives_the_headers_only_and_several_ranges_give_the_whole_file(gw):
    """HEAD: Content-Length and no body (the connection stays usable for the next request);
    a Range of several parts is ignored (RFC 9110 allows it): 200 with every byte."""
    sid = (await create_session(gw))["session_id"]
    url = (await (await put(gw, sid, "a.txt", b"hello world", "text/plain")).json())["file_url"]
    head = await gw.head(url)
    assert head.status == 200 and head.headers["Content-Length"] == "11"
    assert await head.read() == b""
    several = await gw.get(url, headers={"Range": "bytes=0-1,4-5"})
    assert several.status == 200 and await several.read() == b"hello world"


async def test_an_upload_cut_off_midway_keeps_nothing(gw):
    """The master's connection drops in the middle of the body: nothing stays stored or
    counted, and the session takes the next upload."""
    sid, store, _reader, writer = await upload_begun(gw, "cut.bin", 1000)
    writer.close()
    await eventually(lambda: store.used_bytes == 0, "the cut upload to be freed")
    assert not store.files
    assert not list(store.directory.iterdir())
    assert (await put(gw, sid, "next.txt", b"ok", "text/plain")).status == 201
