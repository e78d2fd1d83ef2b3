"""``[isolation]`` (docs/configuration.md, docs/isolation.md): how agents are kept apart from the
gateway and from each other, read into an ``Isolation`` (gateway/agent/sandbox/plan.py), whose
fields declare the keys (gateway/config/settings.py). Every key is checked before anything runs:
a security setting is never taken and silently not applied. Each error names the key's line.

What the declarations cannot check is checked here after the build: that each bind exists and is
not ``/`` (they look at the disk), and that no bind shows what the gateway hides (that needs the
other sections: ``check_binds_apart``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path as FsPath
from typing import Any, Final

from gateway.agent.sandbox import Isolation
from gateway.config.checks import ConfigError
from gateway.config.settings import build, declared, file_values
from gateway.config.strict import Path

__all__ = ["ISOLATION_KEYS", "check_binds_apart", "parse_isolation"]

ISOLATION_KEYS: Final = tuple(declared(Isolation))
_BINDS: Final = ("bind_ro", "bind_rw")


def parse_isolation(table: Any, locate: Callable[[Path], str]) -> Isolation:
    """``[isolation]`` checked: a ``ConfigError`` naming the line of the first thing wrong."""
    if not isinstance(table, dict):
        raise ConfigError(f"{locate(('isolation',))}: [isolation] must be a table")

    def where(key: str) -> str:
        return f"{locate(('isolation', key))}: [isolation] "

    isolation: Isolation = build(Isolation, file_values(Isolation, table, where), where)
    if isolation.system_root is not None and not isolation.sandboxed:
        raise ConfigError(
            f'{where("system_root")}system_root needs mode = "sandbox": the agent\'s system is '
            "shown to it by the sandbox"
        )
    if isolation.path is not None and isolation.system_root is None:
        raise ConfigError(
            f"{where('path')}path is the agent's PATH in system_root's system: set system_root"
        )
    return replace(
        isolation,
        bind_ro=_on_disk(isolation.bind_ro, where("bind_ro") + "bind_ro"),
        bind_rw=_on_disk(isolation.bind_rw, where("bind_rw") + "bind_rw"),
    )


def _on_disk(paths: tuple[str, ...], what: str) -> tuple[str, ...]:
    """Each path exists and is not the whole machine; normalised."""
    out = []
    for path in paths:
        if not os.path.exists(path):
            raise ConfigError(f"{what}: {path} does not exist")
        normal = os.path.normpath(path)
        if normal == "/":
            raise ConfigError(f"{what}: / would show the whole machine")
        out.append(normal)
    return tuple(out)


def check_binds_apart(isolation: Isolation, hidden: Iterable[FsPath]) -> None:
    """A bind that is, or is inside, something the gateway hides (its state dir, the workspace
    root, a file it read a secret from) would show it again: refused. So would a ``system_root``
    that holds one, or is inside one: no mask is made in a team's system."""
    hidden = list(hidden)
    root = isolation.system_root
    if root is not None:
        for secret in hidden:
            top = os.path.abspath(secret)
            if _inside(top, root) or _inside(root, top):
                raise ConfigError(
                    f"[isolation] system_root: {root} would show {top}, which the agent must not "
                    "see (the state dir, the workspace root or a file the gateway reads)"
                )
    for key in _BINDS:
        for path in getattr(isolation, key):
            for secret in hidden:
                top = os.path.abspath(secret)
                if _inside(path, top):
                    raise ConfigError(
                        f"[isolation] {key}: {path} would show {top}, which the agent must not "
                        "see (the state dir, the workspace root or a file the gateway reads)"
                    )


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")
