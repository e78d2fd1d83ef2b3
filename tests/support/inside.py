"""Where an agent really ran, in either isolation mode (docs/isolation.md): its process under
bubblewrap in namespaces of its own (a long-lived agent, seen while it runs), or a command it ran
telling what it saw (a one-per-prompt agent, gone by the time a test could look), and what it
saved in its session's HOME. The end-to-end tests of every agent check this in both modes, so a
turn that completed outside the sandbox never passes for one inside."""

from __future__ import annotations

import os
from pathlib import Path

from gateway.session import LiveSession
from tests.support.procs import cmdline, descendants

NAMESPACES = ("pid", "user", "ipc", "uts", "mnt")
# A shell command for an agent's shell tool: "hi", then its user namespace, the name of its pid 1
# (bwrap in the sandbox) and its HOME, one a line. No $(...): Gemini CLI refuses substitutions.
PROBE = "echo hi; readlink /proc/self/ns/user; cat /proc/1/comm; printenv HOME"
# PROBE printed in one write: codex-acp reports a command whose output came in pieces without the
# first piece (docs/acp-mapping.md), and PROBE's four commands, slowed by a loaded machine, print
# in pieces.
PROBE_AT_ONCE = (
    'printf \'hi\\n%s\\n%s\\n%s\\n\' "$(readlink /proc/self/ns/user)" "$(cat /proc/1/comm)" "$HOME"'
)


def _ns(pid: int | str, name: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{name}")


def check_process(session: LiveSession, sandboxed: bool) -> None:
    """The session's live agent: in the sandbox its pid is bwrap's and every process below it
    is in other namespaces than the gateway's; without it, the agent shares the gateway's."""
    live = session.process
    assert live is not None and live.pid is not None, "the agent is running"
    assert (session.sandbox() is not None) is sandboxed
    inside = descendants(live.pid)
    if sandboxed:
        assert os.path.basename(cmdline(live.pid).split()[0]) == "bwrap"
        assert inside, "bwrap runs the agent"
        for pid in inside:
            for ns in NAMESPACES:
                assert _ns(pid, ns) != _ns("self", ns), (cmdline(pid), ns)
    else:
        assert "bwrap" not in cmdline(live.pid)
        for ns in NAMESPACES:
            assert _ns(live.pid, ns) == _ns("self", ns), ns


def check_probe(output: str, sandboxed: bool, home: Path) -> None:
    """What ``PROBE`` printed, run by the agent's shell tool: in the sandbox another user
    namespace, bwrap as pid 1; in both modes the HOME the session's agent was given."""
    lines = output.strip().splitlines()
    assert lines[0] == "hi", output
    user_ns, pid1, seen_home = lines[-3:]
    assert (user_ns != _ns("self", "user")) is sandboxed, output
    assert (pid1 == "bwrap") is sandboxed, output
    assert seen_home == str(home), output


def saved(home: Path, pattern: str) -> list[Path]:
    """The files matching ``pattern`` (a glob under ``home``): what the agent saved there."""
    return sorted(home.glob(pattern))
