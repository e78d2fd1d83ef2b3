"""How a pending question is asked of the masters and how its answer reaches the agent, sans-IO.

The session machine asks a ``PERMISSION`` question (``agent.interaction.request``) when the agent
asks to use a tool the gateway does not decide itself. This room holds the question's words and
options (``permission_question``, ``interaction_options``, ``risk_of``), and the reading of an
answer: a master's ``selected_value`` (``decision``) or the gateway's own choice
(``chosen_option``: a permission rule, auto_allow, a mode's block, a denied tool), in the agent's
terms. An agent that
offers no options of its own (Claude Code, Codex) is answered allow or deny (``NO_OPTION``); an
ACP agent gets the id of the option chosen. The machine keeps which questions wait and settles
them; this module keeps no state.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from gateway.protocol import frames as F
from parsers import events as ev

__all__ = [
    "ALLOW",
    "DENY",
    "NO_OPTION",
    "NoOption",
    "chosen_option",
    "decision",
    "interaction_options",
    "permission_question",
    "risk_of",
]

ALLOW, DENY = "allow", "deny"


class NoOption:
    """The answer goes to an agent that offers no options of its own (allow or deny)."""


NO_OPTION: Final = NoOption()

_REJECT_FIRST: Final = ("reject_once", "reject_always")
_ALLOW_FIRST: Final = ("allow_once", "allow_always")


def interaction_options(
    req: ev.PermissionRequest, spec: Any
) -> tuple[list[F.InteractionOption], dict[str, tuple[str, bool]]]:
    """The options of the PERMISSION question, and what each value means to the agent.

    Allow and Deny for an agent that offers no options. An agent's own options (ACP) are offered
    as they are, in its order and with its labels; the first allowing one has the value ``allow``
    and the first rejecting one ``deny`` (so a master that answers allow/deny works with any agent),
    the others their kind (``allow_always``, ``reject_always``)."""
    if not req.options:
        return [
            F.InteractionOption(value=ALLOW, label="Allow", risk_level=risk_of(spec)),
            F.InteractionOption(value=DENY, label="Deny", risk_level="safe"),
        ], {}
    first: dict[bool, str] = {}
    for kinds, allows in ((_ALLOW_FIRST, True), (_REJECT_FIRST, False)):
        for kind in kinds:
            found = next((o.option_id for o in req.options if o.kind == kind), None)
            if found is not None:
                first[allows] = found
                break
    options: list[F.InteractionOption] = []
    choices: dict[str, tuple[str, bool]] = {}
    for option in req.options:
        allows = option.kind.startswith("allow")
        if first.get(allows) == option.option_id:
            value = ALLOW if allows else DENY
        else:
            value = option.kind or option.option_id
        if value in choices:
            value = option.option_id
        if value in choices:
            continue  # the same option twice
        choices[value] = (option.option_id, allows)
        risk = risk_of(spec) if allows else "safe"
        options.append(
            F.InteractionOption(value=value, label=option.name or value, risk_level=risk)
        )
    return options, choices


def chosen_option(choices: dict[str, tuple[str, bool]], allow: bool) -> str | NoOption | None:
    """The agent's option the gateway picks itself (a permission rule, auto_allow, a mode's block,
    a denied tool): its allow-once or reject-once first."""
    if not choices:
        return NO_OPTION
    found = choices.get(ALLOW if allow else DENY)
    return found[0] if found is not None else None


def decision(
    choices: dict[str, tuple[str, bool]], selected: str | list[str]
) -> tuple[bool, str | None]:
    """A master's answer (``selected_value``): whether it allows, and which of the agent's own
    options (``choices``) it chose (None for an agent without options)."""
    values = selected if isinstance(selected, list) else [selected]
    if not choices:
        return ALLOW in values, None
    # The agent's own options: the first value that is one of them decides.
    value = next((v for v in values if v in choices), None)
    if value is None:
        value = next((v for v, (_, allows) in choices.items() if not allows), None)
    return value is not None and choices[value][1], value


def permission_question(req: ev.PermissionRequest) -> str:
    inp = req.input
    for key in ("command", "file_path", "path", "url"):
        detail = inp.get(key)
        if isinstance(detail, str) and detail:
            return f"Allow {req.tool_name}: {detail}?"
    if req.title:  # the agent's own words for the call (ACP)
        return f"Allow {req.tool_name}: {req.title[:200]}?"
    return f"Allow the agent to use {req.tool_name}?"


def risk_of(spec: Any) -> Literal["safe", "moderate", "dangerous"]:
    if spec.category == "shell":
        return "dangerous"
    if spec.writes or spec.category in ("web", "mcp", "custom"):
        return "moderate"
    return "safe"
