"""Cancel stops the tool too, with the real Gemini and Codex CLIs (pinned, scripted model): the
shell a CLI starts for a tool may run in a session of its own (Gemini's does), out of reach of
signals to the agent's process group. DPS-6.1.2-cancel: the running tool is stopped as soon as
possible, and the turn ends when the CLI has exited, not when the tool would have."""

from __future__ import annotations

import os
import time

import pytest

from tests.test_e2e_codex_gemini import gateway, of
from tests.test_process import eventually

pytestmark = pytest.mark.realcli

SLEEP = "sleep 20"


def sleeps_of(session_id: str) -> list[int]:
    """Live `sleep 20` processes that carry this session's RAWP_SESSION_ID."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if (
            cmdline[:2] == [b"sleep", b"20"]
            and f"RAWP_SESSION_ID={session_id}".encode() in environ
            and state not in (b"Z", b"X")
        ):
            found.append(int(name))
    return found


CALLS = {
    "gemini": [
        {"parts": [{"functionCall": {"name": "run_shell_command", "args": {"command": SLEEP}}}]},
        {"match": {"last_user_contains": "Again"}, "parts": [{"text": "Back again."}]},
    ],
    "codex": [
        {
            "output": [
                {"type": "function_call", "name": "exec_command", "arguments": {"cmd": SLEEP}}
            ]
        },
        {
            "match": {"last_user_contains": "Again"},
            "output": [{"type": "message", "text": "Back again."}],
        },
    ],
}


@pytest.mark.parametrize("agent", ["gemini", "codex"])
async def test_DPS_6_1_2_cancel_during_a_shell_tool_stops_the_tool(agent: str):
    async with gateway(agent, CALLS[agent]) as rig:
        session_id, master = await rig.master()
        await master.send("control.prompt.request", {"prompt_text": "Wait a while."})
        turn_start = await master.until("session.turn.start")
        await master.until("tool.invoke.request", timeout=60)
        assert await eventually(lambda: bool(sleeps_of(session_id)), timeout=20)
        t0 = time.monotonic()
        await master.send(
            "control.prompt.cancel", {"target_turn_id": turn_start["payload"]["turn_id"]}
        )
        end = await master.until("session.turn.end", timeout=30)
        waited = time.monotonic() - t0
        assert end["payload"]["stop_reason"] == "cancelled"
        # The turn did not wait for the tool: it ended before `sleep 20` could have, and the
        # sleep is gone (killed, not finished).
        assert waited < 15, waited
        assert await eventually(lambda: not sleeps_of(session_id), timeout=5)
        assert not [f for f in master.frames if f["type"] == "agent.error"]
        frames = master.frames
        results = of(frames, "tool.invoke.result")
        assert len(results) == len(of(frames, "tool.invoke.request")) == 1
        info = await rig.info(session_id)
        assert info["state"] == "IDLE"
