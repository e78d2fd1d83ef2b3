"""How an agent process ends, and what goes wrong starting or feeding it: `ExitStatus` and the
pure `classify_exit()` (DPS-17.2.2), the `Agent*Error` classes `AgentProcess` raises, and
`missing_executable()`, which tells before anything is started that an agent cannot be.

Exit statuses are classified by the pure `classify_exit()`, usable by the sans-IO core: 0 is "ok",
1-127 "error", a negative return code (killed by signal N) or 128+N "signal".
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "AgentExecutableNotFound",
    "AgentProcessError",
    "AgentStartError",
    "AgentStdinFull",
    "ExitKind",
    "ExitStatus",
    "classify_exit",
    "missing_executable",
]

ExitKind = Literal["ok", "error", "signal"]


# --------------------------------------------------------------------------- exit status (pure)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExitStatus:
    """How an agent process ended, classified per DPS-17.2.2.

    `returncode` is as reported by the OS layer: negative -N when killed by signal N, else the exit
    code. `signal` is N for both "killed by N" and "exited with 128+N" (a shell or a runtime that
    re-raises as an exit code), else None.
    """

    returncode: int
    signal: int | None
    kind: ExitKind

    @property
    def signal_name(self) -> str | None:
        """`"SIGTERM"` and so on, or None when no signal was involved or the number is unknown."""
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return None

    def describe(self) -> str:
        """A short human sentence for `agent.error.message`."""
        if self.kind == "ok":
            return "agent exited normally (code 0)"
        if self.kind == "signal":
            name = self.signal_name or f"signal {self.signal}"
            if self.returncode < 0:
                return f"agent was killed by {name}"
            return f"agent exited with code {self.returncode} ({name})"
        return f"agent exited with code {self.returncode}"


def classify_exit(returncode: int) -> ExitStatus:
    """Classify a return code per DPS-17.2.2. Pure; the sans-IO core calls it too.

    0 -> ok; 1-127 -> error; -N (killed by signal N) or 128+N for a real signal number N -> signal.
    Codes above 128 that are not 128 + a signal number (128 itself, 255) are plain errors.
    """
    if returncode == 0:
        return ExitStatus(returncode=0, signal=None, kind="ok")
    if returncode < 0:
        return ExitStatus(returncode=returncode, signal=-returncode, kind="signal")
    if 128 < returncode < 128 + signal.NSIG:
        return ExitStatus(returncode=returncode, signal=returncode - 128, kind="signal")
    return ExitStatus(returncode=returncode, signal=None, kind="error")


# --------------------------------------------------------------------------- errors


class AgentProcessError(Exception):
    """Base class of the errors an agent process raises."""


class AgentStdinFull(AgentProcessError):
    """The agent has left too much of its input unread: the write was refused."""


class AgentStartError(AgentProcessError):
    """The agent could not be started (bad cwd, not executable, ...)."""


class AgentExecutableNotFound(AgentStartError, FileNotFoundError):
    """argv[0] does not name an executable file (the agent CLI is not installed or not on PATH)."""

    def __init__(self, program: str) -> None:
        super().__init__(
            errno.ENOENT,
            f"agent executable not found: {program!r} (not installed, or not on PATH)",
            program,
        )

    def __str__(self) -> str:
        # The message names the file already; OSError's own form would add "[Errno 2]" and the
        # file name a second time.
        return self.strerror or super().__str__()


def missing_executable(program: str, env: Mapping[str, str]) -> AgentExecutableNotFound | None:
    """Why ``program`` cannot be started, told before anything is created: a name that is not on
    ``env``'s PATH, or an absolute path that is not an executable file. A relative path with a
    ``/`` is the workspace's (the agent's cwd): that is left to the start itself."""
    if "{" in program or (os.sep in program and not os.path.isabs(program)):
        return None  # a template, filled in per session, or relative to the workspace
    if os.sep in program:
        found = os.path.isfile(program) and os.access(program, os.X_OK)
    else:
        found = shutil.which(program, path=env.get("PATH", os.defpath)) is not None
    return None if found else AgentExecutableNotFound(program)
