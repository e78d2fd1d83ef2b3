"""How to run each agent: ``AgentProfile`` (argv template, environment, resuming, features, tools
allowed without asking), the built-in profiles, and the argv a profile gives for one prompt.

Theory of operation
-------------------
An ``AgentProfile`` says how to run one agent: its parser, argv template (a list, never a shell
string), extra environment, whether it is a single-turn process and how to resume it, the DPS
features it supports, and which tools are allowed without asking a master. The built-in profiles
are here; configured ones (``[agents.NAME]``) are read by gateway/config/agents.py.

Features: a parser declares what its agent supports (``ParserSpec.features``); a profile announces
exactly that unless configured otherwise (gateway/config/agents.py).

Each field an ``[agents.NAME]`` table may set declares its key (``setting``, gateway/setting.py):
its type, bounds and the check of its shape. What depends on the parser (its features and tools, whether it reports its cost) and on the
built-in profile a table changes is gateway/config/agents.py's.

Resuming (a single-turn agent's next prompt, with the session id the agent reported): either
``resume_flag`` (``--resume {session_id}``) is appended to ``command``, or, when the CLI resumes
through a subcommand that must come before the prompt, ``resume_command`` replaces ``command``.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from gateway.agent.demo import ALL_TOOLS as DEMO_TOOLS
from gateway.protocol.frames import Features
from gateway.setting import setting
from parsers.base import get as get_parser

__all__ = [
    "FEATURE_NAMES",
    "MAX_ARGV_PROMPT_BYTES",
    "MAX_STALL_SEC",
    "AgentProfile",
    "acp_profiles",
    "builtin_profiles",
    "command_for",
    "parser_features",
    "prompt_on_stdin",
    "template_args",
]

DEFAULT_STALL_WARNING_SEC: Final = 300.0
DEFAULT_STALL_TIMEOUT_SEC: Final = 1800.0
MAX_STALL_SEC: Final = 86400.0
# A prompt longer than this (UTF-8 bytes) never goes in argv: Linux refuses one argument over
# 128 KiB (E2BIG) and all of argv and the environment over ARG_MAX. It goes to the CLI's stdin where
# the profile says how (``stdin_prompt_arg``); elsewhere it is refused.
MAX_ARGV_PROMPT_BYTES: Final = 100 * 1024


_ARGV: Final = "a non-empty list of strings (no shell)"
_STRINGS: Final = "a table of strings"


def _argv(value: list[Any], name: str) -> tuple[str, ...]:
    if not value or not all(isinstance(a, str) for a in value):
        raise ValueError(f"{name} must be {_ARGV}")
    return tuple(value)


def _strings(value: Mapping[str, Any], name: str) -> dict[str, str]:
    if not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"{name} must be {_STRINGS}")
    return dict(value)


def _tool_names(value: list[Any] | frozenset[str], name: str) -> frozenset[str]:
    if not all(isinstance(a, str) for a in value):
        raise ValueError(f"{name} must be a list of tool names")
    return frozenset(value)


def _switches(value: Mapping[str, Any], name: str) -> dict[str, bool]:
    """The features a table turns on or off, over its parser's (gateway/config/agents.py)."""
    for key, on in value.items():
        if not isinstance(on, bool):
            raise ValueError(f"{name}: {key} must be true or false, got {on!r}")
    return dict(value)


@dataclass(frozen=True)
class AgentProfile:
    """How to run one agent. The fields an ``[agents.NAME]`` table may set declare their keys
    (gateway/setting.py); ``name`` and ``tools`` are no keys."""

    name: str
    parser: str = setting(shown="(required for a new profile)", doc="a registered parser")
    command: tuple[str, ...] = setting(
        toml=list,
        expected=_ARGV,
        check=_argv,
        shown="(required for a new profile)",
        doc="the argv, never run through a shell",
    )
    env: Mapping[str, str] = setting(
        factory=dict,
        toml=dict,
        expected=_STRINGS,
        check=_strings,
        doc="added to the agent's environment",
    )
    single_turn_process: bool = setting(False, doc="one process per prompt, respawned, resumed")
    resume_flag: str | None = setting(
        None, toml=str, doc="appended when respawning, with {session_id}"
    )
    # Replaces ``command`` when resuming, for CLIs whose resume is a subcommand before the prompt
    # (``codex exec resume <id> <prompt>``): ``{session_id}`` is the agent's session id.
    resume_command: tuple[str, ...] | None = setting(
        None, toml=list, expected=_ARGV, check=_argv, doc="replaces command when resuming"
    )
    # e.g. "--permission-mode {mode}", used when (re)spawning
    mode_flag: str | None = setting(None, toml=str, doc="added when (re)spawning in plan mode")
    # How a single-turn CLI is given an image with its prompt: "--image {path}", once per image
    # (Codex). Without it (and without a stdin input that takes images), images are uploads like
    # any other file: written into the workspace and named in the prompt.
    image_flag: str | None = setting(None, toml=str, doc="how the CLI takes an image with a prompt")
    override_flags: Mapping[str, str] = setting(  # allowed_tools → "--allowedTools"
        factory=dict,
        toml=dict,
        expected=_STRINGS,
        check=_strings,
        doc="the CLI flag of each config_override",
    )
    # In the file, the features turned on or off over the parser's (a table of true/false).
    features: Features = setting(
        factory=Features,
        toml=dict,
        expected="a table of true/false",
        check=_switches,
        shown="its parser's",
        doc="the DPS features announced",
    )
    # The agent's tools before it reports them: the first tool.catalog.publish (the parser's
    # ``ParserSpec.tools`` unless a built-in profile knows its flags change them).
    tools: tuple[str, ...] = ()
    # The kinds of MCP server it takes (docs/mcp.md); None: its parser's (gateway/agent/mcp.py).
    mcp_kinds: tuple[str, ...] | None = None
    auto_allow: frozenset[str] = setting(
        frozenset(),
        toml=list,
        expected="a list of tool names",
        check=_tool_names,
        doc="tools allowed without asking a master",
    )
    permission_timeout_sec: float = setting(
        60.0, above=0, doc="how long a permission question waits"
    )
    # For a prompt too long for argv (MAX_ARGV_PROMPT_BYTES): what replaces the argument holding
    # ``{prompt}`` ("" drops it) while the prompt is written to stdin. None: refused.
    stdin_prompt_arg: str | None = setting(
        None, toml=str, doc="replaces {prompt} for a prompt sent on stdin"
    )
    # The stall watchdog (0: off): silence in a turn after which masters are warned, and after
    # which the turn ends with error and the agent is restarted. Long enough for a silent tool.
    stall_warning_sec: float = setting(
        DEFAULT_STALL_WARNING_SEC,
        low=0,
        high=MAX_STALL_SEC,
        doc="silence before AGENT_STALLED; 0: off",
    )
    stall_timeout_sec: float = setting(
        DEFAULT_STALL_TIMEOUT_SEC,
        low=0,
        high=MAX_STALL_SEC,
        doc="silence before it is stopped; 0: off",
    )
    description: str = setting("", doc="shown by GET /v1/agents")
    # Whether the agent's own saved conversations are listed and resumed (gateway/agent/conversations/),
    # where its parser can read them: off for a program that speaks another agent's format.
    conversations: bool = setting(True, doc="its saved conversations listed and continued")
    # The agent reports what it costs (session.usage's cost): budgets count it (docs/budgets.md).
    # One that does not is unbudgeted, and said to be so. A new profile's default is its
    # parser's (gateway/config/agents.py).
    reports_cost: bool = setting(
        False, shown="`true` for the `claude-code` parser", doc="budgets count what it costs"
    )

    @property
    def prompt_in_argv(self) -> bool:
        """The prompt goes on the command line (``{prompt}`` in ``command``), not on stdin."""
        return any("{prompt}" in arg for arg in self.command)

    def public(self, features: Features | None = None) -> dict[str, Any]:
        """What ``GET /v1/agents`` shows (docs/http-api.md); ``features``: what the agent
        itself declared, when it did (ACP), instead of the profile's."""
        shown = msgspec.to_builtins(
            msgspec.structs.replace(features or self.features, adapter_type="process")
        )
        return {
            "name": self.name,
            "adapter_type": "process",
            "single_turn_process": self.single_turn_process,
            "resume_flag": self.resume_flag,
            "resume_command": list(self.resume_command) if self.resume_command else None,
            "features": shown,
            "parser": self.parser,
            "description": self.description,
            # GET /v1/agents/{agent}/conversations answers for it (gateway/agent/conversations/)
            "conversations": self.conversations
            and (self.parser == "acp" or get_parser(self.parser).saved is not None),
            # budgets count only the cost an agent reports (docs/budgets.md)
            "reports_cost": self.reports_cost,
            "unbudgeted": not self.reports_cost,
        }


FEATURE_NAMES: Final = frozenset(Features.__struct_fields__) - {"adapter_type"}


def parser_features(parser: str) -> Features:
    """The DPS features the agent behind ``parser`` supports (its ``ParserSpec.features``), on;
    KeyError when no parser has that name, ValueError when it declares a name DPS does not have."""
    declared = get_parser(parser).features
    unknown = sorted(set(declared) - FEATURE_NAMES)
    if unknown:
        raise ValueError(f"parser {parser!r} declares unknown features {', '.join(unknown)}")
    # Any, not bool: mypy cannot see that adapter_type (not a bool) is not among the names, which
    # were checked against FEATURE_NAMES above.
    on: dict[str, Any] = dict.fromkeys(declared, True)
    return Features(**on)


_READ_ONLY_TOOLS = frozenset({"Read", "Glob", "Grep", "LS", "NotebookRead", "TodoWrite"})
_CLAUDE_OVERRIDES = {
    "allowed_tools": "--allowedTools",
    "denied_tools": "--disallowedTools",
    "max_turns": "--max-turns",
}


# Codex's own sandbox is off (docs/codex-mapping.md, "Codex's sandbox"): with a system bwrap older
# than 0.9 (Debian 12, Ubuntu 22.04) Codex 0.171 runs its helper by the name codex-linux-sandbox,
# found only through a PATH alias it refuses to make when its home is under the temp dir, so every
# command failed; inside the gateway's own sandbox ([isolation] mode = "sandbox") it is redundant
# and needs user namespaces nested in ours. `exec` never asks for approval, with or without it, so
# no question is lost. `exec resume` has no --sandbox option: the config override, which both
# take, says it.
_CODEX_SANDBOX_OFF: Final = ("-c", "sandbox_mode=danger-full-access")
_CODEX_FLAGS = ("--json", "--skip-git-repo-check", *_CODEX_SANDBOX_OFF)
# codex-acp (Codex's core underneath) with its sandbox off as above, asking before every command
# that is not on Codex's list of known-safe read-only ones and before every file change, where with
# its sandbox it ran commands without asking and asked only to go beyond the sandbox: a master
# answers each (session/request_permission). A config override, not one of codex-acp's modes.
_CODEX_ACP_FLAGS: Final = (*_CODEX_SANDBOX_OFF, "-c", "approval_policy=untrusted")


def builtin_profiles(
    claude: str = "claude",
    *,
    codex: str = "codex",
    gemini: str = "gemini",
    claude_acp: str = "claude-agent-acp",
    codex_acp: str = "codex-acp",
) -> dict[str, AgentProfile]:
    """The profiles every gateway has; a configured profile of the same name replaces one."""
    stream = ("--output-format", "stream-json", "--verbose")
    claude_features = parser_features("claude-code")
    claude_tools = get_parser("claude-code").tools
    # With the prompt in argv and no permission prompt tool, 2.1.328 offers no AskUserQuestion,
    # EnterPlanMode or ExitPlanMode.
    oneshot_tools = tuple(
        t for t in claude_tools if t not in {"AskUserQuestion", "EnterPlanMode", "ExitPlanMode"}
    )
    return {
        "claude-code": AgentProfile(
            name="claude-code",
            parser="claude-code",
            command=(
                claude,
                "-p",
                "--input-format",
                "stream-json",
                *stream,
                "--include-partial-messages",
                "--permission-prompt-tool",
                "stdio",
            ),
            resume_flag="--resume {session_id}",
            mode_flag="--permission-mode {mode}",
            features=claude_features,
            tools=claude_tools,
            auto_allow=_READ_ONLY_TOOLS,
            reports_cost=True,  # total_cost_usd
            description="Claude Code, one long-lived process per session, prompts on stdin",
        ),
        "claude-code-oneshot": AgentProfile(
            name="claude-code-oneshot",
            parser="claude-code",
            # "--": a prompt that starts with "-" (a Markdown list) is still the prompt.
            command=(claude, "-p", *stream, "--", "{prompt}"),
            single_turn_process=True,
            stdin_prompt_arg="",  # -p without a prompt reads it from stdin
            resume_flag="--resume {session_id}",
            mode_flag="--permission-mode {mode}",
            override_flags=_CLAUDE_OVERRIDES,
            # No permission prompts without a stdin stream: tools needing approval are refused
            # by the CLI itself, and seen by masters as error results.
            features=claude_features,
            tools=oneshot_tools,
            reports_cost=True,
            description="Claude Code, one process per prompt, resumed with --resume",
        ),
        "demo": AgentProfile(
            name="demo",
            parser="claude-code",
            command=(
                sys.executable,
                "-m",
                "gateway.demo_agent",
                "--permission-prompt-tool",
                "stdio",
                "--include-partial-messages",
            ),
            # Resumed as Claude Code is, so a session restored after a restart keeps its agent's
            # session id (docs/persistence.md).
            resume_flag="--resume {session_id}",
            # The demo agent speaks Claude Code's stream-json but runs no subagents.
            features=msgspec.structs.replace(claude_features, subagent=None, subagent_context=None),
            tools=DEMO_TOOLS,
            auto_allow=frozenset({"Read", "Glob", "Grep"}),
            conversations=False,  # it keeps none: Claude Code's store is not its own
            mcp_kinds=(),  # it speaks Claude Code's stream-json, but takes none of its flags
            reports_cost=True,  # what "spend N" says it spent
            description="The embedded demo agent (speaks Claude Code's stream-json; no network)",
        ),
        "codex": AgentProfile(
            name="codex",
            parser="codex",
            # "--": a prompt that starts with "-" is still the prompt, not an option.
            command=(codex, "exec", *_CODEX_FLAGS, "--", "{prompt}"),
            single_turn_process=True,
            stdin_prompt_arg="-",  # exec (and exec resume) read the prompt from stdin
            # `resume` is a subcommand taking the thread id before the prompt: a flag appended
            # after the prompt cannot say it, so the whole argv is replaced when resuming.
            resume_command=(
                codex,
                "exec",
                "resume",
                *_CODEX_FLAGS,
                "--",
                "{session_id}",
                "{prompt}",
            ),
            image_flag="--image {path}",  # exec and exec resume both take it
            features=parser_features("codex"),
            description="Codex CLI (codex exec --json), one process per prompt, resumed by thread",
        ),
        "gemini": AgentProfile(
            name="gemini",
            parser="gemini",
            # yolo: headless mode cannot ask for approval, and without it the shell and write
            # tools are not even offered to the model. --skip-trust: the workspace is the one the
            # gateway was told to use (without it an untrusted folder exits 55 with no output).
            command=(
                gemini,
                "--output-format",
                "stream-json",
                "--approval-mode",
                "yolo",
                "--skip-trust",
                # One argument: "-p VALUE" would read a prompt starting with "-" as an option.
                "--prompt={prompt}",
            ),
            single_turn_process=True,
            resume_flag="--resume {session_id}",
            stdin_prompt_arg="",  # without --prompt, a piped stdin is the prompt
            features=parser_features("gemini"),
            description="Gemini CLI (gemini --prompt, stream-json), one process per prompt, --resume",
        ),
        **acp_profiles(gemini=gemini, claude_acp=claude_acp, codex_acp=codex_acp),
        "plain": AgentProfile(
            name="plain",
            parser="plain",
            # An example of wrapping any line-oriented program: each stdout line becomes text.
            # Python prints the prompt back, so the profile works wherever the gateway runs;
            # replace the command with the program to wrap ({prompt} is one argument, no shell).
            command=(sys.executable, "-c", "import sys; print(sys.argv[1])", "{prompt}"),
            single_turn_process=True,
            features=parser_features("plain"),
            description="Any line-oriented program: stdout lines become text (example: echo)",
        ),
    }


def acp_profiles(*, gemini: str, claude_acp: str, codex_acp: str) -> dict[str, AgentProfile]:
    """The built-in Agent Client Protocol agents (parser ``acp``): one long-lived process per
    session, prompts as ``session/prompt``. What each agent declares when it starts (its modes,
    image prompts, loadSession) narrows these features at run time."""
    acp = parser_features("acp")
    no_plan = msgspec.structs.replace(acp, plan_mode=None)
    return {
        "gemini-acp": AgentProfile(
            name="gemini-acp",
            parser="acp",
            # Tested with @google/gemini-cli 0.61.0. --skip-trust: the workspace is the one the
            # gateway was told to use; in a folder it does not trust, "allow always" fails the tool.
            command=(gemini, "--acp", "--skip-trust"),
            features=acp,  # modes default, autoEdit, yolo, plan
            description="Gemini CLI through ACP (gemini --acp, tested with 0.61.0)",
        ),
        "claude-acp": AgentProfile(
            name="claude-acp",
            parser="acp",
            command=(claude_acp,),
            features=acp,  # modes default, acceptEdits, plan, ...
            reports_cost=True,  # usage_update's cost
            description="Claude Code through ACP (@zed-industries/claude-agent-acp 0.23.1)",
        ),
        "codex-acp": AgentProfile(
            name="codex-acp",
            parser="acp",
            command=(codex_acp, *_CODEX_ACP_FLAGS),
            features=no_plan,  # no plan mode (its own modes are read-only, auto, full-access)
            description="Codex through ACP (@zed-industries/codex-acp 0.16.0), asking before commands",
        ),
    }


def prompt_on_stdin(profile: AgentProfile, prompt: str | None) -> bool:
    """True when this prompt of an argv profile is too long for argv and the profile can give it
    to the CLI on stdin instead."""
    return (
        prompt is not None
        and profile.prompt_in_argv
        and profile.stdin_prompt_arg is not None
        and len(prompt.encode()) > MAX_ARGV_PROMPT_BYTES
    )


def command_for(
    profile: AgentProfile,
    *,
    prompt: str | None,
    workspace: str,
    resume_id: str | None = None,
    on_stdin: bool = False,
) -> list[str]:
    """argv from the profile's template: ``{prompt}`` as one argument (or inside one, as in
    ``--prompt={prompt}``), ``{workspace}`` replaced.

    With ``resume_id`` and a ``resume_command``, that template is used instead, its
    ``{session_id}`` argument being the id (``resume_flag`` is the caller's to append otherwise).
    ``on_stdin``: the prompt goes to stdin; the argument holding it becomes ``stdin_prompt_arg``
    (none when that is empty).
    """
    template = profile.command
    if resume_id is not None and profile.resume_command:
        template = profile.resume_command
    argv: list[str] = []
    for arg in template:
        if on_stdin and "{prompt}" in arg:
            if profile.stdin_prompt_arg:
                argv.append(profile.stdin_prompt_arg)
        elif arg == "{prompt}":
            argv.append(prompt or "")
        elif "{prompt}" in arg:  # e.g. "--prompt={prompt}": still exactly one argument
            argv.append(arg.replace("{prompt}", prompt or ""))
        elif arg == "{session_id}" and resume_id is not None:
            argv.append(resume_id)  # whole arguments only, like {prompt}: never split or joined
        else:
            argv.append(arg.replace("{workspace}", workspace))
    return argv


def template_args(template: str, **values: str) -> list[str]:
    """A flag template such as ``--resume {session_id}``, split on spaces, then filled: a value
    never becomes more than one argument."""
    return [part.format(**values) for part in shlex.split(template)]
