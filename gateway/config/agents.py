"""``[agents.NAME]``: a configured agent profile, new or over a built-in one
(gateway/agent/profiles.py), checked key by key as ``AgentProfile``'s fields declare them
(gateway/config/settings.py); here what depends on the rest: the parser's features and tools, a new
profile's required keys and its cost default, the environment's names, a conversing agent's shape.

Features: a parser declares what its agent supports (``ParserSpec.features``); a profile announces
exactly that unless its ``features`` table says otherwise, key by key (``plan_mode = false``
narrows, ``file_reference = true`` widens, the other keys keep the parser's). A profile that
replaces a built-in without changing the parser keeps the built-in's features as the base.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Final

import msgspec

from gateway.agent.environment import GATEWAY_PREFIX, is_gateway_setting
from gateway.agent.profiles import AgentProfile, parser_features
from gateway.config.checks import ConfigError
from gateway.config.settings import checked_values, declared, file_values
from gateway.config.strict import Path
from gateway.protocol.frames import Features
from parsers.base import get as get_parser

__all__ = ["PROFILE_KEYS", "parse_profile"]

# The keys of an [agents.NAME] table (its features' are FEATURE_NAMES).
PROFILE_KEYS: Final = tuple(declared(AgentProfile))
# What a new profile must set (a built-in's table changes what it names): parser and command.
_REQUIRED: Final = tuple(name for name, key in declared(AgentProfile).items() if key.required)


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
    changes = checked_values(AgentProfile, file_values(AgentProfile, table, where), where)
    for var in changes.get("env", {}):
        if is_gateway_setting(var):
            # Refused rather than dropped: whoever wrote it means the agent to have it, and
            # it would not (gateway/agent/environment.py says why).
            raise ConfigError(
                f"{locate(('agents', name, 'env', var))}: [agents.{name}] env sets {var}: "
                f"{GATEWAY_PREFIX}* variables are the gateway's own settings and never reach "
                "an agent; remove it"
            )
    switches = changes.pop("features", {})  # the features turned on or off
    parser = changes.get("parser", base.parser if base is not None else None)
    features = base.features if base is not None else Features()
    if parser is not None and (base is None or parser != base.parser):
        try:  # a new parser: the features and tools of its agent
            features = parser_features(parser)
            changes["tools"] = get_parser(parser).tools
        except (KeyError, ValueError) as err:
            raise ConfigError(f"{where}: {err.args[0]}") from None
    changes["features"] = msgspec.structs.replace(features, **switches)
    if base is not None:
        return _conversing_checked(replace(base, **changes), where)
    for required in _REQUIRED:
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
