"""A recorded agent fixture (``tests/fixtures/<agent>/*.jsonl`` and its ``.meta.json``) played
into a session machine the way the shell would, and what came of it: the fixture's lines, its
recorded exit and the frames the machine emitted."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.protocol import frames as F
from gateway.protocol.actions import Action, Emit
from gateway.protocol.machine import SessionMachine


@dataclass
class Run:
    agent: str
    name: str
    lines: list[dict[str, Any]]
    meta: dict[str, Any]
    frames: list[F.Frame] = field(default_factory=list)

    def of(self, *types: str) -> list[F.Frame]:
        return [f for f in self.frames if f.TYPE in types]

    def payloads(self, *types: str) -> list[Any]:
        return [f.payload for f in self.of(*types)]  # type: ignore[attr-defined]

    def kinds(self, kind: str, subtype: str | None = None) -> list[dict[str, Any]]:
        """The fixture's lines of one ``type`` (and ``subtype``, if given)."""
        return [
            o
            for o in self.lines
            if o.get("type") == kind and (subtype is None or o.get("subtype") == subtype)
        ]


def play(
    path: Path,
    machine: SessionMachine,
    started: list[Action],
    exited: Callable[[dict[str, Any]], list[Action]],
) -> Run:
    """Drive ``machine`` with the fixture: ``started`` (what starting it did), every stdout line,
    stdout closing, then the recorded exit as ``exited`` (given the fixture's meta) reports it to
    the machine; collect what it emits."""
    raw = path.read_bytes().splitlines()
    meta = json.loads(path.with_suffix(".meta.json").read_text())
    run = Run(path.parent.name, path.stem, [json.loads(line) for line in raw if line.strip()], meta)
    actions = list(started)
    for line in raw:
        actions += machine.agent_line(line)
    actions += machine.agent_stdout_closed()
    actions += exited(meta)
    run.frames = [a.frame for a in actions if isinstance(a, Emit)]
    return run
