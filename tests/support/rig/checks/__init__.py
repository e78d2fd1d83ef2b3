"""What the real CLIs must print for their scenarios, one module an agent, and how a module
names its checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def by_fixture(namespace: dict[str, Any]) -> dict[str, Callable[..., None]]:
    """A module's ``check_<fixture>`` functions by fixture name (``check_http_400`` checks the
    fixture ``http-400``), so that a new check is listed by being written."""
    return {
        name.removeprefix("check_").replace("_", "-"): fn
        for name, fn in namespace.items()
        if name.startswith("check_") and callable(fn)
    }
