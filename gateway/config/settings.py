"""A section's keys declared once: each a dataclass field whose metadata is a ``Setting``
(gateway/setting.py, re-exported here).

The field gives a key's name, its type and its default; its ``Setting`` gives the rest: the TOML
types the file may use when they are not the field's own, the bounds, the ``RAWP_GATEWAY_*``
variable and the ``serve`` flag that override it (where there are), how docs/configuration.md
shows its default when that is not the default's literal, its one-line doc, and a ``check`` for
what bounds cannot say (an enumeration, a URL). From that one declaration come the names
gateway/config/strict.py knows, the type and bound checks of ``file_values``, ``checked_values``
and ``build``, the variables and flags ``load_config`` layers, the ``serve`` flags of gateway/cli/
and the test that docs/configuration.md lists every key with its default (tests/repo/test_docs.py).

What a value must be is said one way for every key (``Key.expected``): its choices (``"none" or
"sandbox"``), its range (``an integer from 16 to 1048576``), true or false, or the words its
``Setting`` gives (``a list of at most 64 paths``), else its TOML type; a wrong type and a value
out of that range get the same sentence.

A class of a lower package (the budget ledger's ``Limits``, the sandbox's ``Isolation``, an agent
profile, a permission rule) is declared the same way, with ``setting(...)`` from the leaf
gateway/setting.py, so that package needs nothing of this one; what its own checks cannot see (a
path on disk, a line of the file, another section) its room in config/ checks after the build.
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

from gateway.config.checks import ConfigError
from gateway.setting import Setting, setting

__all__ = [
    "Key",
    "Setting",
    "Where",
    "as_path",
    "build",
    "checked_values",
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

# Where a key's error is: ``FILE [fleet]`` (the message follows after ": "), or, for a section
# whose errors name the line, what the message follows for that key (``FILE:4: [isolation] ``).
Where = str | Callable[[str], str]


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
    def expected(self) -> str:
        """What the value must be, as an error says it (``must be ...``)."""
        rule = self.setting
        if rule.expected is not None:
            return rule.expected
        if rule.choices is not None:
            shown = [f'"{c}"' for c in rule.choices]
            return " or ".join(shown) if len(shown) == 2 else f"one of {', '.join(shown)}"
        if self.kind == "bool":
            return "true or false"
        if self.numeric and rule.low is not None and rule.high is not None:
            what = "an integer" if self.kind == "int" else "a number"
            return f"{what} from {_plain(rule.low)} to {_plain(rule.high)}"
        toml = self.toml
        return " or ".join(t.__name__ for t in (toml if isinstance(toml, tuple) else (toml,)))

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
        found = f.metadata.get("setting")
        if found is None:
            continue
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


def file_values(cls: type, table: Mapping[str, Any], where: Where) -> dict[str, Any]:
    """A section's table of the file, each value of the TOML type its key takes (its names are
    known already: gateway/config/strict.py says where an unknown one is, and which is near)."""
    keys = declared(cls)
    for name, value in table.items():
        if name not in keys:
            raise ConfigError(f"{_prefix(where, name)}unknown key {name}")
        toml = keys[name].toml
        # A TOML boolean is no number: ``port = true`` is a mistake, not 1.
        if not isinstance(value, toml) or (isinstance(value, bool) and toml is not bool):
            raise ConfigError(
                f"{_prefix(where, name)}{name} must be {keys[name].expected}, got {value!r}"
            )
    return dict(table)


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


def checked_values(cls: type, values: Mapping[str, Any], where: Where = "") -> dict[str, Any]:
    """The values given, each converted, bounded and checked as its key says (what is not given
    is left out: a profile changes only the keys its table sets)."""
    keys = declared(cls)
    return {name: _checked_at(where, keys[name], value) for name, value in values.items()}


def build(cls: type, values: Mapping[str, Any], where: Where = "") -> Any:
    """The section's object from its layered values (a key not among them has its default):
    numbers converted (the flags and variables are text) and bounded, then each key's ``check``.
    ``where`` (``FILE [fleet]``) starts a message when the values all come from the file."""
    kw: dict[str, Any] = {}
    for name, key in declared(cls).items():
        if name not in values and key.required:
            raise ConfigError(f"{_prefix(where, name)}{name} is required")
        if name in values:
            kw[name] = _checked_at(where, key, values[name])
            continue
        # A default is checked as well: one taken from the machine (the host name) may be bad.
        # None is "not set" (``roles``: any), nothing to check.
        default = key.default()
        kw[name] = default if default is None else _checked_at(where, key, default)
    return cls(**kw)


def _prefix(where: Where, name: str) -> str:
    if callable(where):
        return where(name)
    return f"{where}: " if where else ""


def _checked_at(where: Where, key: Key, value: Any) -> Any:
    try:
        return _checked(key, value)
    except ValueError as err:
        raise ConfigError(f"{_prefix(where, key.name)}{err}") from None


def _checked(key: Key, value: Any) -> Any:
    name, rule = key.name, key.setting
    if key.numeric:
        value = _number(key, value)
    if rule.check is not None:
        value = rule.check(value, name)
    if rule.choices is not None and value not in rule.choices:
        raise ValueError(f"{name} must be {key.expected}, got {value!r}")
    return value


def _number(key: Key, value: Any) -> Any:
    name, low, high = key.name, key.setting.low, key.setting.high
    ranged = low is not None and high is not None
    try:
        value = (int if key.kind == "int" else float)(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(
            f"{name} must be {key.expected if ranged else 'a number'}, got {value!r}"
        ) from None
    if low is not None and high is not None:  # both bounds: one sentence says the range
        if not (math.isfinite(value) and low <= value <= high):
            raise ValueError(f"{name} must be {key.expected}, got {value!r}")
        return value
    if not math.isfinite(value):  # "nan" and "inf" parse as floats
        raise ValueError(f"{name} must be a finite number, got {value}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")
    above = key.setting.above
    if above is not None and not value > above:
        raise ValueError(f"{name} must be above {above}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be at most {high}, got {value}")
    return value


def _plain(bound: float) -> str:
    """A bound as a person writes it: ``5``, not ``5.0``."""
    return str(int(bound)) if float(bound).is_integer() else str(bound)


def as_path(value: Any, name: str) -> Path:
    """A path key's value (``str`` in the file)."""
    return Path(value)
