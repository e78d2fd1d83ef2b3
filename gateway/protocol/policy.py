"""Permission policies: the rules a team writes once, and the decision they give a tool call, sans-IO.

A ``Rule`` (``[[policy.rules]]`` of docs/policies.md, read by gateway/config/policy.py) names
the tools it covers (globs on the tool's name; an ACP tool call's title or kind too), globs on
fields of the tool's input (``match``), the owner roles and agent profiles it is limited to, and
its decision: ``allow``, ``deny`` or ``ask``. ``decide`` walks the rules in order and returns the
first that matches (``Decision``), or None: then the profile's ``auto_allow`` and, after it, a
master decide, as without rules. Nothing here reads a clock, a file or a socket: the session
machine calls ``decide`` on the permission path (never per line), and so does
``GET /v1/policy/decide``.

A ``command`` field is judged by the simple commands of the line (gateway/protocol/command_line.py,
tree-sitter's bash grammar): a ``deny`` or ``ask`` holds when any of them matches, an ``allow``
when every one does and nothing in the line is opaque. A path field is judged where it leads:
made absolute against the workspace and normalized here (``where_path``), and where the shell
found it leads on the disk, symlinks followed (``paths``, gateway/session/tool_paths.py); a deny
or ask holds when either form matches, an allow when both do. For a list, a deny or ask holds
when some entry matches, an allow when every one does (``Judged``, ``_hits``, ``_allows``).

Globs are ``fnmatch``'s (``*`` crosses ``/``), compiled once; on Python 3.11 their ``*`` becomes
an atomic group, so a glob cannot backtrack exponentially, and a field longer than
``MAX_MATCH_CHARS`` is not matched at all: it is too long to judge, so a rule that needs it
applies when it denies or asks and never when it allows (a padded command cannot slip past a
``deny``). ``{workspace}`` in a glob is the session's workspace (its own glob characters escaped),
compiled once per workspace and kept (``MAX_WORKSPACES`` of them).

A rule's fields declare its keys (``setting``, gateway/setting.py), with the checks of what the file may say: every size is bounded
before it is looked at (globs and match fields in a rule, roles and agents, the length of each
name, glob and message), so a hostile file is refused in time and memory the bounds allow.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.protocol.command_line import read_line
from gateway.setting import setting

__all__ = [
    "DECISIONS",
    "MAX_GLOB_CHARS",
    "MAX_MATCH_CHARS",
    "PATH_FIELDS",
    "SHELL_FIELDS",
    "WORKSPACE",
    "Decision",
    "Glob",
    "Judged",
    "Rule",
    "decide",
    "is_rule_name",
    "where_path",
]

DECISIONS: Final = ("allow", "deny", "ask")
WORKSPACE: Final = "{workspace}"
MAX_MATCH_CHARS: Final = 16 * 1024  # of one input field a glob is matched against
MAX_WORKSPACES: Final = 64  # compiled forms of a {workspace} glob kept at once
# Fields a rule may match that come from the request itself when the input has no such field.
REQUEST_FIELDS: Final = ("title", "kind", "locations")
# Fields judged as a shell reads them (Claude Code's Bash, Codex's and Gemini's shell commands,
# an ACP execute call's input), and as paths where the tool touches them.
SHELL_FIELDS: Final = ("command",)
PATH_FIELDS: Final = ("file_path", "path", "notebook_path", "locations")
# What one rule may hold.
MAX_GLOBS: Final = 64  # tools of a rule
MAX_MATCH_FIELDS: Final = 16
MAX_NAMES: Final = 64  # roles, agents of a rule
MAX_GLOB_CHARS: Final = 512
MAX_NAME_CHARS: Final = 128  # a rule's name, a field, a role, an agent
MAX_MESSAGE_CHARS: Final = 1024
_RULE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_NAME_WORDS: Final = f"letters, digits, '.', '_', ':' or '-' (at most {MAX_NAME_CHARS} characters)"
_MESSAGE_WORDS: Final = f"text of at most {MAX_MESSAGE_CHARS} characters"

_GLOB_CHARS: Final = re.compile(r"([*?\[])")

_Matcher = Callable[[str], Any]


def _compile(body: str) -> _Matcher:
    return re.compile(fnmatch.translate(body)).match


class Glob:
    """One glob of a rule: ``!`` in front negates it, ``{workspace}`` is filled in per session."""

    __slots__ = ("_by_workspace", "body", "compiled", "negate", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.negate = text.startswith("!")
        self.body = text[1:] if self.negate else text
        self._by_workspace: dict[str, _Matcher] = {}
        # Compiled now: a glob re cannot take is refused with the rule set, not at a permission.
        self.compiled: _Matcher | None = None if WORKSPACE in self.body else _compile(self.body)
        if self.compiled is None:
            _compile(self.body.replace(WORKSPACE, "w"))

    def for_workspace(self, workspace: str) -> _Matcher:
        """The compiled glob with ``{workspace}`` filled in."""
        if self.compiled is not None:
            return self.compiled
        found = self._by_workspace.get(workspace)
        if found is None:
            if len(self._by_workspace) >= MAX_WORKSPACES:
                self._by_workspace.clear()
            escaped = _GLOB_CHARS.sub(r"[\1]", workspace)
            found = self._by_workspace[workspace] = _compile(self.body.replace(WORKSPACE, escaped))
        return found

    def hits(self, value: str, workspace: str) -> bool:
        """The glob (negated or not) says yes to ``value``."""
        return ((self.compiled or self.for_workspace(workspace))(value) is not None) != self.negate

    def __repr__(self) -> str:
        return f"Glob({self.text!r})"


def is_rule_name(value: Any) -> bool:
    return (
        isinstance(value, str)
        and len(value) <= MAX_NAME_CHARS
        and bool(_RULE_NAME.fullmatch(value))
    )


def _show(value: Any) -> str:
    """A value quoted for an error message, cut: the file may be hostile."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _name(value: str, name: str) -> str:
    if not is_rule_name(value):
        raise ValueError(f"{name} must be {_NAME_WORDS}, got {_show(value)}")
    return value


def _glob(value: Any, what: str) -> Glob:
    if not isinstance(value, str) or not value.lstrip("!"):
        raise ValueError(f"{what}: a glob must be non-empty text, got {_show(value)}")
    if len(value) > MAX_GLOB_CHARS:
        raise ValueError(f"{what}: a glob is at most {MAX_GLOB_CHARS} characters, got {len(value)}")
    try:
        return Glob(value)
    except (re.error, RecursionError, OverflowError) as err:
        raise ValueError(f"{what}: not a usable glob {_show(value)}: {err}") from None


def _globs(value: list[Any], name: str) -> tuple[Glob, ...]:
    if len(value) > MAX_GLOBS:
        raise ValueError(f"{name} may list at most {MAX_GLOBS} entries")
    return tuple(_glob(g, name) for g in value)


def _match(value: dict[str, Any] | tuple[()], name: str) -> tuple[tuple[str, Glob], ...]:
    if not value:  # the file's {} or the default's ()
        return ()
    if len(value) > MAX_MATCH_FIELDS:
        raise ValueError(f"{name} may name at most {MAX_MATCH_FIELDS} fields")
    fields = []
    for field_name, glob in value.items():
        if len(field_name) > MAX_NAME_CHARS:
            raise ValueError(f"{name} field names are at most {MAX_NAME_CHARS} characters")
        fields.append((field_name, _glob(glob, f"{name}.{field_name}")))
    return tuple(fields)


def _names(value: list[Any], name: str) -> frozenset[str]:
    if len(value) > MAX_NAMES:
        raise ValueError(f"{name} may list at most {MAX_NAMES} entries")
    for entry in value:
        if not isinstance(entry, str) or not entry or len(entry) > MAX_NAME_CHARS:
            raise ValueError(
                f"{name} must be names of at most {MAX_NAME_CHARS} characters, got {_show(entry)}"
            )
    return frozenset(value)


# roles and agents: names, or none (any)
_NAMES: Final = {"toml": list, "expected": "a list of names", "check": _names, "shown": "any"}


def _message(value: str, name: str) -> str:
    if len(value) > MAX_MESSAGE_CHARS:
        raise ValueError(f"{name} must be {_MESSAGE_WORDS}")
    return value


@dataclass(frozen=True, slots=True)
class Rule:
    """One ``[[policy.rules]]`` entry (docs/policies.md): each field declares its key
    (gateway/setting.py); gateway/config/policy.py reads the file's rules into them."""

    name: str = setting(
        expected=_NAME_WORDS, check=_name, doc="unique; in the audit log and metadata.rawp_policy"
    )
    decision: str = setting(choices=DECISIONS, doc="what the rule answers")
    tools: tuple[Glob, ...] = setting(  # none: every tool
        (),
        toml=list,
        expected="a list of globs",
        check=_globs,
        doc="globs on the tool's name (ACP: also its title or kind)",
    )
    match: tuple[tuple[str, Glob], ...] = setting(  # (field, glob): every one must hold
        (),
        toml=dict,
        expected="a table of field = glob",
        check=_match,
        shown="`{}`",
        doc="globs on the tool's input",
    )
    roles: frozenset[str] | None = setting(  # None: any owner
        None, **_NAMES, doc="only sessions whose owner has one of these roles"
    )
    agents: frozenset[str] | None = setting(None, **_NAMES, doc="only these profiles")  # None: any
    message: str = setting(
        "", expected=_MESSAGE_WORDS, check=_message, doc="what the agent is told on deny"
    )


@dataclass(frozen=True, slots=True)
class Decision:
    decision: str
    rule: Rule

    @property
    def name(self) -> str:
        return self.rule.name


def decide(
    rules: Sequence[Rule],
    *,
    tool: str,
    tool_input: Mapping[str, Any],
    agent: str,
    role: str | None,
    workspace: str,
    title: str | None = None,
    kind: str | None = None,
    locations: Sequence[str] = (),
    paths: Mapping[str, str] | None = None,
) -> Decision | None:
    """The first rule that matches this tool call, or None (then auto_allow, then a master).

    ``title``, ``kind`` and ``locations`` are what an ACP agent says of its call: the tool globs
    match the name, the title or the kind, and ``match`` may name them as fields. ``paths`` is
    where each path of the call leads on the disk, as the shell read it (``where_path`` with the
    symlinks of the part that exists followed); None: nobody read the disk, the paths are judged
    as written, made absolute and normalized."""
    names = [n for n in (tool, title, kind) if n]
    # Rules share globs and fields: each is judged once per decision (a set of 1,000 rules
    # naming the same few tools costs one glob per rule, not three).
    tool_hits: dict[str, bool] = {}
    fields: dict[str, tuple[Judged, ...]] = {}
    for rule in rules:
        if rule.agents is not None and agent not in rule.agents:
            continue
        if rule.roles is not None and role not in rule.roles:
            continue
        if rule.tools:
            for glob in rule.tools:
                hit = tool_hits.get(glob.text)
                if hit is None:
                    hit = tool_hits[glob.text] = any(glob.hits(n, workspace) for n in names)
                if hit:
                    break
            else:
                continue
        allow = rule.decision == "allow"
        for name, glob in rule.match:
            values = fields.get(name)
            if values is None:
                values = fields[name] = _values(
                    name, tool_input, title, kind, locations, workspace, paths
                )
            if not values or not (_allows if allow else _hits)(glob, values, workspace):
                break  # the field does not hold: the rule does not match
        else:
            return Decision(rule.decision, rule)
    return None


@dataclass(frozen=True, slots=True)
class Judged:
    """One value of a field as the rules judge it: the forms a glob is matched against (a shell
    line's simple commands, a path as written and where it leads), or None when the value cannot
    be judged (not text, too long, a path from the home directory); ``allowable``: an allow may
    hold for it (nothing opaque in the line, the path's place on the disk known)."""

    forms: tuple[str, ...] | None
    allowable: bool = True


def _hits(glob: Glob, values: tuple[Judged, ...], workspace: str) -> bool:
    """A deny or an ask: some value has some form the glob says yes to, or cannot be judged."""
    match = glob.compiled or glob.for_workspace(workspace)
    for value in values:
        if value.forms is None:
            return True
        for form in value.forms:
            if (match(form) is None) is glob.negate:
                return True
    return False


def _allows(glob: Glob, values: tuple[Judged, ...], workspace: str) -> bool:
    """An allow: the glob says yes to every form of every value, each one allowable."""
    match = glob.compiled or glob.for_workspace(workspace)
    for value in values:
        if value.forms is None or not value.allowable or not value.forms:
            return False
        for form in value.forms:
            if (match(form) is None) is not glob.negate:
                return False
    return True


_UNJUDGED: Final = Judged(None, False)


def where_path(text: str, workspace: str) -> str | None:
    """Where a tool's path leads, by its text alone: made absolute against the workspace, ``.``,
    ``..`` and repeated ``/`` resolved. None for a path from a home directory (``~``: whose home
    the text does not say) or with a NUL."""
    if not text or text[0] == "~" or "\0" in text:
        return None
    joined = posixpath.normpath(posixpath.join(workspace, text) if workspace else text)
    return "/" + joined.lstrip("/") if joined.startswith("//") else joined


def _path(value: str, workspace: str, paths: Mapping[str, str] | None) -> Judged:
    written = where_path(value, workspace)
    if written is None:
        return _UNJUDGED
    if paths is None:
        return Judged((written,))
    real = paths.get(value)
    if real is None:  # the shell could not say where it leads: as a value too long to judge
        return _UNJUDGED
    return Judged((written,) if real == written else (written, real))


def _command(value: str) -> Judged:
    line = read_line(value)
    if line.too_big:
        return _UNJUDGED
    if not line.parsed:
        return Judged((value,), False)
    return Judged(line.parts, not line.opaque)


def _values(
    name: str,
    tool_input: Mapping[str, Any],
    title: str | None,
    kind: str | None,
    locations: Sequence[str],
    workspace: str,
    paths: Mapping[str, str] | None,
) -> tuple[Judged, ...]:
    """What a ``match`` field names, judged: the input's field (a string, or each string of a
    list), else the request's title, kind or locations. A shell command is read by its simple
    commands (gateway/protocol/command_line.py), a path where it leads."""
    value = tool_input.get(name)
    if value is None:
        if name == "title":
            value = title
        elif name == "kind":
            value = kind
        elif name == "locations":
            value = list(locations) or None
    if value is None:
        return ()
    if name in SHELL_FIELDS and isinstance(value, list) and all(isinstance(a, str) for a in value):
        value = shlex.join(value)  # an argv: judged as the line that runs it
    out = []
    for one in value if isinstance(value, list) else (value,):
        if one.__class__ is not str or len(one) > MAX_MATCH_CHARS:
            out.append(_UNJUDGED)  # not text, or too long to judge
        elif name in SHELL_FIELDS:
            out.append(_command(one))
        elif name in PATH_FIELDS:
            out.append(_path(one, workspace, paths))
        else:
            out.append(Judged((one,)))
    return tuple(out)
