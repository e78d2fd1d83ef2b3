"""One key of the configuration file, declared: ``setting(...)`` is a dataclass field whose metadata
is a ``Setting``, what the key is besides its name, type and default (the field's).

A leaf every part may import: a section's class is declared where its consumer lives (the budget
ledger's ``Limits``, the sandbox's ``Isolation``, an agent profile, a permission rule) the same way
as config/'s own sections, and gateway/config/settings.py reads every declaration alike (the checks,
the variables and flags, the strict names, the docs test).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["Setting", "setting"]


@dataclasses.dataclass(frozen=True)
class Setting:
    """What one key is besides its name, type and default (the dataclass field's)."""

    doc: str
    toml: type | tuple[type, ...] | None = None  # the file's types, if not the field's own
    low: float | None = None  # bounds, inclusive
    high: float | None = None
    above: float | None = None  # an exclusive lower bound
    env: str | None = None  # the RAWP_GATEWAY_* variable that overrides the file and the flags
    env_is_default: bool = False  # the variable is only a default, below the file
    flag: bool = False  # ``serve --key-name`` sets it
    choices: tuple[str, ...] | None = None  # the values it may take (after ``check``)
    # What the value must be, in words, when its type alone does not say (``a table of strings``):
    # the sentence of a wrong type. A ``check`` says its own sentence, with these words.
    expected: str | None = None
    shown: str | None = None  # the default as docs/configuration.md says it, if not its literal
    # ``check(value, name)``: the value, its type and bounds checked, as the field holds it (a
    # Path, a set); a ValueError's message is the error's. The flags and variables give text. A
    # default is checked too, unless None (not set).
    check: Callable[[Any, str], Any] | None = None


def setting(default: Any = dataclasses.MISSING, *, factory: Any = None, **kw: Any) -> Any:
    """A dataclass field declaring a key: its default (or ``factory``; neither: required) and its
    ``Setting``."""
    meta = {"setting": Setting(**kw)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)
