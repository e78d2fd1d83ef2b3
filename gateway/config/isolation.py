"""``[isolation]`` (docs/configuration.md): how agents are kept apart from the gateway and from each
other. This version runs every agent as the gateway does (``mode = "none"``, the default); the
sandbox's settings are names the file may use, and refused, so that a security setting is never
taken and silently not applied."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from gateway.config.checks import ConfigError
from gateway.config.strict import Path

__all__ = ["ISOLATION_KEYS", "check_isolation"]

# The contract's names (the control-plane's "Agent isolation"): known, so that a typo among them is
# reported as one, though only mode = "none" is taken today.
ISOLATION_KEYS: Final = ("mode", "network", "bind_ro", "bind_rw", "max_processes", "max_memory_mb")
_NOT_AVAILABLE: Final = (
    "the agent sandbox is not available in this version of rawp-gateway "
    '(only mode = "none" is: agents run as the gateway does)'
)


def check_isolation(table: Any, locate: Callable[[Path], str]) -> None:
    """Raise ``ConfigError`` unless ``[isolation]`` asks for what this version does."""
    if not isinstance(table, dict):
        raise ConfigError(f"{locate(('isolation',))}: [isolation] must be a table")
    mode = table.get("mode", "none")
    if mode not in ("none", "sandbox"):
        raise ConfigError(
            f'{locate(("isolation", "mode"))}: [isolation] mode must be "none" or "sandbox", '
            f"got {mode!r}"
        )
    if mode == "sandbox":
        raise ConfigError(
            f'{locate(("isolation", "mode"))}: [isolation] mode = "sandbox": {_NOT_AVAILABLE}'
        )
    for key in table:
        if key != "mode":
            raise ConfigError(
                f"{locate(('isolation', key))}: [isolation] {key} is a setting of the sandbox: "
                f"{_NOT_AVAILABLE}"
            )
