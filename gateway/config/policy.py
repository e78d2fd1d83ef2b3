"""``[[policy.rules]]`` (docs/policies.md): each rule read into a ``gateway.protocol.policy.Rule``,
whose fields declare its keys and their bounds (gateway/config/settings.py), with errors that name
the file and the rule.

The whole set is refused on the first error, so a rule set is used whole or not at all (at start,
and on SIGHUP, where the old set then stays: ``read_policy``). Every size is bounded before it is
looked at: the number of rules here, what one rule may hold on ``Rule``, so a hostile file is
refused in time and memory proportional to what the bounds allow.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gateway.config.checks import ConfigError, read_toml
from gateway.config.settings import build, declared, file_values
from gateway.config.strict import Locator, Schema, known_names, unknown_name
from gateway.protocol.policy import MAX_GLOB_CHARS, Rule, is_rule_name

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
MAX_FILE_BYTES: Final = 16 * 1024 * 1024  # a file read again on SIGHUP
RULE_KEYS: Final = tuple(declared(Rule))
# The [policy] names gateway/config/strict.py knows; match's fields are the rule's own.
POLICY_SCHEMA: Final[Schema] = {"rules": [known_names(RULE_KEYS)]}


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
    if is_rule_name(name):  # the rule's errors name it too (a bad name is the first said)
        where = f"{where} ({name})"
    rule: Rule = build(Rule, file_values(Rule, entry, where), where)
    return rule
