"""``rawp-gateway translate``: an agent's recorded stdout in, the DPS frames a master would get out.

The same parser and session machine as the server, with no process, socket or prompt: turns open
when the agent's output starts one, and the end of the input stands for the process exiting with
``--exit-code`` (0 by default; DPS-17.2.2 decides what a non-zero code adds). The output is what a
master that announced every feature receives from the session's first frame on, one JSON frame per
line and nothing else; diagnostics go to stderr.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterable
from typing import BinaryIO, TextIO

from parsers.base import NoInput
from parsers.base import get as get_parser

from .config import builtin_profiles
from .process import classify_exit
from .protocol import codec
from .protocol import session as sm
from .protocol.capabilities import ALL_FEATURES

__all__ = ["translate"]


def translate(
    lines: Iterable[bytes],
    out: BinaryIO,
    *,
    agent: str = "claude-code",
    session_id: str | None = None,
    exit_code: int = 0,
    err: TextIO = sys.stderr,
    forward_unknown: bool = False,
) -> int:
    """Write the frames for ``lines``; returns how many lines could not be parsed."""
    profile = builtin_profiles().get(agent)
    features = profile.features if profile is not None else ALL_FEATURES
    parser_name = profile.parser if profile is not None else agent
    spec = get_parser(parser_name)
    machine = sm.SessionMachine(
        session_id or str(uuid.uuid4()),
        spec.parser(),
        NoInput(),
        sm.SessionConfig(agent=agent, features=features, forward_unknown=forward_unknown),
    )
    bad = 0

    def emit(actions: list[sm.Action]) -> None:
        nonlocal bad
        for action in actions:
            if isinstance(action, sm.Emit) and action.to is None:
                out.write(codec.encode(action.frame) + b"\n")
            elif isinstance(action, sm.Log):
                if action.level in ("warning", "error"):
                    bad += 1
                fields = " ".join(f"{k}={v}" for k, v in action.fields.items())
                print(f"translate: {action.message} {fields}".rstrip(), file=err)

    out.write(codec.encode(machine.capabilities_frame) + b"\n")
    for line in lines:
        line = line.rstrip(b"\r\n")
        if line:
            emit(machine.agent_line(line))
    emit(machine.agent_stdout_closed())
    status = classify_exit(exit_code)
    emit(machine.agent_exited(status.kind, status.returncode, status.signal))
    return bad
