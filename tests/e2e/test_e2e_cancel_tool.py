"""Cancel stops the tool too, with the real Gemini and Codex CLIs (pinned, scripted model): the
shell a CLI starts for a tool may run in a session of its own (Gemini's does), out of reach of
signals to the agent's process group. DPS-6.1.2-cancel: the running tool is stopped as soon as
possible, and the turn ends when the CLI has exited, not when the tool would have."""

from __future__ import annotations

import pytest

from tests.support import realcli
from tests.support.gateway_peer import of
from tests.support.procs import session_processes, since_boot, started
from tests.support.waiting import eventually

pytestmark = pytest.mark.realcli

# Far longer than the cancel may take (its SIGINT, then the gateway's stop 10 s later and the 5 s
# grace): that the sleep is gone before it could have ended by itself proves it was stopped.
SLEEP_SEC = 60
SLEEP = f"sleep {SLEEP_SEC}"


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
    async with realcli.gateway(realcli.scenario(agent, CALLS[agent]), agent) as rig:
        session_id, master = await rig.master()
        await master.send("control.prompt.request", {"prompt_text": "Wait a while."})
        turn_start = await master.until("session.turn.start")
        await master.until("tool.invoke.request", timeout=60)
        sleeps = await eventually(
            lambda: session_processes(session_id, SLEEP),
            "the tool's sleep to run",
            timeout=20,
        )
        # The sleep (or the shell that runs it, which started first) cannot end by itself before
        # this moment.
        starts = [t for pid in sleeps if (t := started(pid)) is not None]
        assert starts, "the tool's sleep ended at once"
        natural_end = min(starts) + SLEEP_SEC
        await master.send(
            "control.prompt.cancel", {"target_turn_id": turn_start["payload"]["turn_id"]}
        )
        end = await master.until("session.turn.end", timeout=natural_end - since_boot())
        assert end["payload"]["stop_reason"] == "cancelled"
        # The turn did not wait for the tool, and the tool was stopped: the turn ended and the
        # sleep is gone before the sleep could have finished.
        await eventually(
            lambda: not session_processes(session_id, SLEEP),
            "the tool's sleep to be gone",
            timeout=natural_end - since_boot(),
        )
        assert since_boot() < natural_end
        assert not [f for f in master.frames if f["type"] == "agent.error"]
        frames = master.frames
        results = of(frames, "tool.invoke.result")
        assert len(results) == len(of(frames, "tool.invoke.request")) == 1
        info = await rig.info(session_id)
        assert info["state"] == "IDLE"
