"""Memory stays bounded however much an agent prints and however many sessions come and go: a
deleted session is freed whole, a burst of output never closes a master that keeps reading, and
input an agent does not read is bounded. Real server, real agent processes, real WebSockets."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import weakref
from dataclasses import replace

import pytest

from gateway.agent.exit import AgentStdinFull
from gateway.agent.process import AgentProcess
from gateway.config import ConfigError, builtin_profiles, load_config
from gateway.server import SESSIONS, TerminatedSession
from gateway.server.routes import sessions as session_routes
from tests.support.gateway_peer import (
    Master,
    create_session,
    demo_config,
    make_config,
    prompt_and_wait,
    start_gateway,
)
from tests.support.paths import HOSTILE
from tests.support.waiting import eventually


async def test_a_deleted_session_is_freed_whole_and_only_its_summary_stays(tmp_path):
    """After DELETE the session's machine, mapper, history and connections are garbage: nothing
    refers to them; the API still shows the session (its JSON, state TERMINATED)."""
    client = await start_gateway(demo_config(tmp_path))
    try:
        session = await create_session(client, name="busy")
        sid = session["session_id"]
        master = await Master.attach(client, sid)
        for _ in range(3):
            await prompt_and_wait(master, "a long answer " * 20)
        live = client.server.app[SESSIONS][sid]
        assert len(live.buffer) > 0
        refs = [weakref.ref(x) for x in (live, live.machine, live.buffer, live.machine.mapper)]
        del live
        resp = await client.delete(f"/v1/session/{sid}")
        deleted = await resp.json()
        await master.drain_until_closed()
        await master.ws.close()

        def freed() -> bool:
            gc.collect()
            return all(ref() is None for ref in refs)

        await eventually(freed, "the deleted session to be freed")
        kept = client.server.app[SESSIONS][sid]
        assert isinstance(kept, TerminatedSession)
        shown = await (await client.get(f"/v1/session/{sid}")).json()
        assert shown == kept.to_json()
        assert shown["state"] == "TERMINATED" and shown["name"] == "busy"
        assert shown["turn_index"] == deleted["turn_index"] == 3
        assert shown["connections"] == 0
        listed = (await (await client.get("/v1/sessions")).json())["sessions"]
        assert [s["session_id"] for s in listed] == [sid]
        # Still refused as an ended session, not unknown.
        resp = await client.patch(f"/v1/session/{sid}", json={"name": "again"})
        assert (resp.status, (await resp.json())["error_code"]) == (409, "SESSION_TERMINATED")
        resp = await client.delete(f"/v1/session/{sid}")
        assert resp.status == 200 and (await resp.json())["state"] == "TERMINATED"
    finally:
        await client.close()


async def test_a_20_MB_line_never_closes_masters_that_keep_reading(tmp_path):
    """A plain agent prints one 20 MB line. Two masters reading at full speed both get the
    documented cut (the first max_frame_size characters, in deltas that each fit a frame, the
    last marked text_truncated, then an OUTPUT_TRUNCATED warning), the whole turn, and are not
    closed; a master that reattaches gets it all from history."""
    plain = replace(
        builtin_profiles()["plain"], command=(sys.executable, str(HOSTILE / "big_line.py"), "20")
    )
    config = make_config(tmp_path, agents={"plain": plain})
    client = await start_gateway(config)
    try:
        session = await create_session(client, "plain")
        sid = session["session_id"]
        masters = [await Master.attach(client, sid) for _ in range(2)]
        first = masters[0].frames[-1]["message_id"] if masters[0].frames else None
        await masters[0].send("control.prompt.request", {"prompt_text": "go"})
        await asyncio.gather(*(m.until("session.usage", timeout=60) for m in masters))
        line = "0123456789abcdef" * (20 * 65536) + "\n"
        kept = line[: config.server.max_frame_size]
        for master in masters:
            assert master.ws.close_code is None and not master.ws.closed
            deltas = [f for f in master.frames if f["type"] == "agent.text.delta"]
            assert "".join(d["payload"]["text"] for d in deltas) == kept
            assert all(len(json.dumps(f).encode()) <= config.server.max_frame_size for f in deltas)
            assert deltas[-1]["metadata"]["text_truncated"] is True
            assert deltas[-1]["metadata"]["omitted_chars"] == len(line) - len(kept)
            warning = next(f for f in master.frames if f["type"] == "agent.error")["payload"]
            assert (warning["error_code"], warning["severity"]) == ("OUTPUT_TRUNCATED", "warning")
            end = next(f for f in master.frames if f["type"] == "session.turn.end")
            assert end["payload"]["stop_reason"] == "end_turn"
        # History has it: a master reattaching from before the prompt gets every frame.
        back = await Master.attach(client, sid, last_message_id=first or "unknown", announce=False)
        await back.next()  # session.capabilities
        replayed = []
        while True:  # one session.history, or several parts of one (metadata.history_part)
            history = await back.next()
            assert history["type"] == "session.history"
            replayed += [f for f in history["payload"]["frames"] if f["type"] == "agent.text.delta"]
            part = history.get("metadata") or {}
            if part.get("history_part", 1) == part.get("history_parts", 1):
                break
        assert "".join(d["payload"]["text"] for d in replayed) == kept
    finally:
        await client.close()


async def test_prompts_an_agent_does_not_read_are_bounded_and_refused_clearly(tmp_path):
    """An agent that never reads stdin: 900 KB prompts pile up in the stdin pipe until
    max_stdin_bytes, then a prompt is refused with a non-fatal session.error AGENT_STDIN_FULL
    (parent_id: the prompt) and opens no turn; the session goes on."""
    deaf = replace(
        builtin_profiles()["claude-code"],
        command=(sys.executable, str(HOSTILE / "deaf_agent.py")),
        resume_flag="",
    )
    limit = 2 * 1024 * 1024
    client = await start_gateway(
        make_config(tmp_path, agents={"deaf": deaf}, max_stdin_bytes=limit)
    )
    try:
        session = await create_session(client, "deaf")
        sid = session["session_id"]
        live = client.server.app[SESSIONS][sid]
        master = await Master.attach(client, sid)
        big = "p" * 900_000
        refused = None
        for _ in range(12):
            start = len(master.frames)
            sent = await master.send("control.prompt.request", {"prompt_text": big})
            while True:
                frame = await master.next(timeout=15)
                if frame["type"] == "session.error" or frame["type"] == "session.turn.end":
                    break
            assert live.process.stdin_backlog <= limit
            if frame["type"] == "session.error":
                refused = (sent, frame, master.frames[start:])
                break
        assert refused is not None, "the unread input grew past max_stdin_bytes"
        sent, error, frames = refused
        assert error["payload"]["error_code"] == "AGENT_STDIN_FULL"
        assert error["payload"]["fatal"] is False
        assert error["parent_id"] == sent["message_id"]
        assert "max_stdin_bytes" in error["payload"]["message"]
        # No turn was opened for it (the agent's own results outside turns only give usage).
        assert "session.turn.start" not in [f["type"] for f in frames]
        resp = await client.get(f"/v1/session/{sid}")
        assert (await resp.json())["state"] in ("IDLE", "RUNNING")
    finally:
        await client.close()


def test_max_stdin_bytes_has_a_default_a_toml_key_and_a_lower_bound(tmp_path):
    assert load_config(
        None, {"workspace_root": str(tmp_path)}, environ={}
    ).server.max_stdin_bytes == (4 * 1024 * 1024)
    path = tmp_path / "gateway.toml"
    path.write_text("[server]\nmax_stdin_bytes = 1048576\n")
    config = load_config(path, {"workspace_root": str(tmp_path)}, environ={})
    assert config.server.max_stdin_bytes == 1024 * 1024
    path.write_text("[server]\nmax_stdin_bytes = 10\n")
    with pytest.raises(ConfigError, match="max_stdin_bytes must be at least"):
        load_config(path, {"workspace_root": str(tmp_path)}, environ={})


async def test_only_the_newest_summaries_are_kept_and_the_gauge_follows(tmp_path, monkeypatch):
    """Past KEEP_TERMINATED the oldest summary is forgotten (404) and leaves the sessions gauge."""
    monkeypatch.setattr(session_routes, "KEEP_TERMINATED", 2)
    client = await start_gateway(demo_config(tmp_path))
    try:
        ids = []
        for _ in range(3):
            ids.append((await create_session(client))["session_id"])
            assert (await client.delete(f"/v1/session/{ids[-1]}")).status == 200
        assert (await client.get(f"/v1/session/{ids[0]}")).status == 404
        listed = (await (await client.get("/v1/sessions")).json())["sessions"]
        assert [s["session_id"] for s in listed] == ids[1:]
        metrics = await (await client.get("/metrics")).text()
        assert 'rawp_gateway_sessions{state="TERMINATED"} 2.0' in metrics
    finally:
        await client.close()


async def test_a_stdin_write_past_the_limit_is_refused_whole(tmp_path):
    """AgentProcess.write(limit=): an agent that reads nothing; writes go until the next would pass
    the limit, that one raises AgentStdinFull and writes nothing."""
    proc = await AgentProcess.start(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env=None,
        session_id="00000000-0000-4000-8000-000000000000",
        workspace=tmp_path,
    )
    try:
        limit = 1024 * 1024
        chunk = b"x" * 100_000
        with pytest.raises(AgentStdinFull):
            for _ in range(100):
                proc.write(chunk, limit=limit)
        backlog = proc.stdin_backlog
        assert 0 < backlog <= limit
        with pytest.raises(AgentStdinFull):
            proc.write(chunk, limit=limit)
        assert proc.stdin_backlog == backlog
        proc.write(b"x", limit=None)  # no limit: the caller's own business
    finally:
        await proc.aclose()
