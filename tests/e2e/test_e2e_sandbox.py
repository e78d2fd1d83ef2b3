"""The real Claude Code CLI in the agent sandbox (docs/isolation.md): a turn with tool calls (Read,
Bash, Glob) against the rig's scripted Messages API, the CLI finding its credentials and base URL
in its environment with a fresh HOME of the session's own, where it saves its conversation. The
whole real-CLI suite runs in the sandbox with ``RAWP_TEST_ISOLATION=sandbox``
(tests/support/realcli.py); these run there always."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.e2e.test_e2e_claude import gateway, texts, turn
from tests.support.gateway_peer import of
from tests.support.procs import cmdline, descendants

pytestmark = [pytest.mark.realcli, pytest.mark.sandbox]


async def test_a_claude_code_turn_with_tools_in_the_sandbox():
    async with gateway(
        "parallel",
        extra_args=("--tools", "Bash,Read,Glob"),
        auto_allow=frozenset({"Read", "Glob", "Bash"}),
        isolation_mode="sandbox",
    ) as rig:
        session = await rig.create()
        assert session["isolation"] == "sandbox"
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
        # The long-lived CLI runs under bubblewrap (its pid is bwrap's), in namespaces of its own.
        live = rig.session(session["session_id"]).process
        assert live is not None and "bwrap" in cmdline(live.pid).split()[0]
        inside = descendants(live.pid)
        assert inside
        for ns in ("pid", "user", "ipc", "uts", "mnt"):
            assert os.readlink(f"/proc/{inside[-1]}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")
        # It ran with the session's own HOME, and saved its conversation there, not in the rig's.
        box = rig.session(session["session_id"]).sandbox()
        assert box is not None
        saved = list((Path(box.home) / ".claude" / "projects").glob("*/*.jsonl"))
        assert saved, "the CLI saved its conversation in the session's HOME"
        assert not list((rig.cli.home / ".claude").glob("projects/*/*.jsonl"))
