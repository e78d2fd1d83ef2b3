"""A full state disk: nothing acknowledged is lost and nothing torn is served
(gateway/storage/state_dir.py, docs/persistence.md "A full disk"). Every test runs on a real small
``tmpfs`` filled by a ballast file or by a session's own output."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import aiohttp
import pytest

from gateway.protocol.buffer import FrameBuffer
from gateway.storage import state_dir
from gateway.storage.frame_log import parse_log
from gateway.storage.state_dir import FRAMES, RECORD, StateDir
from tests.support.gateway_peer import (
    SUBPROTOCOL,
    Master,
    create_session,
    demo_config,
    prompt_and_wait,
    start_gateway,
)
from tests.support.serve_process import serve
from tests.support.servers import user_headers
from tests.support.tmpfs import fill, small_tmpfs
from tests.support.waiting import eventually

MiB = 1024 * 1024


@pytest.fixture
def disk(tmp_path):
    """A 1 MiB file system for the state directory."""
    with small_tmpfs(tmp_path / "disk", MiB) as where:
        yield where


def whole_lines(log: Path) -> list[dict]:
    """Every line of a frame log, checked whole: ``<seq> <id> <frame JSON>`` or ``<seq> <id> -``;
    the frames."""
    data = log.read_bytes()
    assert not data or data.endswith(b"\n"), f"the log ends in a torn line: {data[-80:]!r}"
    frames = []
    for line in data.splitlines():
        seq, mid, body = line.split(b" ", 2)
        assert int(seq) >= -1 and mid
        if body != b"-":
            frame = json.loads(body)
            assert frame["message_id"] == mid.decode()
            frames.append(frame)
    return frames


def ids_on_disk(log: Path) -> set[str]:
    """The message ids of a frame log whose every line is whole: its frames' and the ids marked
    alone (a frame sent to one connection)."""
    whole_lines(log)
    return {line.split(b" ")[1].decode() for line in log.read_bytes().splitlines()}


def frame(n: int, size: int) -> bytes:
    return json.dumps(
        {"message_id": f"m{n}", "type": "agent.text.delta", "pad": "x" * size}
    ).encode()


async def test_a_write_the_disk_cuts_short_is_cut_back_and_written_when_space_returns(disk):
    """A flush that the disk takes only part of leaves no partial line (the log is cut back to
    its last whole record), the frames it could not write are held and written, in order, by
    the session itself once space returns; meanwhile the state directory says it is failing."""
    sd = StateDir(disk / "state")
    saved = sd.create("s")
    ballast = disk / "ballast"
    fill(ballast, leave=8192)  # two pages free: the flush below needs about five
    for n in range(10):
        saved.append(n, f"m{n}", frame(n, 2000))
    saved.flush()
    kept = whole_lines(saved.path / FRAMES)
    assert [f["message_id"] for f in kept] == [f"m{n}" for n in range(len(kept))]
    assert len(kept) < 10 and saved.failing
    assert "No space left on device" in (sd.health.problem() or "")
    saved.append(10, "m10", frame(10, 10))  # held behind the others
    ballast.unlink()
    await eventually(lambda: not saved.failing, "the held frames written by the retry")
    got = whole_lines(saved.path / FRAMES)
    assert [f["message_id"] for f in got] == [f"m{n}" for n in range(11)]
    assert sd.health.problem() is None
    saved.release()
    sd.close()


class GapCount:
    """The part of the metrics a full disk reports, counted."""

    def __init__(self) -> None:
        self.gap = 0
        self.errors: list[str] = []
        self.failing = 0

    def state_dir_error(self, file: str) -> None:
        self.errors.append(file)

    def state_dir_failing(self, sessions: int) -> None:
        self.failing = sessions

    def history_gap(self, frames: int) -> None:
        self.gap += frames


async def test_frames_held_past_the_bound_leave_an_exact_gap(disk, monkeypatch):
    """While the disk stays full, a session holds at most MAX_UNSAVED_BYTES of frames: the
    oldest go, counted, and one id-only line keeps their sequence numbers, so the history read
    back says exactly how many are missing (DPS-7.1-history ``lost_frame_count``)."""
    monkeypatch.setattr(state_dir, "MAX_UNSAVED_BYTES", 10_000)
    counted = GapCount()
    sd = StateDir(disk / "state", metrics=counted)
    saved = sd.create("s")
    fill(disk / "ballast")
    for n in range(20):
        saved.append(n, f"m{n}", frame(n, 2000))
    saved.flush()
    assert counted.errors == ["log"] and counted.failing == 1
    (disk / "ballast").unlink()
    await eventually(lambda: not saved.failing, "the held frames written")
    assert counted.failing == 0
    entries, torn_at = parse_log((saved.path / FRAMES).read_bytes())
    assert torn_at is None
    kept = [mid for _, mid, data in entries if data is not None]
    assert kept == [f"m{n}" for n in range(20 - len(kept), 20)] and len(kept) < 20
    assert counted.gap == 20 - len(kept)
    buffer = FrameBuffer("RING", MiB)
    buffer.load(entries, last_timestamp=None, crashed=False)
    everything = buffer.everything()
    assert (everything.truncated, everything.lost_frame_count) == (True, counted.gap)
    saved.release()
    sd.close()


def test_a_torn_line_inside_the_log_stops_the_reading_there(tmp_path):
    """A write cut short, then a later one, fuse into a line that begins like a frame and ends
    like one: the reading checks every line, not only the last, and stops at that one."""
    sd = StateDir(tmp_path / "state")
    saved = sd.create("s")
    record = {
        "format": "rawp-gateway-session", "version": 1, "session_id": "s", "agent": "demo",
        "workspace_path": str(tmp_path), "origin": "remote", "created_at": "2026-01-01T00:00:00Z",
        "mode": "default", "turn_index": 0, "reattach_window_sec": 60, "clean": True,
        "buffer": {"policy": "RING", "max_bytes": MiB},
    }  # fmt: skip
    (saved.path / RECORD).write_text(json.dumps(record))
    good = b"0 m0 " + frame(0, 5) + b"\n"
    fused = b"1 m1 " + frame(1, 50)[:30] + b"2 m2 " + frame(2, 5) + b"\n"
    after = b"3 m3 " + frame(3, 5) + b"\n"
    (saved.path / FRAMES).write_bytes(good + fused + after)
    saved.release()
    (got,) = list(sd.load())
    assert [mid for _, mid, _ in got.entries] == ["m0"]
    assert got.torn and got.torn_at == len(good)
    got.saved.release()
    sd.close()


async def test_a_session_whose_record_cannot_be_written_is_not_created(disk, tmp_path):
    """POST /v1/session on a full state disk answers 507 INSUFFICIENT_STORAGE and leaves nothing:
    no session listed, no directory, no agent."""
    state = disk / "state"
    gw = await start_gateway(demo_config(tmp_path, state_dir=state))
    try:
        fill(disk / "ballast")
        resp = await gw.post("/v1/session", json={"agent": "demo"})
        assert resp.status == 507, await resp.text()
        assert (await resp.json())["error_code"] == "INSUFFICIENT_STORAGE"
        assert (await (await gw.get("/v1/sessions")).json())["sessions"] == []
        assert list((state / "sessions").iterdir()) == []
        metrics = await (await gw.get("/metrics")).text()
        assert 'rawp_gateway_state_dir_write_errors_total{file="record"} 1.0' in metrics
        (disk / "ballast").unlink()
        await create_session(gw)  # space is back: taken
    finally:
        await gw.close()


async def test_while_the_disk_is_full_other_sessions_go_on_and_writing_resumes_by_itself(
    disk, tmp_path
):
    """A full disk: a session's turn still reaches its master whole; /readyz and the metrics say
    the state directory is failing; once space returns the session writes what it held without
    any new frame, and /readyz is ready again."""
    state = disk / "state"
    gw = await start_gateway(demo_config(tmp_path, state_dir=state))
    try:
        sid = (await create_session(gw))["session_id"]
        master = await Master.attach(gw, sid)
        await master.next()
        fill(disk / "ballast")
        frames = await prompt_and_wait(master, "hello while the disk is full", idle=True)
        assert frames[-1]["type"] == "agent.state.changed"

        async def failing() -> bool:
            return (await gw.get("/readyz")).status == 503

        await eventually_async(failing, "/readyz saying the state directory fails")
        ready = await (await gw.get("/readyz")).json()
        assert ready["error_code"] == "INSUFFICIENT_STORAGE"
        assert "No space left on device" in ready["message"]
        metrics = await (await gw.get("/metrics")).text()
        assert "rawp_gateway_state_dir_failing_sessions 1.0" in metrics
        (disk / "ballast").unlink()

        async def ready_again() -> bool:
            return (await gw.get("/readyz")).status == 200

        await eventually_async(ready_again, "/readyz ready once space returned")
        assert {f["message_id"] for f in frames} <= ids_on_disk(state / "sessions" / sid / FRAMES)
        metrics = await (await gw.get("/metrics")).text()
        assert "rawp_gateway_state_dir_failing_sessions 0.0" in metrics
    finally:
        await gw.close()


async def eventually_async(check, what: str, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)
    assert what


async def test_a_torn_log_is_served_up_to_the_tear_and_said(tmp_path):
    """A saved log with a torn line inside it (DPS-7.1-history): the restart logs it and counts
    it, a reattach gets valid frames up to the tear with ``truncated: true``, and the next frames
    are written after the last whole line, never fused with the torn one."""
    state = tmp_path / "state"
    gw = await start_gateway(demo_config(tmp_path, state_dir=state))
    sid = (await create_session(gw))["session_id"]
    master = await Master.attach(gw, sid)
    await master.next()
    await prompt_and_wait(master, "hello there", idle=True)
    await gw.close()
    log = state / "sessions" / sid / FRAMES
    lines = log.read_bytes().splitlines(keepends=True)
    keep = 4
    torn = lines[keep][: len(lines[keep]) // 2]  # a write cut short, then the next one
    log.write_bytes(b"".join(lines[:keep]) + torn + b"".join(lines[keep + 1 :]))
    gw = await start_gateway(demo_config(tmp_path, state_dir=state))
    try:
        metrics = await (await gw.get("/metrics")).text()
        assert "rawp_gateway_saved_logs_torn_total 1.0" in metrics
        again = await Master.attach(gw, sid, history="all")
        await again.next()
        history = (await again.until("session.history"))["payload"]
        assert [f["message_id"] for f in history["frames"]] == [
            line.split(b" ")[1].decode() for line in lines[:keep] if not line.endswith(b" -\n")
        ]
        assert history["buffer_status"]["truncated"] is True
        second = await prompt_and_wait(again, "and again", idle=True)
        on_disk = [f["message_id"] for f in whole_lines(log)]
        assert on_disk[: len(history["frames"])] == [f["message_id"] for f in history["frames"]]
        await eventually(
            lambda: {f["message_id"] for f in second} <= ids_on_disk(log), "the new frames written"
        )
    finally:
        await gw.close()


async def test_serve_on_a_disk_one_session_fills_loses_nothing_acknowledged(tmp_path):
    """``rawp-gateway serve`` with its state directory on a small disk (DPS-7.1-history): one
    session's output fills it; another session goes on; a create answers 507; the gateway stops
    while full; space is freed; after the restart each reattach gets a whole JSON history, the
    gap said (``truncated: true``), nothing torn; and new frames are written again."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "big.txt").write_text("".join(f"line {i} {'y' * 90}\n" for i in range(1500)))
    with small_tmpfs(tmp_path / "disk", 3 * MiB) as disk:
        state = disk / "state"
        fill(disk / "ballast", leave=MiB)  # the rest of the disk holds something else
        toml = tmp_path / "gateway.toml"
        toml.write_text(f'[server]\nworkspace_root = "{root}"\nstate_dir = "{state}"\n')
        env = {**os.environ, "RAWP_DEMO_DELAY_MS": "1"}
        run = ("--config", str(toml), "--log-format", "json")
        async with serve(*run, stdin=subprocess.DEVNULL, env=env) as (proc, url):
            async with aiohttp.ClientSession(base_url=url, headers=user_headers(url)) as http:
                other = await _attached(http, "other")
                await prompt_and_wait(other, "hello first")
                seen_before = other.frames[-1]["message_id"]
                filler = await _attached(http, "filler")
                for _ in range(20):  # each Read is about 300 KB of frames
                    await prompt_and_wait(filler, "read big.txt")
                    if (await http.get("/readyz")).status == 503:
                        break
                assert (await http.get("/readyz")).status == 503
                # What a cut-back gave back (the pages of a torn line) taken too: full is full.
                fill(disk / "rest")
                later = await prompt_and_wait(other, "hello while full")
                assert later[-1]["type"] == "session.usage"  # the other session goes on
                refused = await http.post("/v1/session", json={"agent": "demo"})
                assert refused.status == 507
                assert (await refused.json())["error_code"] == "INSUFFICIENT_STORAGE"
                assert len(list((state / "sessions").iterdir())) == 2
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            assert proc.stderr is not None
            stopped = proc.stderr.read().decode()
            assert "No space left on device" in stopped
        (disk / "ballast").unlink()
        (disk / "rest").unlink()
        for sid in (other.session_id, filler.session_id):
            whole_lines(state / "sessions" / sid / FRAMES)  # nothing torn on disk
        async with (
            serve(*run, stdin=subprocess.DEVNULL, env=env) as (proc, url),
            aiohttp.ClientSession(base_url=url, headers=user_headers(url)) as http,
        ):
            raw = await _reattach_raw(http, other.session_id, last_message_id=seen_before)
            history = json.loads(raw)["payload"]  # whole JSON
            assert history["buffer_status"]["truncated"] is True  # the gap is said
            assert all(isinstance(f, dict) and f["type"] for f in history["frames"])
            raw = await _reattach_raw(http, filler.session_id, history="all")
            assert json.loads(raw)["payload"]["buffer_status"]["truncated"] is True
            again = await _attach(http, other.session_id)
            await again.until("agent.commands.publish")
            after = await prompt_and_wait(again, "hello after the restart")
            log = state / "sessions" / other.session_id / FRAMES
            await eventually(
                lambda: {f["message_id"] for f in after} <= ids_on_disk(log),
                "the new frames written",
            )


async def _attached(http: aiohttp.ClientSession, name: str) -> Master:
    async with http.post("/v1/session", json={"agent": "demo", "name": name}) as resp:
        assert resp.status == 201, await resp.text()
        sid = (await resp.json())["session_id"]
    master = await _attach(http, sid)
    await master.until("agent.commands.publish")
    return master


async def _attach(http: aiohttp.ClientSession, sid: str) -> Master:
    ws = await http.ws_connect(f"/v1/session/{sid}/ws", protocols=(SUBPROTOCOL,))
    return Master(ws, sid)


async def _reattach_raw(http: aiohttp.ClientSession, sid: str, **params: str) -> str:
    """The text of the session.history a master reattaching with ``params`` is sent."""
    async with http.ws_connect(
        f"/v1/session/{sid}/ws", protocols=(SUBPROTOCOL,), params=params
    ) as ws:
        async with asyncio.timeout(20):
            while True:
                msg = await ws.receive()
                assert msg.type == aiohttp.WSMsgType.TEXT, msg
                if '"session.history"' in msg.data[:200]:
                    return msg.data
