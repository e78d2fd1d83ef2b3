"""Strictness: every name the TOML file uses must be one the gateway knows, and an error says where.

A misspelt section or key is an error, never a warning: ignored, ``[isolaton]`` or ``[auth]
users_fle`` would run the gateway without the setting its operator meant, silently. ``unknown_name``
walks the parsed file against a schema of the known names (each section's module lists its own) and
``Locator`` says on which line of the file a name is, for the message: tomllib keeps no positions,
so the file's text is scanned again for table headers, keys (dotted, quoted), inline tables and
arrays of tables. The file is valid TOML by then (tomllib read it), so the scan can be lenient; a
name it cannot place is reported with its section alone.
"""

from __future__ import annotations

import bisect
import contextlib
import difflib
import tomllib
from collections.abc import Iterator, Mapping
from typing import Any, Final, TypeAlias, Union

__all__ = [
    "ANY_NAME",
    "Locator",
    "Path",
    "Schema",
    "known_names",
    "unknown_name",
    "unknown_names",
]

# A name's place in the file: table and key names, and 1-based positions in arrays of tables.
Path: TypeAlias = tuple[str | int, ...]
# What a table may hold: each known name with the schema of its value (None: any value, checked by
# the section's parser; a one-element list: an array of tables, each checked against the element).
# ANY_NAME as a name stands for every name (the profiles of [agents]).
Schema: TypeAlias = Mapping[str, Union["Schema", list["Schema"], None]]
ANY_NAME: Final = "*"
_BARE_KEY: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def known_names(names: Any) -> dict[str, None]:
    """A schema of names whose values the section's parser checks."""
    return dict.fromkeys(names)


def unknown_name(data: Mapping[str, Any], schema: Schema) -> tuple[Path, str] | None:
    """The first name of ``data`` (in the file's order) that ``schema`` does not know, and what to
    say of it (``unknown key [server] prot; did you mean port?``); None if there is none."""
    return next(_unknown(data, schema, ()), None)


def unknown_names(data: Mapping[str, Any], schema: Schema) -> list[tuple[Path, str]]:
    """Every name of ``data`` that ``schema`` does not know, in the file's order, each with what
    to say of it: a file with several misspellings is fixed in one round, not one per start."""
    return list(_unknown(data, schema, ()))


def _unknown(data: Mapping[str, Any], schema: Schema, path: Path) -> Iterator[tuple[Path, str]]:
    for name, value in data.items():
        if name not in schema and ANY_NAME not in schema:
            yield path + (name,), _message(path + (name,), list(schema), value)
            continue
        sub = schema.get(name, schema.get(ANY_NAME))
        if isinstance(sub, Mapping) and isinstance(value, dict):
            yield from _unknown(value, sub, path + (name,))
        elif isinstance(sub, list) and isinstance(value, list):
            for i, item in enumerate(value, 1):
                if isinstance(item, dict):
                    yield from _unknown(item, sub[0], path + (name, i))


def _section(path: Path) -> str:
    """``[server]``, ``[agents.x.features]``, ``[[notify.webhooks]] 2``: the table a name is in."""
    names: list[str] = []
    entry = ""
    for part in path:
        if isinstance(part, int):
            entry = f" {part}"
        else:
            names.append(part)
    dotted = ".".join(names)
    return f"[[{dotted}]]{entry}" if entry else f"[{dotted}]"


def _message(path: Path, known: list[str], value: Any) -> str:
    # The suggestion only when a known name is close.
    name = str(path[-1])
    close = difflib.get_close_matches(name, known, n=1)
    if isinstance(value, dict):
        what = f"unknown section {_section(path)}"
        hint = _section(path[:-1] + (close[0],)) if close else ""
    elif len(path) == 1:
        what = f"unknown key {name} outside any section"
        hint = _section((close[0],)) if close else ""
    else:
        what = f"unknown key {_section(path[:-1])} {name}"
        hint = close[0] if close else ""
    return f"{what}; did you mean {hint}?" if hint else what


class Locator:
    """Where a name is in the file: ``locate(path)`` is ``FILE:LINE`` or, unplaced, ``FILE``."""

    def __init__(self, where: str, text: str) -> None:
        self.where = where
        self._lines: dict[Path, int] | None = None
        self._text = text

    def __call__(self, path: Path) -> str:
        if self._lines is None:  # scanned only when there is something to report
            self._lines = _scan(self._text)
        line = self._lines.get(path)
        return self.where if line is None else f"{self.where}:{line}"


def _scan(text: str) -> dict[Path, int]:
    scanner = _Scanner(text)
    # A construct the lenient scan does not follow: the names placed before it are kept.
    with contextlib.suppress(IndexError, ValueError):
        scanner.document()
    return scanner.lines


class _Scanner:
    """The positions of the names of a valid TOML document (not its values)."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.lines: dict[Path, int] = {}
        self._newlines = [i for i, c in enumerate(text) if c == "\n"]
        self._arrays: dict[Path, int] = {}  # each array of tables: its entries so far

    def document(self) -> None:
        table: Path = ()
        while True:
            self._skip(newlines=True)
            if self.i >= len(self.s):
                return
            line = self._line()
            if self.s[self.i] == "[":
                array = self.s.startswith("[[", self.i)
                self.i += 2 if array else 1
                table = self._header(self._key(), array, line)
                self._skip()
                self.i += 2 if array else 1
            else:
                key = self._key()
                self._mark(table + key, line)
                self._skip()
                self.i += 1  # "="
                self._value(table + key)

    def _header(self, key: Path, array: bool, line: int) -> Path:
        # A table below an array of tables belongs to its latest entry.
        path: Path = ()
        for n, part in enumerate(key, 1):
            path += (part,)
            if path in self._arrays and (n < len(key) or not array):
                path += (self._arrays[path],)
        if array:
            self._arrays[path] = self._arrays.get(path, 0) + 1
            self._mark(path, line)
            path += (self._arrays[path],)
        self._mark(path, line)
        return path

    def _mark(self, path: Path, line: int) -> None:
        for n in range(1, len(path) + 1):  # a dotted key's tables are where it is first named
            self.lines.setdefault(path[:n], line)

    def _line(self) -> int:
        return bisect.bisect_left(self._newlines, self.i) + 1

    def _skip(self, *, newlines: bool = False) -> None:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            elif c == "#" and newlines:
                end = s.find("\n", self.i)
                self.i = len(s) if end < 0 else end
            else:
                return

    def _key(self) -> Path:
        parts: list[str] = []
        while True:
            self._skip()
            if self.s[self.i] in "\"'":
                start = self.i
                self._string()
                parts.append(tomllib.loads(f"k = {self.s[start : self.i]}")["k"])
            else:
                start = self.i
                while self.i < len(self.s) and self.s[self.i] in _BARE_KEY:
                    self.i += 1
                if self.i == start:
                    raise ValueError("not a key")
                parts.append(self.s[start : self.i])
            self._skip()
            if self.i < len(self.s) and self.s[self.i] == ".":
                self.i += 1
                continue
            return tuple(parts)

    def _value(self, path: Path) -> None:
        self._skip()
        c = self.s[self.i]
        if c == "{":
            self.i += 1
            while True:
                self._skip(newlines=True)
                if self.s[self.i] == "}":
                    self.i += 1
                    return
                line = self._line()
                key = self._key()
                self._mark(path + key, line)
                self._skip()
                self.i += 1  # "="
                self._value(path + key)
                self._skip(newlines=True)
                if self.s[self.i] == ",":
                    self.i += 1
        elif c == "[":
            self.i += 1
            n = 0
            while True:
                self._skip(newlines=True)
                if self.s[self.i] == "]":
                    self.i += 1
                    return
                n += 1
                self._mark(path + (n,), self._line())
                self._value(path + (n,))
                self._skip(newlines=True)
                if self.s[self.i] == ",":
                    self.i += 1
        elif c in "\"'":
            self._string()
        else:  # a number, a boolean, a date: up to what ends a value
            while self.i < len(self.s) and self.s[self.i] not in ",]}#\r\n":
                self.i += 1

    def _string(self) -> None:
        s = self.s
        quote = s[self.i]
        if s.startswith(quote * 3, self.i):
            self.i += 3
            while not s.startswith(quote * 3, self.i):
                self.i += 2 if quote == '"' and s[self.i] == "\\" else 1
            self.i += 3
            while self.i < len(s) and s[self.i] == quote:  # up to two quotes end the content
                self.i += 1
            return
        self.i += 1
        while s[self.i] != quote:
            self.i += 2 if quote == '"' and s[self.i] == "\\" else 1
        self.i += 1
