"""What every section of the configuration shares: ``ConfigError``, and the check of one value's
type that names the file, the section and the key."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration value is missing or wrong; the message says where and what."""


def check_type(where: str, key: str, value: Any, expected: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, expected):
        names = (
            expected.__name__
            if isinstance(expected, type)
            else " or ".join(t.__name__ for t in expected)
        )
        raise ConfigError(f"{where}: {key} must be {names}, got {value!r}")
    return value
