"""Scenario files: what the CLI is asked to do, and what the scripted model answers, call by call.

Theory of operation
-------------------
A scenario is one small TOML file under ``tests/support/rig/scenarios/<agent>/<name>.toml``. It has three
parts, all agent-neutral except the *content* of ``calls``, which only that agent's scripted server
interprets:

``[run]``
    How to start the CLI: ``args`` (after the binary), ``env`` (added to the rig's environment),
    ``files`` (workspace files to create, path -> text, or path -> ``{ base64 = "..." }`` for a
    binary file), ``stdin`` (lines written right after
    spawn: a table is sent as one JSON line, a string as is), ``close_stdin`` ("auto": close
    after the initial lines unless an action writes to stdin or closes it later; "start": close
    after the initial lines; "never": leave it open until an action closes it), ``timeout``
    (seconds, hard limit; the process group is killed after it), ``prior`` (argument lists of
    earlier runs of the CLI in the same HOME and workspace against the same server, each run to
    its end with stdin closed, e.g. to create a session that the recorded run then
    ``--resume``s; their output is not part of the fixture), ``timed`` (true: the fixture's meta
    keeps when each stdout line arrived and each stdin line was written, ``stdout_times`` and
    ``stdin_times`` in seconds after the spawn, so that a bench can replay the run at its pace;
    only worth it when the calls are paced like a real model, with ``delay`` and ``event_delay``).

``[[run.actions]]``
    Reactions: ``on`` is when (``"start"``; ``"call"`` with ``call = N``, when the server starts
    answering scripted call N (1-based); ``"hang"``, when a hang step starts waiting, ``count``-th
    time; ``"stdout"`` with ``match = {...}``, when the ``count``-th stdout line whose JSON contains
    that subset appears), ``do`` is what (``"write"`` a ``line``; ``"signal"`` with
    ``signal = "SIGINT"``, to the CLI's process, or with ``group = true`` to its whole process
    group as a terminal or a supervisor would; ``"close_stdin"``), after ``delay`` seconds. In a
    written line a string that is exactly ``"{{a.b}}"`` is replaced by the value at that path in
    the stdout line that triggered the action (for echoing ``request_id`` and ``input`` of a
    control request).

``[[calls]]``
    The model's answers in order. A call may carry ``match = {...}``: it then answers only a request
    that fits (the server decides what the keys mean) and is skipped for others, which lets
    concurrent conversations (a background subagent) interleave. See the server module for the
    remaining keys (anthropic.py for Claude Code).

``[variants.<name>]``
    Extra recordings of the same scenario with ``args`` appended (e.g.
    ``--include-partial-messages``). The fixture of a variant is called ``<scenario>--<variant>``.

``[expect]``
    ``exit_code`` (and optionally ``signal``): what a good recording ends with. The recorder warns
    and tests fail when a run differs, so a flaky recording is noticed.

Placeholders ``{workspace}``, ``{home}`` and ``{base_url}`` are replaced in every string of
``args``, ``env``, ``stdin``, written lines and ``calls`` (tool inputs need absolute paths).
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCENARIO_ROOT = Path(__file__).resolve().parent / "scenarios"

TRIGGERS = {"start", "call", "hang", "stdout"}
DOINGS = {"write", "signal", "close_stdin"}


@dataclass
class Action:
    on: str
    do: str
    call: int | None = None
    match: dict[str, Any] | None = None
    count: int = 1
    line: Any = None
    signal: str | None = None
    delay: float = 0.0
    group: bool = False  # a signal goes to the process group, not only the CLI's pid


@dataclass
class RunSpec:
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str | dict[str, str]] = field(default_factory=dict)
    stdin: list[Any] = field(default_factory=list)
    close_stdin: str = "auto"
    timeout: float = 30.0
    actions: list[Action] = field(default_factory=list)
    prior: list[list[str]] = field(default_factory=list)
    timed: bool = False


@dataclass
class Scenario:
    name: str
    agent: str
    description: str = ""
    run: RunSpec = field(default_factory=RunSpec)
    calls: list[dict[str, Any]] = field(default_factory=list)
    variants: dict[str, list[str]] = field(default_factory=dict)
    expect: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    active_variant: str | None = None  # set on the copy variant() returns

    def variant(self, name: str | None) -> Scenario:
        """This scenario with the variant's args appended (``None``: the scenario itself)."""
        if not name:
            return self
        if name not in self.variants:
            raise KeyError(f"scenario {self.name!r} has no variant {name!r}")
        v = copy.deepcopy(self)
        v.run.args = [*v.run.args, *self.variants[name]]
        v.active_variant = name
        return v

    def fixture_names(self) -> list[tuple[str, str | None]]:
        """(fixture name, variant) for the plain run and every variant."""
        return [(self.name, None)] + [(f"{self.name}--{v}", v) for v in self.variants]


class ScenarioError(ValueError):
    pass


def _action(raw: dict[str, Any], where: str) -> Action:
    unknown = set(raw) - {"on", "do", "call", "match", "count", "line", "signal", "delay", "group"}
    if unknown:
        raise ScenarioError(f"{where}: unknown action keys {sorted(unknown)}")
    a = Action(**raw)
    if a.on not in TRIGGERS:
        raise ScenarioError(f"{where}: on must be one of {sorted(TRIGGERS)}")
    if a.do not in DOINGS:
        raise ScenarioError(f"{where}: do must be one of {sorted(DOINGS)}")
    if a.on == "call" and not a.call:
        raise ScenarioError(f"{where}: on='call' needs call = N (1-based)")
    if a.on == "stdout" and not isinstance(a.match, dict):
        raise ScenarioError(f"{where}: on='stdout' needs match = {{...}}")
    if a.do == "write" and a.line is None:
        raise ScenarioError(f"{where}: do='write' needs line")
    if a.do == "signal" and not a.signal:
        raise ScenarioError(f"{where}: do='signal' needs signal = 'SIGINT' or similar")
    return a


def parse_scenario(data: dict[str, Any], *, name: str, agent: str | None = None) -> Scenario:
    """Build a Scenario from already-parsed TOML (or an equivalent dict written in a test)."""
    data = copy.deepcopy(data)
    unknown = set(data) - {"agent", "description", "run", "calls", "variants", "expect"}
    if unknown:
        raise ScenarioError(f"{name}: unknown top-level keys {sorted(unknown)}")
    agent = data.get("agent", agent)
    if not agent:
        raise ScenarioError(f"{name}: no agent given")
    raw_run = data.get("run", {})
    unknown = set(raw_run) - {
        "args",
        "env",
        "files",
        "stdin",
        "close_stdin",
        "timeout",
        "actions",
        "prior",
        "timed",
    }
    if unknown:
        raise ScenarioError(f"{name}: unknown [run] keys {sorted(unknown)}")
    actions = [
        _action(a, f"{name}: run.actions[{i}]") for i, a in enumerate(raw_run.pop("actions", []))
    ]
    run = RunSpec(**raw_run, actions=actions)
    if run.close_stdin not in {"auto", "start", "never"}:
        raise ScenarioError(f"{name}: close_stdin must be auto, start or never")
    variants = {k: list(v.get("args", [])) for k, v in data.get("variants", {}).items()}
    return Scenario(
        name=name,
        agent=agent,
        description=data.get("description", ""),
        run=run,
        calls=list(data.get("calls", [])),
        variants=variants,
        expect=dict(data.get("expect", {})),
    )


def load_scenario(path: str | Path) -> Scenario:
    """Load one scenario file; its agent defaults to the name of the folder it is in."""
    path = Path(path)
    with path.open("rb") as f:
        data = tomllib.load(f)
    s = parse_scenario(data, name=path.stem, agent=path.parent.name)
    s.path = path
    return s


def scenario_path(agent: str, name: str) -> Path:
    return SCENARIO_ROOT / agent / f"{name}.toml"


def find_scenario(agent: str, name: str) -> Scenario:
    return load_scenario(scenario_path(agent, name))


def all_scenarios(agent: str) -> list[Scenario]:
    return [load_scenario(p) for p in sorted((SCENARIO_ROOT / agent).glob("*.toml"))]


def _strings(value: Any, change: Callable[[str], Any]) -> Any:
    """``value`` with every string inside it (in lists and tables, at any depth) changed."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, list):
        return [_strings(v, change) for v in value]
    if isinstance(value, dict):
        return {k: _strings(v, change) for k, v in value.items()}
    return value


def expand(value: Any, names: dict[str, str]) -> Any:
    """Replace ``{workspace}``-style placeholders in every string inside value."""

    def placed(text: str) -> str:
        for k, v in names.items():
            text = text.replace("{" + k + "}", v)
        return text

    return _strings(value, placed)


def _lookup(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj


def fill_from(value: Any, source: Any) -> Any:
    """Replace every string that is exactly ``{{a.b}}`` with the value at a.b in source."""

    def filled(text: str) -> Any:
        if text.startswith("{{") and text.endswith("}}"):
            return _lookup(source, text[2:-2].strip())
        return text

    return _strings(value, filled)


def contains(actual: Any, pattern: Any) -> bool:
    """Subset match: every key of a pattern dict is in actual with a matching value; a pattern
    list matches when each of its items matches some item of actual; scalars compare equal."""
    if isinstance(pattern, dict):
        return isinstance(actual, dict) and all(
            k in actual and contains(actual[k], v) for k, v in pattern.items()
        )
    if isinstance(pattern, list):
        return isinstance(actual, list) and all(
            any(contains(a, p) for a in actual) for p in pattern
        )
    return actual == pattern
