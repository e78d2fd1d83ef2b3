"""A stopping gateway does not wait on a master that stopped reading.

Container engines send SIGTERM and, 10 s later by default, SIGKILL (``docker stop``, ``podman
stop``); a gateway killed mid-suspend leaves its sessions as after a crash. A master that is
attached but reads nothing (a frozen laptop, a stalled proxy) never answers the close frame, and
its socket may be too full to take it: the gateway must give up on it within the close timeout
(``CLOSE_TIMEOUT_SEC``, docs/limits.md) and still suspend every session cleanly.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp

from gateway.storage.state_dir import RECORD
from tests.support.serve_process import serve, stalled_master
from tests.support.servers import user_headers

ENGINE_STOP_TIMEOUT_SEC = 10.0  # docker stop / podman stop, before SIGKILL


async def info(http: aiohttp.ClientSession, url: str, session_id: str) -> dict:
    return await (await http.get(f"{url}/v1/session/{session_id}")).json()


async def test_sigterm_with_a_master_that_reads_nothing_exits_in_bounded_time(tmp_path):
    """One turn's answer (a 60 KB file read) is written towards a master that never reads and
    holds a 4 KB window; then SIGTERM. The gateway exits 0 before an engine's SIGKILL, and the
    session is saved as a clean stop."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "big.txt").write_text("x" * 60_000 + "\n")
    state = tmp_path / "state"
    args = ("--workspace-root", str(workspace), "--state-dir", str(state))
    async with (
        serve(*args) as (proc, url),
        aiohttp.ClientSession(headers=user_headers(url)) as http,
    ):
        resp = await http.post(f"{url}/v1/session", json={"agent": "demo"})
        assert resp.status == 201, await resp.text()
        session_id = (await resp.json())["session_id"]
        sock = stalled_master(url, session_id, "read big.txt")
        try:
            async with asyncio.timeout(30):
                while (await info(http, url, session_id))["turn_index"] < 1:
                    await asyncio.sleep(0.05)
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            # Past this an engine would have SIGKILLed it (TimeoutExpired fails the test).
            code = await asyncio.to_thread(proc.wait, ENGINE_STOP_TIMEOUT_SEC)
            print(f"stopped {time.monotonic() - started:.1f} s after SIGTERM")
        finally:
            sock.close()
    assert code == 0
    record = json.loads((state / "sessions" / session_id / RECORD).read_text())
    assert record["clean"] is True
