"""The numbers an agent reports (a cost, token counts), checked before anything adds them up.

An agent's cost and token fields are free-form JSON it printed: a string (``"5"``), a float where
a count belongs, a negative or absurdly large count, or a number that is not finite (``NaN`` and
``Infinity`` as Python's ``json`` prints them, ``1e400`` that overflows a double). A parser's
typed decoder refuses such a line whole, and when that line is the one that ends the turn (Claude
Code's ``result``) the turn never ends. So the parsers type these fields loosely and read them
through ``cost`` and ``count`` here, which keep a usable value and drop an odd one (None); and a
line msgspec cannot decode at all because of such a number is read again by ``without_odd_numbers``
with those numbers as ``null``. What was dropped is said in an ``OddNumbers`` note the session
machine logs; nothing odd reaches a ``session.usage``, the usage tally or a budget.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

import msgspec

__all__ = [
    "MAX_COST_USD",
    "MAX_COUNT",
    "MAX_NAMES",
    "MAX_NAME_CHARS",
    "OddFields",
    "cost",
    "count",
    "without_odd_numbers",
]

# No agent session costs a billion dollars: past that a "cost" is garbage, and a sum of a few
# such values would overflow to infinity.
MAX_COST_USD: Final = 1e9
# What an OddNumbers note names of one line: at most this many fields, this long each (the keys
# are the agent's, of any length).
MAX_NAMES: Final = 16
MAX_NAME_CHARS: Final = 128
# The largest integer a double (and so a JavaScript master) holds exactly.
MAX_COUNT: Final = 2**53 - 1


class OddFields:
    """The names of the fields one line had odd numbers in, for the note that says so."""

    __slots__ = ("names",)

    def __init__(self) -> None:
        self.names: list[str] = []

    def cost(self, value: Any, name: str) -> float | None:
        return self._kept(cost(value), value, name)

    def count(self, value: Any, name: str) -> int | None:
        return self._kept(count(value), value, name)

    def _kept(self, kept: Any, value: Any, name: str) -> Any:
        if kept is None and value is not None:
            self.names.append(name)
        return kept


def cost(value: Any) -> float | None:
    """A cost in USD: a finite JSON number from 0 to ``MAX_COST_USD``; anything else is None.

    A string is not a number, even ``"5"``: an agent that quotes its numbers is not one whose
    other numbers can be trusted to mean what they say.
    """
    if type(value) is int:
        return float(value) if 0 <= value <= MAX_COST_USD else None
    if type(value) is float and math.isfinite(value) and 0.0 <= value <= MAX_COST_USD:
        return value
    return None


def count(value: Any) -> int | None:
    """A token count: a whole JSON number from 0 to ``MAX_COUNT``; anything else (a float, a
    string, a bool, a negative or larger number) is None."""
    return value if type(value) is int and 0 <= value <= MAX_COUNT else None


class _Odd:
    """Where the stdlib reader met a number msgspec cannot decode."""


_ODD: Final = _Odd()


def _float(text: str) -> float | _Odd:
    value = float(text)
    return value if math.isfinite(value) else _ODD


def _int(text: str) -> int | _Odd:
    value = int(text)
    # msgspec decodes integers of up to 64 bits; a larger one would refuse the line again.
    return value if -(2**63) <= value < 2**64 else _ODD


def _nulled(obj: Any, path: str, names: list[str]) -> Any:
    """``obj`` with every ``_ODD`` as None, their paths (``usage.input_tokens``) in ``names``."""
    if obj is _ODD:
        if len(names) < MAX_NAMES:  # a line can hold any number of them: the note stays small
            names.append((path or "(the line)")[:MAX_NAME_CHARS])
        return None
    if isinstance(obj, dict):
        return {k: _nulled(v, f"{path}.{k}" if path else k, names) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nulled(v, f"{path}[{i}]", names) for i, v in enumerate(obj)]
    return obj


def without_odd_numbers(line: bytes) -> tuple[bytes, list[str]] | None:
    """``line`` again with every number msgspec cannot decode (``NaN``, ``Infinity``, a float
    that overflows, an integer past 64 bits) as ``null``, and where they were; None when the line
    is no JSON even so, or has no such number (it was refused for something else)."""
    try:
        obj = json.loads(line, parse_constant=lambda _: _ODD, parse_float=_float, parse_int=_int)
        names: list[str] = []
        obj = _nulled(obj, "", names)
    except (ValueError, RecursionError):
        return None
    return (msgspec.json.encode(obj), names) if names else None
