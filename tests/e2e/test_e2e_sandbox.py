"""The real Claude Code CLI in both isolation modes (docs/isolation.md): a turn with tool calls
(Read, Bash, Glob) against the rig's scripted Messages API; in the sandbox the CLI finds its
credentials and base URL in its environment with a fresh HOME of the session's own, where it saves
its conversation. Every other agent's turn with a tool runs in both modes in its own end-to-end
file (tests/support/inside.py says how each is checked); the whole real-CLI suite runs in the
sandbox with ``RAWP_TEST_ISOLATION=sandbox`` (tests/support/realcli.py)."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_e2e_claude import gateway, texts, turn
from tests.support import realcli
from tests.support.gateway_peer import of
from tests.support.inside import check_process, saved
from tests.support.realcli import MODES

pytestmark = pytest.mark.realcli


@pytest.mark.parametrize("mode", MODES)
async def test_a_claude_code_turn_with_tools_where_its_isolation_says(mode):
    sandboxed = realcli.isolation(mode).sandboxed
    async with gateway(
        "parallel",
        extra_args=("--tools", "Bash,Read,Glob"),
        auto_allow=frozenset({"Read", "Glob", "Bash"}),
        isolation_mode=mode,
    ) as rig:
        session = await rig.create()
        assert session["isolation"] == ("sandbox" if sandboxed else "none")
        master = await rig.attach(session["session_id"])
        frames = await turn(master, "Look around.")
        results = {
            r["payload"]["tool_name"]: r["payload"] for r in of(frames, "tool.invoke.result")
        }
        assert {name: r["status"] for name, r in results.items()} == {
            "Read": "success",
            "Bash": "success",
            "Glob": "success",
        }
        assert "some notes" in results["Read"]["output"]
        assert "parallel-e2e" in results["Bash"]["output"]
        assert "src/a.py" in json.dumps(results["Glob"]["output"])
        assert texts(frames).endswith("Done looking.")
        # The long-lived CLI runs under bubblewrap (its pid is bwrap's), in namespaces of its own,
        # or without it in the gateway's.
        check_process(rig.session(session["session_id"]), sandboxed)
        # It saved its conversation in the HOME it was given: in the sandbox the session's own.
        home = rig.home(session["session_id"])
        assert saved(home, ".claude/projects/*/*.jsonl"), home
        if sandboxed:
            assert not saved(rig.cli.home, ".claude/projects/*/*.jsonl")
