"""What every section of the configuration shares: ``ConfigError``, and ``read_toml`` for a file
read again while the gateway runs (the users file, the permission rules). A value's type is
checked as its key declares it (settings.py)."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration value is missing or wrong; the message says where and what."""


def read_toml(
    path: str | Path,
    max_bytes: int,
    what: str,
    before_parse: Callable[[str], None] | None = None,
) -> tuple[str, dict[str, Any]]:
    """A TOML file of at most ``max_bytes``: its text and its tables; ConfigError naming ``what``
    (``users file``) and the path when it cannot be read, is too large or is not TOML.
    ``before_parse`` sees the text first and may refuse it (raise ConfigError) for what is cheaper
    to count in the text than to parse."""
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as err:
        raise ConfigError(f"cannot read {what} {path}: {err.strerror}") from None
    if len(raw) > max_bytes:
        raise ConfigError(f"{what} {path} is larger than {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
        if before_parse is not None:
            before_parse(text)
        return text, tomllib.loads(text)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"{what} {path}: not valid TOML: {err}") from None
    except RecursionError:  # tomllib reads nested arrays and tables recursively
        raise ConfigError(f"{what} {path}: not valid TOML: nested too deeply") from None
