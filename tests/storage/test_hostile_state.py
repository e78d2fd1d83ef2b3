"""The state directory is hostile input (docs/persistence.md, "Untrusted state"): the agent runs as
the gateway's user and can write there. Each test plants one thing an agent could leave (a record
naming a workspace outside the root, a symlink at a temporary name, a linked session directory, a
FIFO, a sparse or huge log), then checks that nothing outside changed and that the gateway
answered in bounded time (and memory). Real servers, real agent processes, real signals."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import tracemalloc
import uuid
from pathlib import Path

import aiohttp

from gateway.server import SESSIONS
from gateway.storage.state_dir import FRAMES, RECORD, StateDir
from tests.support.gateway_peer import create_session, fast_demo, make_config, start_gateway
from tests.support.serve_process import serve
from tests.support.servers import user_headers


def config(root: Path, state: Path, **kw):
    return make_config(root, agents={"demo": fast_demo()}, state_dir=state, **kw)


def session_dir(state: Path, session_id: str) -> Path:
    return state / "sessions" / session_id


def snapshot(top: Path) -> dict[str, str]:
    """Everything under ``top``, links not followed: what each entry is and holds."""
    seen: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            key = str(path.relative_to(top))
            if path.is_symlink():
                seen[key] = f"-> {os.readlink(path)}"
            elif path.is_dir():
                seen[key] = "dir"
            else:
                seen[key] = path.read_bytes().hex()
    return seen


def layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The workspace root, the state directory beside it (as deployed), and a directory outside
    both holding a file the agent must not be able to get the gateway to touch."""
    root, state, outside = tmp_path / "root", tmp_path / "state", tmp_path / "outside"
    (root / "ws").mkdir(parents=True)
    outside.mkdir()
    (outside / "victim.txt").write_bytes(b"precious\n")
    return root, state, outside


async def started(cfg):
    return await asyncio.wait_for(start_gateway(cfg), 20)


async def upload(gw, sid: str, name: str, data: bytes) -> None:
    """A text file uploaded to the session (it must be taken: 201)."""
    put = await gw.put(
        f"/v1/session/{sid}/files", params={"name": name}, data=data,
        headers={"Content-Type": "text/plain"},
    )  # fmt: skip
    assert put.status == 201, await put.text()


async def metrics_text(gw) -> str:
    return await (await gw.get("/metrics")).text()


def edit_record(state: Path, sid: str, **changes) -> None:
    path = session_dir(state, sid) / RECORD
    record = json.loads(path.read_text())
    record.update(changes)
    path.write_text(json.dumps(record))


# --- restored sessions ---------------------------------------------------------------------------


async def test_a_restored_session_must_resolve_inside_the_workspace_root(tmp_path, caplog):
    """Records naming ``ws/../../outside`` and a symlink inside the root that leads out are skipped
    (the check of POST /v1/session, symlinks followed), logged and counted; the third session,
    untouched, is restored."""
    root, state, outside = layout(tmp_path)
    (root / "link").symlink_to(outside)
    gw = await started(config(root, state))
    sids = [(await create_session(gw, workspace_path="ws"))["session_id"] for _ in range(3)]
    await gw.close()
    edit_record(state, sids[0], workspace_path=str(root / "ws" / ".." / ".." / "outside"))
    edit_record(state, sids[1], workspace_path=str(root / "link"))
    before = snapshot(outside)

    gw = await started(config(root, state))
    try:
        listed = (await (await gw.get("/v1/sessions")).json())["sessions"]
        assert [s["session_id"] for s in listed] == [sids[2]]
        metrics = await metrics_text(gw)
        assert 'rawp_gateway_sessions_restored_total{result="workspace"} 2.0' in metrics
        skipped = [r for r in caplog.records if r.getMessage().startswith("saved session skipped")]
        assert {r.session for r in skipped} == {sids[0], sids[1]}
        assert all("inside the workspace root" in r.getMessage() for r in skipped)
    finally:
        await gw.close()
    assert snapshot(outside) == before


# --- links in the state directory ------------------------------------------------------------------


async def test_planted_temporary_file_links_are_never_written_through(tmp_path):
    """Symlinks to an outside file at every name a rewrite could use for its temporary file
    (record and file index): a rename and an upload still work, and the outside file keeps its
    bytes."""
    root, state, outside = layout(tmp_path)
    gw = await started(config(root, state))
    try:
        sid = (await create_session(gw))["session_id"]
        await upload(gw, sid, "a.txt", b"one")
        d = session_dir(state, sid)
        for name in ("session.json.tmp", ".session.json.tmp"):
            (d / name).symlink_to(outside / "victim.txt")
        for name in ("index.json.tmp", ".index.json.tmp"):
            (d / "files" / name).symlink_to(outside / "victim.txt")
        before = snapshot(outside)
        renamed = await asyncio.wait_for(gw.patch(f"/v1/session/{sid}", json={"name": "new"}), 10)
        assert renamed.status == 200
        await upload(gw, sid, "b.txt", b"two")
        assert json.loads((d / RECORD).read_text())["name"] == "new"
        index = json.loads((d / "files" / "index.json").read_text())
        assert sorted(f["file_name"] for f in index) == ["a.txt", "b.txt"]
        assert snapshot(outside) == before
    finally:
        await gw.close()
    assert snapshot(outside) == before


async def test_a_frame_log_that_is_a_symlink_is_not_appended_to(tmp_path, caplog):
    """frames.log replaced by a symlink to an outside file while the gateway was stopped: the
    session is skipped at start (logged, counted), and no frame reaches the outside file, nor is
    the link deleted."""
    root, state, outside = layout(tmp_path)
    gw = await started(config(root, state))
    sid = (await create_session(gw))["session_id"]
    await gw.close()
    log = session_dir(state, sid) / FRAMES
    log.unlink(missing_ok=True)
    log.symlink_to(outside / "victim.txt")
    before = snapshot(outside)
    gw = await started(config(root, state))
    try:
        assert (await gw.get(f"/v1/session/{sid}")).status == 404
        assert 'rawp_gateway_sessions_restored_total{result="unreadable"} 1.0' in (
            await metrics_text(gw)
        )
        assert (await create_session(gw))["state"] == "DETACHED"  # the gateway goes on
    finally:
        await gw.close()
    assert snapshot(outside) == before
    assert log.is_symlink()


async def test_delete_never_removes_through_a_symlinked_session_directory(tmp_path, caplog):
    """The agent moved a live session's directory away and put a symlink to an outside directory
    (with a files/ of its own) in its place: DELETE answers, and nothing outside is removed."""
    root, state, outside = layout(tmp_path)
    (outside / "files").mkdir()
    (outside / "files" / "keep.txt").write_bytes(b"keep\n")
    (outside / RECORD).write_text("{}")
    gw = await started(config(root, state))
    try:
        sid = (await create_session(gw))["session_id"]
        await upload(gw, sid, "a.txt", b"one")
        d = session_dir(state, sid)
        d.rename(state / "moved")
        d.symlink_to(outside)
        before = snapshot(outside)
        caplog.set_level(logging.WARNING, logger="rawp_gateway.persistence")
        deleted = await asyncio.wait_for(gw.delete(f"/v1/session/{sid}"), 20)
        assert deleted.status == 200
        assert snapshot(outside) == before
        assert d.is_symlink()  # refused and left for a person to look at, never followed
        assert any(
            r.getMessage().startswith("session directory not removed") for r in caplog.records
        )
    finally:
        await gw.close()


async def test_entries_of_sessions_that_are_links_or_files_are_skipped_and_kept(tmp_path):
    """sessions/<id> a symlink to a real session directory moved outside, a plain file and a FIFO:
    none is restored (each counted), none is followed, written or removed, at start or at stop."""
    root, state, outside = layout(tmp_path)
    gw = await started(config(root, state))
    sid = (await create_session(gw))["session_id"]
    await gw.close()
    session_dir(state, sid).rename(outside / sid)
    session_dir(state, sid).symlink_to(outside / sid)
    (state / "sessions" / "stray").write_text("x")
    os.mkfifo(state / "sessions" / str(uuid.uuid4()))
    before = snapshot(outside)
    gw = await started(config(root, state))
    try:
        assert (await (await gw.get("/v1/sessions")).json())["sessions"] == []
        assert 'rawp_gateway_sessions_restored_total{result="corrupt"} 3.0' in (
            await metrics_text(gw)
        )
    finally:
        await gw.close()
    assert snapshot(outside) == before
    assert session_dir(state, sid).is_symlink() and (state / "sessions" / "stray").exists()


# --- planted files ---------------------------------------------------------------------------------


async def test_huge_or_sparse_logs_are_refused_before_they_are_read(tmp_path):
    """A 1 GiB sparse frames.log and one 100 MB line: both larger than the session's history
    could leave (max_log_bytes of its 8 MiB buffer), so neither is read: the start takes little
    memory (tracemalloc) and time; the sessions are skipped as corrupt, their files left."""
    root, state, _ = layout(tmp_path)
    gw = await started(config(root, state))
    sparse, long = [(await create_session(gw))["session_id"] for _ in range(2)]
    good = (await create_session(gw))["session_id"]
    await gw.close()
    with open(session_dir(state, sparse) / FRAMES, "ab") as f:
        f.truncate(1 << 30)
    with open(session_dir(state, long) / FRAMES, "ab") as f:
        f.write(b'7 m {"x":"')
        chunk = b"x" * (1 << 20)
        for _ in range(100):
            f.write(chunk)
        f.write(b'"}\n')
    tracemalloc.start()
    try:
        gw = await started(config(root, state))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    try:
        assert peak < 32 * 1024 * 1024, f"peak {peak} bytes"
        listed = (await (await gw.get("/v1/sessions")).json())["sessions"]
        assert [s["session_id"] for s in listed] == [good]
        assert 'rawp_gateway_sessions_restored_total{result="corrupt"} 2.0' in (
            await metrics_text(gw)
        )
    finally:
        await gw.close()
    assert (session_dir(state, sparse) / FRAMES).stat().st_size == 1 << 30


async def test_a_fifo_in_the_state_directory_neither_hangs_the_start_nor_sigterm(tmp_path):
    """``rawp-gateway serve`` with a FIFO as one session's session.json and another's frames.log:
    it listens within bounded time (both skipped as unreadable, the FIFOs left as they are) and
    stops on SIGTERM."""
    root, state, _ = layout(tmp_path)
    gw = await started(config(root, state))
    fifo_record, fifo_log = [(await create_session(gw))["session_id"] for _ in range(2)]
    await gw.close()
    (session_dir(state, fifo_record) / RECORD).unlink()
    os.mkfifo(session_dir(state, fifo_record) / RECORD)
    (session_dir(state, fifo_log) / FRAMES).unlink(missing_ok=True)
    os.mkfifo(session_dir(state, fifo_log) / FRAMES)
    toml = tmp_path / "gateway.toml"
    toml.write_text(f'[server]\nworkspace_root = "{root}"\nstate_dir = "{state}"\n')
    async with serve("--config", str(toml), stdin=subprocess.DEVNULL) as (proc, url):
        async with aiohttp.ClientSession(headers=user_headers(url)) as http:
            async with http.get(url + "/v1/sessions") as resp:
                assert (await resp.json())["sessions"] == []
            async with http.get(url + "/metrics") as resp:
                text = await resp.text()
        assert 'rawp_gateway_sessions_restored_total{result="unreadable"} 2.0' in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert proc.stderr is not None
    proc.stderr.close()
    assert (session_dir(state, fifo_log) / FRAMES).is_fifo()


async def test_sessions_are_restored_one_at_a_time(tmp_path):
    """The loader reads a session's files only when it is that session's turn: while the first
    is being restored, the second's log has not been read (it is replaced meanwhile, and the
    replacement is what is restored)."""
    root, state, _ = layout(tmp_path)
    gw = await started(config(root, state))
    first = (await create_session(gw, name="first"))["session_id"]
    second = (await create_session(gw, name="second"))["session_id"]
    await gw.close()
    edit_record(state, first, created_at="2026-01-01T00:00:00Z")
    edit_record(state, second, created_at="2026-01-02T00:00:00Z")
    sd = StateDir(state)
    try:
        loading = sd.load()
        got = next(loading)
        assert got.record["session_id"] == first
        edit_record(state, second, name="changed after the first was read")
        got.saved.release()
        got = next(loading)
        assert got.record["name"] == "changed after the first was read"
        got.saved.release()
        assert next(loading, None) is None
    finally:
        sd.close()
    gw = await started(config(root, state))
    try:
        assert set(gw.server.app[SESSIONS]) == {first, second}
    finally:
        await gw.close()


def descriptors_under(top: Path) -> list[str]:
    """This process's open descriptors on anything under ``top``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target == str(top) or target.startswith(f"{top}/"):
            found.append(target)
    return found


async def test_session_directories_hold_descriptors_only_while_the_session_lives(tmp_path):
    """Each session holds descriptors of its directory (that is how nothing in it is reached
    through a link); deleting sessions, restoring them, skipping one and stopping the gateway
    leave none behind."""
    root, state, _ = layout(tmp_path)
    gw = await started(config(root, state))
    sids = [(await create_session(gw))["session_id"] for _ in range(4)]
    for sid in sids:
        await upload(gw, sid, "a.txt", b"one")
    assert descriptors_under(state / "sessions")
    for sid in sids[:2]:
        assert (await gw.delete(f"/v1/session/{sid}")).status == 200
    await gw.close()
    assert descriptors_under(state) == []
    edit_record(state, sids[2], agent="gone")  # skipped at the next start
    gw = await started(config(root, state))
    assert set(gw.server.app[SESSIONS]) == {sids[3]}
    await gw.close()
    assert descriptors_under(state) == []
