"""The built-in ``demo`` and ``plain`` agents end to end, in both isolation modes, configured as the
README says a user does: only ``[isolation] mode``, no ``bind_ro``. Both run on the gateway's own
Python, here a venv in this checkout on an interpreter under root's 0700 HOME with the gateway
installed editable: in the sandbox the gateway shows them exactly what that needs, read-only (the
venv, the interpreter's installation, the package ``-m`` names), never the rest of the checkout or
the state dir (docs/isolation.md, "The gateway's own Python")."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import gateway
from gateway.agent.profiles import builtin_profiles
from gateway.agent.sandbox import Isolation
from gateway.agent.sandbox.spawn import runtime
from gateway.server import SESSIONS
from tests.support import gateway_peer as peer
from tests.support.inside import check_probe, check_process
from tests.support.paths import REPO
from tests.support.procs import descendants

MODES = ["none", pytest.param("sandbox", marks=pytest.mark.sandbox)]


def seen_from(pid: int, path: Path | str) -> Path:
    """``path`` as the process ``pid`` sees it (through its own mount namespace)."""
    return Path("/proc", str(pid), "root", str(path).lstrip("/"))


@pytest.mark.parametrize("mode", MODES)
async def test_a_demo_turn_writes_a_file_where_its_isolation_says(tmp_path, mode):
    """A demo session from a README-like config: a turn with a Write the master allows, and the
    file in the workspace. In the sandbox the demo runs under bubblewrap and sees the gateway's
    package but nothing else of its checkout, nor the state dir."""
    root, state = tmp_path / "root", tmp_path / "state"
    (root / "ws").mkdir(parents=True)
    config = peer.make_config(root, state_dir=state, isolation=Isolation(mode=mode))
    gw = await peer.start_gateway(config)
    try:
        sid = (await peer.create_session(gw, "demo", workspace_path="ws"))["session_id"]
        master = await peer.Master.attach(gw, sid)
        await master.send("control.prompt.request", {"prompt_text": "write notes.txt"})
        ask = await master.until("agent.interaction.request", timeout=60)
        assert ask["payload"]["interaction_type"] == "PERMISSION"
        await master.send(
            "control.interaction.response",
            {"interaction_id": ask["payload"]["interaction_id"], "selected_value": "allow"},
        )
        await master.until("session.turn.end", timeout=60)
        (result,) = peer.of(master.frames, "tool.invoke.result")
        assert (result["payload"]["tool_name"], result["payload"]["status"]) == ("Write", "success")
        assert (root / "ws" / "notes.txt").is_file()

        session = gw.server.app[SESSIONS][sid]
        check_process(session, mode == "sandbox")
        if mode == "sandbox":
            demo = descendants(session.process.pid)[-1]
            package = Path(gateway.__file__).parent
            assert seen_from(demo, package / "agent" / "demo" / "agent.py").is_file()
            assert seen_from(demo, sys.prefix).is_dir()
            for hidden in (REPO / "pyproject.toml", REPO / "tests", REPO / ".git"):
                assert not os.path.lexists(seen_from(demo, hidden)), hidden
            # Of the state dir, only the way to the session's own HOME (bound there).
            home = Path(session.sandbox().home)
            assert (state / "sessions" / sid).is_dir() and home.is_relative_to(state)
            for seen in seen_from(demo, state).rglob("*"):
                path = Path("/") / seen.relative_to(seen_from(demo, "/"))
                assert path in home.parents or path.is_relative_to(home), path
    finally:
        await gw.close()


# A plain program on the gateway's Python that prints what PROBE prints (tests/support/inside.py).
PLAIN_PROBE = (
    "import os, sys; print(sys.argv[1]);"
    " print(next(l.strip() for l in open('/etc/os-release') if l.startswith('VERSION_CODENAME=')));"
    " print(os.readlink('/proc/self/ns/user'));"
    " print(open('/proc/1/comm').read().strip()); print(os.environ['HOME'])"
)


@pytest.mark.parametrize("mode", MODES)
async def test_a_plain_turn_runs_where_its_isolation_says(tmp_path, mode):
    """The plain profile wrapping a program on the gateway's Python, as its example does: its
    lines are the turn's text, and they say where it ran (bwrap as pid 1, another user namespace
    and the session's HOME in the sandbox)."""
    plain = builtin_profiles()["plain"]
    profile = replace(plain, command=(sys.executable, "-c", PLAIN_PROBE, "{prompt}"))
    config = peer.make_config(tmp_path, agents={"plain": profile}, isolation=Isolation(mode=mode))
    gw = await peer.start_gateway(config)
    try:
        sid = (await peer.create_session(gw, "plain"))["session_id"]
        master = await peer.Master.attach(gw, sid)
        frames = await peer.prompt_and_wait(master, "hi")
        text = "".join(f["payload"]["full_text"] for f in peer.of(frames, "agent.text.done"))
        box = gw.server.app[SESSIONS][sid].sandbox()
        home = Path(box.home) if box is not None else Path(os.environ["HOME"])
        check_probe(text, mode == "sandbox", home)
    finally:
        await gw.close()


def test_only_the_gateways_own_python_gets_its_runtime_shown():
    """What the shell hands the plan (gateway/agent/sandbox/spawn.py, ``runtime``): for the demo's
    command the venv, the installation and the gateway package; for a plain program on the same
    Python no package; for any other agent nothing."""
    package = str(Path(gateway.__file__).parent)
    demo = runtime([sys.executable, "-m", "gateway.demo_agent"])
    assert {sys.prefix, sys.base_prefix, package} <= set(demo)
    assert str(REPO) not in demo
    assert package not in runtime([sys.executable, "-c", "print(1)"])
    assert runtime(["claude", "-p"]) == ()
