"""A section's keys declared once: each a dataclass field whose metadata is a ``Setting``.

The field gives a key's name, its type and its default; its ``Setting`` gives the rest: the TOML
types the file may use when they are not the field's own, the bounds, the ``RAWP_GATEWAY_*``
variable and the ``serve`` flag that override it (where there are), how docs/configuration.md
shows its default when that is not the default's literal, its one-line doc, and a ``check`` for
what bounds cannot say (an enumeration, a URL). From that one declaration come the names
gateway/config/strict.py knows, the type and bound checks of ``file_values`` and ``build``,
the variables and flags ``load_config`` layers, the ``serve`` flags of gateway/cli/ and the test
that docs/configuration.md lists every key with its default (tests/repo/test_docs.py).

A class of a lower package (the budget ledger's ``Limits``) is declared the same way with plain
metadata mappings of ``Setting``'s fields, so that package needs nothing of this one.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from gateway.config.checks import ConfigError, check_type

__all__ = [
    "Key",
    "Setting",
    "as_path",
    "build",
    "declared",
    "environment_values",
    "file_values",
    "setting",
    "shown_default",
    "shown_value",
]

# The TOML types a field's type takes, when its Setting names none: an integer is a float too.
_TOML_TYPES: Final[dict[Any, type | tuple[type, ...]]] = {
    "int": int,
    "float": (int, float),
    "str": str,
    "bool": bool,
}


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
    shown: str | None = None  # the default as docs/configuration.md says it, if not its literal
    # ``check(value, name)``: the value, its type and bounds checked, as the field holds it (a
    # Path, a set); a ValueError's message is the error's. The flags and variables give text.
    check: Callable[[Any, str], Any] | None = None


def setting(default: Any = dataclasses.MISSING, *, factory: Any = None, **kw: Any) -> Any:
    """A dataclass field declaring a key: its default (or ``factory``) and its ``Setting``."""
    meta = {"setting": Setting(**kw)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Key:
    """A declared key, with what its field says."""

    name: str
    kind: str  # the field's type as written (``int``, ``Path | None``)
    setting: Setting
    field: dataclasses.Field[Any]

    @property
    def toml(self) -> type | tuple[type, ...]:
        if self.setting.toml is not None:
            return self.setting.toml
        return _TOML_TYPES[self.kind]

    @property
    def numeric(self) -> bool:
        return self.kind in ("int", "float")

    @property
    def flag(self) -> str | None:
        return f"--{self.name.replace('_', '-')}" if self.setting.flag else None

    @property
    def required(self) -> bool:
        return self.field.default is self.field.default_factory is dataclasses.MISSING

    def default(self) -> Any:
        if self.field.default_factory is not dataclasses.MISSING:
            return self.field.default_factory()
        return self.field.default


@functools.cache
def declared(cls: type) -> Mapping[str, Key]:
    """The keys a section class declares, in its order (a field without a Setting is no key:
    ``AuthSettings.oidc`` is a table of its own, ``Webhook.secret`` is read from a key's file)."""
    keys = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("setting")
        if meta is None:
            continue
        found = meta if isinstance(meta, Setting) else Setting(**meta)
        # The type as written: a string under ``from __future__ import annotations``.
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        keys[f.name] = Key(f.name, kind, found, f)
    return MappingProxyType(keys)


def shown_default(key: Key) -> str:
    """The default as docs/configuration.md writes it, in backticks unless it is words."""
    if key.setting.shown is not None:
        return key.setting.shown
    if key.required:
        return "(required)"
    return shown_value(key.default())


def shown_value(value: Any) -> str:
    """A default value as docs/configuration.md writes it: its TOML spelling in backticks, or
    ``none``."""
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    if isinstance(value, tuple | frozenset | list):
        return f"`{json.dumps(sorted(value) if isinstance(value, frozenset) else list(value))}`"
    if value is None:
        return "none"
    return f"`{value}`"


def file_values(cls: type, table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A section's table of the file, each value of the TOML type its key takes (its names are
    known already: gateway/config/strict.py)."""
    keys = declared(cls)
    return {key: check_type(where, key, value, keys[key].toml) for key, value in table.items()}


def environment_values(
    cls: type, environ: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The section's keys its variables set: those over every other layer, and those that are only
    a default below the file (``pod_name``)."""
    over: dict[str, Any] = {}
    under: dict[str, Any] = {}
    for name, key in declared(cls).items():
        var = key.setting.env
        if var is not None and var in environ:
            (under if key.setting.env_is_default else over)[name] = environ[var]
    return over, under


def build(cls: type, values: Mapping[str, Any], where: str = "") -> Any:
    """The section's object from its layered values (a key not among them has its default):
    numbers converted (the flags and variables are text) and bounded, then each key's ``check``.
    ``where`` (``FILE [fleet]``) starts a message when the values all come from the file."""
    keys = declared(cls)
    kw: dict[str, Any] = {}
    try:
        for name, key in keys.items():
            if name in values:
                kw[name] = _checked(key, values[name])
            elif key.required:
                raise ValueError(f"{name} is required")
            else:  # checked as well: a default taken from the machine (the host name) may be bad
                kw[name] = _checked(key, key.default())
    except ValueError as err:
        raise ConfigError(f"{where}: {err}" if where else str(err)) from None
    return cls(**kw)


def _checked(key: Key, value: Any) -> Any:
    name, rule = key.name, key.setting
    if key.numeric:
        value = _number(name, value, int if key.kind == "int" else float, rule)
    if rule.check is not None:
        value = rule.check(value, name)
    if rule.choices is not None and value not in rule.choices:
        raise ValueError(f"{name} must be one of {', '.join(rule.choices)}, got {value!r}")
    return value


def _number(name: str, value: Any, kind: type, rule: Setting) -> Any:
    try:
        value = kind(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(value):  # "nan" and "inf" parse as floats
        raise ValueError(f"{name} must be a finite number, got {value}")
    if rule.low is not None and value < rule.low:
        raise ValueError(f"{name} must be at least {rule.low}, got {value}")
    if rule.above is not None and not value > rule.above:
        raise ValueError(f"{name} must be above {rule.above}, got {value}")
    if rule.high is not None and value > rule.high:
        raise ValueError(f"{name} must be at most {rule.high}, got {value}")
    return value


def as_path(value: Any, name: str) -> Path:
    """A path key's value (``str`` in the file)."""
    return Path(value)
