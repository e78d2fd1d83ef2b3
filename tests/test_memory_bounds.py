"""Memory stays bounded however much an agent prints and however many sessions come and go: a
deleted session is freed whole, a burst of output never closes a master that keeps reading, and
input an agent does not read is bounded. Real server, real agent processes, real WebSockets."""

from __future__ import annotations

import asyncio
import gc
import weakref

from gateway.server import SESSIONS, TerminatedSession
from tests.gateway_peer import Master, create_session, fast_demo, make_config, start_gateway


async def prompt_and_wait(master: Master, text: str) -> list[dict]:
    start = len(master.frames)
    await master.send("control.prompt.request", {"prompt_text": text})
    await master.until("session.usage", timeout=60)
    return master.frames[start:]


async def eventually(check, what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_a_deleted_session_is_freed_whole_and_only_its_summary_stays(tmp_path):
    """After DELETE the session's machine, mapper, history and connections are garbage: nothing
    refers to them; the API still shows the session (its JSON, state TERMINATED)."""
    client = await start_gateway(make_config(tmp_path, agents={"demo": fast_demo()}))
    try:
        session = await create_session(client, name="busy")
        sid = session["session_id"]
        master = await Master.attach(client, sid)
        for _ in range(3):
            await prompt_and_wait(master, "a long answer " * 20)
        live = client.server.app[SESSIONS][sid]
        assert len(live.history) > 0
        refs = [weakref.ref(x) for x in (live, live.machine, live.history, live.machine.mapper)]
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
