"""``[isolation]`` (docs/configuration.md, docs/isolation.md): how agents are kept apart from the
gateway and from each other, checked into an ``Isolation`` (gateway/agent/sandbox/plan.py). Every
key is checked before anything runs: a security setting is never taken and silently not applied."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import fields
from pathlib import Path as FsPath
from typing import Any, Final

from gateway.agent.sandbox import Isolation
from gateway.config.checks import ConfigError
from gateway.config.strict import Path

__all__ = [
    "ISOLATION_KEYS",
    "MAX_BINDS",
    "MAX_BIND_CHARS",
    "check_binds_apart",
    "parse_isolation",
]

# Its keys are the fields of Isolation, and their defaults Isolation's.
ISOLATION_KEYS: Final = tuple(f.name for f in fields(Isolation))
_DEFAULT: Final = Isolation()
MAX_BINDS: Final = 64  # entries of bind_ro and of bind_rw, each
MAX_BIND_CHARS: Final = 1024  # one path's length
# Bounds of the limits: below them no agent starts (node alone has a few threads and a heap of
# some hundred MiB); above them the setting bounds nothing a pod could give.
PROCESSES_RANGE: Final = (16, 1 << 20)
MEMORY_MB_RANGE: Final = (256, 1 << 24)


def parse_isolation(table: Any, locate: Callable[[Path], str]) -> Isolation:
    """``[isolation]`` checked: a ``ConfigError`` naming the line of the first thing wrong."""
    if not isinstance(table, dict):
        raise ConfigError(f"{locate(('isolation',))}: [isolation] must be a table")
    mode = table.get("mode", _DEFAULT.mode)
    if mode not in ("none", "sandbox"):
        raise ConfigError(
            f'{locate(("isolation", "mode"))}: [isolation] mode must be "none" or "sandbox", '
            f"got {mode!r}"
        )
    network = table.get("network", _DEFAULT.network)
    if network not in ("host", "none"):
        raise ConfigError(
            f'{locate(("isolation", "network"))}: [isolation] network must be "host" or "none", '
            f"got {network!r}"
        )
    return Isolation(
        mode=mode,
        network=network,
        bind_ro=_binds(table.get("bind_ro", list(_DEFAULT.bind_ro)), "bind_ro", locate),
        bind_rw=_binds(table.get("bind_rw", list(_DEFAULT.bind_rw)), "bind_rw", locate),
        max_processes=_limit(
            table.get("max_processes", _DEFAULT.max_processes),
            "max_processes",
            PROCESSES_RANGE,
            locate,
        ),
        max_memory_mb=_limit(
            table.get("max_memory_mb", _DEFAULT.max_memory_mb),
            "max_memory_mb",
            MEMORY_MB_RANGE,
            locate,
        ),
    )


def _binds(value: Any, key: str, locate: Callable[[Path], str]) -> tuple[str, ...]:
    where = locate(("isolation", key))
    if not isinstance(value, list) or len(value) > MAX_BINDS:
        raise ConfigError(f"{where}: [isolation] {key} must be a list of at most {MAX_BINDS} paths")
    out = []
    for path in value:
        if (
            not isinstance(path, str)
            or not path.startswith("/")
            or len(path) > MAX_BIND_CHARS
            or "\0" in path
        ):
            raise ConfigError(
                f"{where}: [isolation] {key} entries must be absolute paths of at most "
                f"{MAX_BIND_CHARS} characters, got {str(path)[:100]!r}"
            )
        if not os.path.exists(path):
            raise ConfigError(f"{where}: [isolation] {key}: {path} does not exist")
        normal = os.path.normpath(path)
        if normal == "/":
            raise ConfigError(f"{where}: [isolation] {key}: / would show the whole machine")
        out.append(normal)
    return tuple(out)


def _limit(value: Any, key: str, bounds: tuple[int, int], locate: Callable[[Path], str]) -> int:
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(
            f"{locate(('isolation', key))}: [isolation] {key} must be an integer from {low} "
            f"to {high}, got {value!r}"
        )
    return value


def check_binds_apart(isolation: Isolation, hidden: Iterable[FsPath]) -> None:
    """A bind that is, or is inside, something the gateway hides (its state dir, the workspace
    root, a file it read a secret from) would show it again: refused."""
    for key in ("bind_ro", "bind_rw"):
        for path in getattr(isolation, key):
            for secret in hidden:
                top = os.path.abspath(secret)
                if path == top or path.startswith(top.rstrip("/") + "/"):
                    raise ConfigError(
                        f"[isolation] {key}: {path} would show {top}, which the agent must not "
                        "see (the state dir, the workspace root or a file the gateway reads)"
                    )
