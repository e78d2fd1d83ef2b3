"""``[agents.NAME]``: a configured agent profile, new or over a built-in one
(gateway/agent/profiles.py), checked key by key.

Features: a parser declares what its agent supports (``ParserSpec.features``); a profile announces
exactly that unless its ``features`` table says otherwise, key by key (``plan_mode = false``
narrows, ``file_reference = true`` widens, the other keys keep the parser's). A profile that
replaces a built-in without changing the parser keeps the built-in's features as the base.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Final

import msgspec

from gateway.agent.environment import GATEWAY_PREFIX, is_gateway_setting
from gateway.agent.profiles import AgentProfile, parser_features
from gateway.config.checks import ConfigError, check_type
from gateway.config.strict import Path
from gateway.protocol.frames import Features
from parsers.base import get as get_parser

__all__ = ["MAX_STALL_SEC", "PROFILE_KEYS", "parse_profile"]

MAX_STALL_SEC: Final = 86400.0
# The keys of an [agents.NAME] table (its features' are FEATURE_NAMES).
PROFILE_KEYS: Final = (
    "parser", "command", "resume_command", "env", "single_turn_process", "resume_flag",
    "mode_flag", "image_flag",
    "override_flags", "features", "auto_allow", "permission_timeout_sec", "description",
    "stall_warning_sec", "stall_timeout_sec", "stdin_prompt_arg", "conversations",
    "reports_cost",
)  # fmt: skip


def parse_profile(
    name: str,
    table: Mapping[str, Any],
    base: AgentProfile | None,
    where: str,
    locate: Callable[[Path], str],
) -> AgentProfile:
    """``[agents.NAME]`` over ``base`` (the built-in of that name, if any); its names are known
    already (gateway/config/strict.py)."""
    where = f"{where} [agents.{name}]"
    changes: dict[str, Any] = {}
    if "parser" in table:
        changes["parser"] = check_type(where, "parser", table["parser"], str)
    for key in ("command", "resume_command"):
        if key in table:
            command = table[key]
            if (
                not isinstance(command, list)
                or not command
                or not all(isinstance(a, str) for a in command)
            ):
                raise ConfigError(f"{where}: {key} must be a non-empty list of strings (no shell)")
            changes[key] = tuple(command)
    if "env" in table:
        env = table["env"]
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ConfigError(f"{where}: env must be a table of strings")
        for var in env:
            if is_gateway_setting(var):
                # Refused rather than dropped: whoever wrote it means the agent to have it, and
                # it would not (gateway/agent/environment.py says why).
                raise ConfigError(
                    f"{locate(('agents', name, 'env', var))}: [agents.{name}] env sets {var}: "
                    f"{GATEWAY_PREFIX}* variables are the gateway's own settings and never reach "
                    "an agent; remove it"
                )
        changes["env"] = dict(env)
    for key in ("single_turn_process", "conversations", "reports_cost"):
        if key in table:
            if not isinstance(table[key], bool):
                raise ConfigError(f"{where}: {key} must be true or false")
            changes[key] = table[key]
    for key in ("resume_flag", "mode_flag", "image_flag", "description", "stdin_prompt_arg"):
        if key in table:
            changes[key] = check_type(where, key, table[key], str)
    if "override_flags" in table:
        flags = table["override_flags"]
        if not isinstance(flags, dict) or not all(isinstance(v, str) for v in flags.values()):
            raise ConfigError(f"{where}: override_flags must be a table of strings")
        changes["override_flags"] = dict(flags)
    parser = changes.get("parser", base.parser if base is not None else None)
    features = base.features if base is not None else Features()
    if parser is not None and (base is None or parser != base.parser):
        try:  # a new parser: the features and tools of its agent
            features = parser_features(parser)
            changes["tools"] = get_parser(parser).tools
        except (KeyError, ValueError) as err:
            raise ConfigError(f"{where}: {err.args[0]}") from None
    if "features" in table:
        features = _override_features(features, table["features"], where)
    changes["features"] = features
    if "auto_allow" in table:
        allow = table["auto_allow"]
        if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
            raise ConfigError(f"{where}: auto_allow must be a list of tool names")
        changes["auto_allow"] = frozenset(allow)
    if "permission_timeout_sec" in table:
        timeout = float(
            check_type(
                where, "permission_timeout_sec", table["permission_timeout_sec"], (int, float)
            )
        )
        if not 0 < timeout < math.inf:  # TOML has nan and inf
            raise ConfigError(f"{where}: permission_timeout_sec must be a finite number > 0")
        changes["permission_timeout_sec"] = timeout
    for key in ("stall_warning_sec", "stall_timeout_sec"):
        if key in table:
            value = float(check_type(where, key, table[key], (int, float)))
            if not 0 <= value <= MAX_STALL_SEC:
                raise ConfigError(
                    f"{where}: {key} must be 0 (off) to {MAX_STALL_SEC:g}, got {value}"
                )
            changes[key] = value
    if base is not None:
        return _conversing_checked(replace(base, **changes), where)
    for required in ("parser", "command"):
        if required not in changes:
            raise ConfigError(f"{where}: a new profile needs {required}")
    # Claude Code's stream-json carries the cost; an ACP agent may or may not (docs/budgets.md).
    changes.setdefault("reports_cost", changes["parser"] == "claude-code")
    return _conversing_checked(AgentProfile(name=name, **changes), where)


def _conversing_checked(profile: AgentProfile, where: str) -> AgentProfile:
    """An agent the gateway converses with (ACP) is one long-lived process that takes its
    prompts in the conversation: a ``{prompt}`` or a process per prompt cannot work."""
    if get_parser(profile.parser).converses and (
        profile.prompt_in_argv or profile.single_turn_process
    ):
        raise ConfigError(
            f"{where}: parser {profile.parser!r} sends prompts as session/prompt: its command "
            "takes no {prompt} and single_turn_process must be false"
        )
    return profile


def _override_features(base: Features, table: Any, where: str) -> Features:
    """``base`` with the keys ``table`` names set as it says (true, false); the rest kept."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: features must be a table of true/false")
    for key, value in table.items():
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: features: {key} must be true or false, got {value!r}")
    return msgspec.structs.replace(base, **table)
