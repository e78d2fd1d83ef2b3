"""``rawp-gateway serve`` as users run it (uvloop, a real process) with a hostile single-turn agent
whose descendant leaves its session, puts fds 0-2 on /dev/null and ignores SIGTERM: the agent's
exit ends each turn (the descendant holds no pipe of the agent: it got fds 0-2 only), the next
prompt is taken, the descendant is gone, and SIGTERM stops the gateway."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import aiohttp

from tests.support.gateway_peer import of, prompt_and_wait
from tests.support.loops import HOSTILE
from tests.support.procs import gone
from tests.support.serve_process import attached, serve
from tests.support.servers import user_headers
from tests.support.waiting import eventually


async def test_serve_ends_turns_at_the_agents_exit_and_leaves_no_descendant(tmp_path):
    config = tmp_path / "gateway.toml"
    command = [sys.executable, HOSTILE, "devnull", "--ignore-term", "{prompt}"]
    config.write_text(
        "[server]\nshutdown_grace_sec = 1\n"
        f'[agents.hostile]\nparser = "plain"\nsingle_turn_process = true\n'
        f"command = {json.dumps(command)}\n"
    )
    workspace = tmp_path / "ws"
    workspace.mkdir()
    args = ("--config", str(config), "--workspace-root", str(workspace))
    async with serve(*args) as (proc, url):
        async with aiohttp.ClientSession(headers=user_headers(url)) as http:
            master = await attached(http, url, "hostile")
            for text in ("first", "second"):
                frames = await prompt_and_wait(master, text, timeout=15)
                assert not of(frames, "session.error"), frames
                (end,) = of(frames, "session.turn.end")
                assert end["payload"]["stop_reason"] == "end_turn"
                descendant = int((workspace / "descendant.pid").read_text())
                await eventually(
                    lambda d=descendant: gone(d), "the descendant to be reaped", timeout=10
                )
            await master.ws.close()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 20) == 0
    assert not os.path.exists(f"/proc/{proc.pid}")
