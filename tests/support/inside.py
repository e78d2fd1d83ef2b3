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
# A shell command for an agent's shell tool: "hi", then the codename of the system it sees, its
# user namespace, the name of its pid 1 (bwrap in the sandbox) and its HOME, one a line. No $(...):
# Gemini CLI refuses substitutions.
PROBE = (
    "echo hi; grep VERSION_CODENAME= /etc/os-release; readlink /proc/self/ns/user; "
    "cat /proc/1/comm; printenv HOME"
)
# PROBE printed in one write: codex-acp reports a command whose output came in pieces without the
# first piece (docs/acp-mapping.md), and PROBE's commands, slowed by a loaded machine, print in
# pieces.
PROBE_AT_ONCE = (
    "printf 'hi\\n%s\\n%s\\n%s\\n%s\\n' \"$(grep VERSION_CODENAME= /etc/os-release)\" "
    '"$(readlink /proc/self/ns/user)" "$(cat /proc/1/comm)" "$HOME"'
)


def codename(root: str | None = None) -> str:
    """The ``VERSION_CODENAME=`` line of a system's os-release: a team's (``[isolation]
    system_root``) or, without one, this machine's."""
    text = Path(root or "/", "usr/lib/os-release").read_text()
    return next(line for line in text.splitlines() if line.startswith("VERSION_CODENAME="))


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
    root = session.config.isolation.system_root
    if root is not None:  # a team's system: every program inside runs on its C library
        agents = [p for p in inside if os.path.basename(cmdline(p).split()[0]) != "bwrap"]
        assert agents, "bwrap runs the agent"
        for pid in agents:  # (bwrap's own, outside the agent's tree, is the gateway's)
            check_libc(pid, root)


def check_libc(pid: int, root: str) -> None:
    """The C library process ``pid`` runs on is the team's system's file (its inode, as mapped),
    not this machine's."""
    with open(f"/proc/{pid}/maps") as maps:
        mapped = {line.split()[4]: line.split()[5] for line in maps if "/libc.so" in line}
    what = cmdline(pid)[:200]
    assert mapped, (pid, what)
    for inode, path in mapped.items():
        assert int(inode) == os.stat(root + path).st_ino, (pid, what, path)
        assert int(inode) != os.stat(path).st_ino, (pid, what, path)


def check_probe(output: str, sandboxed: bool, home: Path, system_root: str | None = None) -> None:
    """What ``PROBE`` printed, run by the agent's shell tool: in the sandbox another user
    namespace, bwrap as pid 1; in every mode the HOME the session's agent was given and the system
    it was to see (a team's, ``system_root``, or this machine's)."""
    lines = output.strip().splitlines()
    assert lines[0] == "hi", output
    assert lines[1] == codename(system_root), output
    user_ns, pid1, seen_home = lines[-3:]
    assert (user_ns != _ns("self", "user")) is sandboxed, output
    assert (pid1 == "bwrap") is sandboxed, output
    assert seen_home == str(home), output


def saved(home: Path, pattern: str) -> list[Path]:
    """The files matching ``pattern`` (a glob under ``home``): what the agent saved there."""
    return sorted(home.glob(pattern))
