"""``[[policy.rules]]`` (docs/policies.md): each rule checked and built into a
``gateway.protocol.policy.Rule``, bounded, with errors that name the file and the rule.

The whole set is refused on the first error, so a rule set is used whole or not at all (at start,
and on SIGHUP, where the old set then stays: ``read_policy``). Every size is bounded before it is
looked at: the number of rules, of globs and match fields in a rule, of roles and agents, and the
length of each name, glob and message, so a hostile file is refused in time and memory
proportional to what the bounds allow.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gateway.config.checks import ConfigError, read_toml
from gateway.config.strict import Locator, Schema, known_names, unknown_name
from gateway.protocol.policy import DECISIONS, Glob, Rule

__all__ = [
    "MAX_GLOB_CHARS",
    "MAX_RULES",
    "POLICY_SCHEMA",
    "RULE_KEYS",
    "PolicySettings",
    "parse_policy",
    "read_policy",
]

MAX_RULES: Final = 10_000
MAX_GLOBS: Final = 64  # tools of a rule
MAX_MATCH_FIELDS: Final = 16
MAX_NAMES: Final = 64  # roles, agents of a rule
MAX_GLOB_CHARS: Final = 512
MAX_NAME_CHARS: Final = 128  # a rule's name, a field, a role, an agent
MAX_MESSAGE_CHARS: Final = 1024
MAX_FILE_BYTES: Final = 16 * 1024 * 1024  # a file read again on SIGHUP
RULE_KEYS: Final = ("name", "tools", "match", "decision", "roles", "agents", "message")
# The [policy] names gateway/config/strict.py knows; match's fields are the rule's own.
POLICY_SCHEMA: Final[Schema] = {"rules": [known_names(RULE_KEYS)]}
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")


@dataclass(frozen=True)
class PolicySettings:
    """``[policy]``: its rules, in the file's order (the first that matches decides)."""

    rules: tuple[Rule, ...] = ()


def parse_policy(table: Any, where: str) -> PolicySettings:
    """``[policy]`` checked."""
    return PolicySettings(_rules(table, where))


def _rules(table: Any, where: str) -> tuple[Rule, ...]:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [policy] must be a table")
    entries = table.get("rules", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: [[policy.rules]] must be an array of tables")
    if len(entries) > MAX_RULES:
        raise ConfigError(
            f"{where}: [[policy.rules]] has {len(entries)} rules; at most {MAX_RULES}"
        )
    rules: list[Rule] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries, 1):
        rule = _rule(entry, f"{where} [[policy.rules]] {i}")
        if rule.name in seen:
            raise ConfigError(
                f"{where} [[policy.rules]] {i} ({rule.name}): the name is used by an earlier rule"
            )
        seen.add(rule.name)
        rules.append(rule)
    return tuple(rules)


# A rule's table header at the start of a line, as a rule set is nearly always written: counted in
# the text, a file of far too many rules is refused in milliseconds instead of after the seconds
# tomllib takes to read it (one written otherwise is still refused, after parsing).
_RULE_HEADER: Final = re.compile(rb"^[ \t]*\[\[[ \t]*policy[ \t]*\.[ \t]*rules[ \t]*\]\]", re.M)


def refuse_too_many_rules(where: str) -> Callable[[str], None]:
    """A check of a config file's text, before it is parsed, for more rules than MAX_RULES."""

    def check(text: str) -> None:
        found = 0
        for found, _ in enumerate(_RULE_HEADER.finditer(text.encode()), 1):
            if found > MAX_RULES:
                break
        if found > MAX_RULES:
            raise ConfigError(
                f"{where}: [[policy.rules]] has more than {MAX_RULES} rules; at most {MAX_RULES}"
            )

    return check


def read_policy(path: str | Path) -> tuple[Rule, ...]:
    """The rules of a config file read again (SIGHUP); ConfigError when the file or a rule cannot
    be used. Only ``[policy]`` is read: the other settings need a restart."""
    where = str(path)
    text, data = read_toml(path, MAX_FILE_BYTES, "config file", refuse_too_many_rules(where))
    policy = data.get("policy", {})
    unknown = unknown_name({"policy": policy}, {"policy": POLICY_SCHEMA})
    if unknown is not None:
        name, message = unknown
        raise ConfigError(f"{Locator(where, text)(name)}: {message}")
    return _rules(policy, where)


def _rule(entry: Any, where: str) -> Rule:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: a rule must be a table")
    name = entry.get("name")
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not _NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: name must be letters, digits, '.', '_', ':' or '-' (at most "
            f"{MAX_NAME_CHARS} characters), got {_show(name)}"
        )
    where = f"{where} ({name})"
    unknown = next((k for k in entry if k not in RULE_KEYS), None)
    if unknown is not None:  # strict.py said so already at start; a reload checks here
        raise ConfigError(f"{where}: unknown field {_show(unknown)}")
    decision = entry.get("decision")
    if decision not in DECISIONS:
        raise ConfigError(
            f"{where}: decision must be one of {', '.join(DECISIONS)}, got {_show(decision)}"
        )
    message = entry.get("message", "")
    if not isinstance(message, str) or len(message) > MAX_MESSAGE_CHARS:
        raise ConfigError(
            f"{where}: message must be text of at most {MAX_MESSAGE_CHARS} characters"
        )
    tools = tuple(_glob(g, f"{where} tools") for g in _list(entry, "tools", MAX_GLOBS, where))
    match = entry.get("match", {})
    if not isinstance(match, dict):
        raise ConfigError(f"{where}: match must be a table of field = glob")
    if len(match) > MAX_MATCH_FIELDS:
        raise ConfigError(f"{where}: match may name at most {MAX_MATCH_FIELDS} fields")
    fields: list[tuple[str, Glob]] = []
    for field, glob in match.items():
        if len(field) > MAX_NAME_CHARS:
            raise ConfigError(f"{where}: match field names are at most {MAX_NAME_CHARS} characters")
        fields.append((field, _glob(glob, f"{where} match.{field}")))
    roles = _names(entry, "roles", where)
    agents = _names(entry, "agents", where)
    return Rule(name, decision, tools, tuple(fields), roles, agents, message)


def _list(entry: dict[str, Any], key: str, most: int, where: str) -> list[Any]:
    value = entry.get(key, [])
    if not isinstance(value, list):
        raise ConfigError(f"{where}: {key} must be a list")
    if len(value) > most:
        raise ConfigError(f"{where}: {key} may list at most {most} entries")
    return value


def _names(entry: dict[str, Any], key: str, where: str) -> frozenset[str] | None:
    if key not in entry:
        return None
    values = _list(entry, key, MAX_NAMES, where)
    for value in values:
        if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
            raise ConfigError(
                f"{where}: {key} must be names of at most {MAX_NAME_CHARS} characters, got "
                f"{_show(value)}"
            )
    return frozenset(values)


def _glob(value: Any, where: str) -> Glob:
    if not isinstance(value, str) or not value.lstrip("!"):
        raise ConfigError(f"{where}: a glob must be non-empty text, got {_show(value)}")
    if len(value) > MAX_GLOB_CHARS:
        raise ConfigError(
            f"{where}: a glob is at most {MAX_GLOB_CHARS} characters, got {len(value)}"
        )
    try:
        return Glob(value)
    except (re.error, RecursionError, OverflowError) as err:
        raise ConfigError(f"{where}: not a usable glob {_show(value)}: {err}") from None


def _show(value: Any) -> str:
    """A value quoted for an error message, cut: the file may be hostile."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
