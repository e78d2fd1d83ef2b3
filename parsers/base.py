"""What an agent parser is, and how the gateway finds one by name.

Theory of operation
-------------------
An agent speaks two directions. ``AgentParser`` is the stdout side: a sans-IO object fed one line
at a time (``feed``) that returns normalised events (``parsers/events.py``), plus ``end()`` when
stdout closes. ``AgentInput`` is the stdin side: it encodes what the gateway must tell the agent
(a prompt, an interrupt, a permission answer, a mode change) as bytes to write, or ``None`` when the
agent has no way to hear it (then the session machine uses a signal or a respawn instead).
An input that a SIGINT would stop rather than interrupt (ACP agents) says
``sigint_on_cancel = False``: a cancel then writes its ``interrupt`` and sends no signal.
An input whose prompts can carry images says so with ``accepts_images = True`` and takes them as
``prompt(text, images=[PromptImage, ...])`` (Claude Code: image blocks in the stream-json user
message); the gateway passes ``images`` only to such an input.

An ``AgentInput`` may also have ``initialize(request_id)``: bytes that make a long-lived agent
say what it has (its commands, answered as ``CommandsListed``) right after it starts, before any
prompt; the session machine writes them when it spawns the process. Claude Code prints its own
``init`` only when a prompt starts a run.

A parser may also name the agent's exit codes: an optional ``describe_exit(returncode)`` method
returning ``(error_code, message)`` (or None for "nothing to add"). The session machine asks it when
the process ends with a non-zero code, so a CLI that encodes an HTTP status or a reason of its own
in its exit code (Gemini: 400 -> 144, 41 = auth) surfaces as ``agent.error`` ``API_BAD_REQUEST`` or
``AUTH_ERROR`` rather than a bare "exit code 144". It is a method of the parser, not a table,
because the parser has seen the run: the message can quote the agent's last error.

A parser that reads files the agent names (Codex and Gemini diff the files their tools change,
``file_changes.py``) has an optional ``set_workspace(workspace)`` method (``ReadsWorkspace``): the
gateway calls it once, right after making the parser, with the session's workspace, which is the
agent's cwd. The parser then reads paths as the agent sees them (a relative path from the
workspace) and only inside it. A parser without the method is made as before; one with it that is
never told (a transcript: ``translate``) reads nothing.

An agent that converses (ACP: it asks the gateway things and must be answered) is one object that
is both parser and input (``ParserSpec.converses``; ``make()`` gives it twice): its ``opening``
is written when the process starts, and ``feed`` returns ``StdinWrite`` events for its answers.

These optional capabilities (``describe_exit``, ``set_workspace``, ``initialize``, ``opening``,
``set_mcp_servers``, ``accepts_images`` with ``prompt(text, images=...)``, ``sigint_on_cancel``)
are named by the protocols below and found once, when a session makes its parser and input
(``ParserSpec.plugin()``, ``AgentPlugin.of``): a method of that name, or the flag, is the
capability, as the documentation has always promised a third-party parser. The gateway then calls
what ``AgentPlugin`` holds and never asks an object again what it can do.

A parser or input that raises anyway (a bug in a plugin: the protocols say "never raises on bad
input") does not hang its session: the shell catches it and the session machine ends the turn
with ``agent.error`` ``PARSER_FAILED`` (the exception's type and message, never its traceback) to
every master and stops the agent (``SessionMachine.plugin_failed``); the session goes on, and
its next process is read by a fresh parser and input from the ``ParserSpec``. The gateway log
has the traceback.

A parser may come with a reader of the conversations its agent saves (``ParserSpec.saved``, a
``parsers.saved.SavedFormat``): what lets the gateway list them and replay one it resumes.

A ``ParserSpec`` bundles the two factories under a name, with ``features``: the DPS features
(names of ``Features`` fields of DPS §12.2, e.g. ``thinking_stream``, ``plan_mode``) the agent
behind this parser supports. A profile using the parser announces them unless its configuration
says otherwise, so a profile of one's own does not silently lose what the agent can do. ``get(name)`` finds built-in parsers and
third-party ones registered under the ``rawp_gateway.parsers`` entry-point group, whose object is a
``ParserSpec``::

    [project.entry-points."rawp_gateway.parsers"]
    my-agent = "my_package.parser:SPEC"
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import entry_points
from typing import Any, ClassVar, Protocol, cast

import msgspec

from .events import AgentEvent, OddNumbers, ParseError, Unknown
from .json_depth import MAX_AGENT_LINE_DEPTH, too_deep
from .numbers import without_odd_numbers
from .saved import SavedFormat

__all__ = [
    "ENTRY_POINT_GROUP",
    "AgentInput",
    "AgentParser",
    "AgentPlugin",
    "DescribesExit",
    "ExitDescription",
    "Initializes",
    "JsonLinesParser",
    "NoInput",
    "Opens",
    "ParserSpec",
    "PromptImage",
    "PromptWithImages",
    "ReadsWorkspace",
    "TakesImages",
    "TakesMcpServers",
    "available",
    "elapsed_ms",
    "get",
]

ENTRY_POINT_GROUP = "rawp_gateway.parsers"


class AgentParser(Protocol):
    def feed(self, line: bytes) -> list[AgentEvent]:
        """Events for one stdout line (without its newline). Never raises on bad input."""
        ...

    def end(self) -> list[AgentEvent]:
        """Stdout closed: events for anything still pending."""
        ...


# (error_code, message) for an exit code: e.g. ("API_BAD_REQUEST", "the model API answered 400 ...")
ExitDescription = tuple[str, str]


class DescribesExit(Protocol):
    """Optional on an ``AgentParser``: what a non-zero exit code of this agent means."""

    __slots__ = ()  # a slotted class that names it stays slotted

    def describe_exit(self, returncode: int) -> ExitDescription | None:
        """``(error_code, message)`` for ``agent.error``, or None to keep the generic one."""
        ...


class ReadsWorkspace(Protocol):
    """Optional on an ``AgentParser``: told the session's workspace (the agent's cwd) once, right
    after it is made, before any line. A parser that reads the paths its agent names reads them
    there, and only there; untold, it reads nothing."""

    __slots__ = ()  # a slotted class that names it stays slotted

    def set_workspace(self, workspace: str) -> None: ...


@dataclass(frozen=True, slots=True)
class PromptImage:
    """An image a master attached to a prompt (an uploaded screenshot): its bytes and MIME type."""

    mime_type: str
    data: bytes


class Initializes(Protocol):
    """Optional on an ``AgentInput``: what to write at spawn so the agent lists its commands."""

    __slots__ = ()  # a slotted class that names it stays slotted

    def initialize(self, request_id: str) -> bytes | None: ...


class AgentInput(Protocol):
    """Bytes to write on the agent's stdin, or None where the agent cannot be told."""

    def prompt(self, text: str) -> bytes | None:
        """The prompt; an input with ``accepts_images = True`` also takes ``images=[...]``."""
        ...

    def interrupt(self, request_id: str) -> bytes | None: ...

    def permission(
        self,
        request_id: str,
        *,
        allow: bool,
        message: str = "",
        updated_input: dict[str, Any] | None = None,
    ) -> bytes | None:
        """The answer to a ``PermissionRequest``. One that came with the agent's own ``options``
        is answered with ``option=`` too: the option chosen, None for a timeout or a cancel."""
        ...

    def set_mode(self, request_id: str, mode: str) -> bytes | None: ...


class Opens(Protocol):
    """Optional on an ``AgentInput`` of an agent that converses (ACP): what to write each time its
    process starts (a handshake, resuming ``resume_id`` where the agent can), or None."""

    __slots__ = ()  # a slotted class that names it stays slotted

    def opening(self, resume_id: str | None) -> bytes | None: ...


class TakesMcpServers(Protocol):
    """Optional on an ``AgentInput`` of an agent that is handed MCP servers in its own protocol
    (ACP's ``session/new`` and ``session/load``): told the session's servers once, right after it
    is made, in that protocol's shapes; it offers the agent those of the kinds it declares and
    reports the others (``SessionStarted.mcp_servers``)."""

    __slots__ = ()  # a slotted class that names it stays slotted

    def set_mcp_servers(self, servers: Sequence[Mapping[str, Any]]) -> None: ...


class TakesImages(Protocol):
    """Optional on an ``AgentInput`` that says ``accepts_images = True``: its prompt also takes
    the images a master attached (passed by keyword, only to such an input)."""

    __slots__ = ()  # a slotted class that names it stays slotted

    def prompt(self, text: str, *, images: Sequence[PromptImage] = ()) -> bytes | None: ...


# ``AgentPlugin.prompt_with_images``: the prompt's text and its images, by position.
PromptWithImages = Callable[[str, Sequence[PromptImage]], "bytes | None"]


@dataclass(frozen=True, slots=True)
class AgentPlugin:
    """A session's parser and input, with what they can do beyond ``AgentParser`` and
    ``AgentInput`` found once (``of``): each optional method is here or None, so the gateway calls
    it or does without, and never looks it up again per call."""

    parser: AgentParser
    input: AgentInput
    describe_exit: Callable[[int], ExitDescription | None] | None = None  # DescribesExit
    set_workspace: Callable[[str], None] | None = None  # ReadsWorkspace
    initialize: Callable[[str], bytes | None] | None = None  # Initializes
    opening: Callable[[str | None], bytes | None] | None = None  # Opens
    set_mcp_servers: Callable[[Sequence[Mapping[str, Any]]], None] | None = None  # TakesMcpServers
    # TakesImages: the prompt with its images; None when the input takes none.
    prompt_with_images: PromptWithImages | None = None
    # False: a cancel writes the input's interrupt and sends no SIGINT (ACP agents).
    sigint_on_cancel: bool = True

    @property
    def accepts_images(self) -> bool:
        return self.prompt_with_images is not None

    @classmethod
    def of(cls, parser: AgentParser, agent_input: AgentInput) -> AgentPlugin:
        """The capabilities of ``parser`` and ``agent_input``, by the names the protocols give them
        (duck typing: a class need not name the protocols; the built-in ones do, for mypy)."""
        images = None
        if getattr(agent_input, "accepts_images", False):
            images = _prompt_with_images(cast(TakesImages, agent_input))
        return cls(
            parser,
            agent_input,
            describe_exit=getattr(parser, "describe_exit", None),
            set_workspace=getattr(parser, "set_workspace", None),
            initialize=getattr(agent_input, "initialize", None),
            opening=getattr(agent_input, "opening", None),
            set_mcp_servers=getattr(agent_input, "set_mcp_servers", None),
            prompt_with_images=images,
            sigint_on_cancel=bool(getattr(agent_input, "sigint_on_cancel", True)),
        )


def _prompt_with_images(agent_input: TakesImages) -> PromptWithImages:
    # By keyword, as the documentation says an input takes them (``images`` may be keyword-only).
    def prompt(text: str, images: Sequence[PromptImage]) -> bytes | None:
        return agent_input.prompt(text, images=images)

    return prompt


MAX_LINE_IN_EVENT = 1024  # a ParseError keeps at most this much of its line
# An event names a line's kind with at most this many characters of it: real ones are short
# (``system/task_notification``), and the name goes into logs and ``agent.raw`` frames beside the
# line itself, which a line of any size could otherwise double.
MAX_KIND_CHARS = 128


class _Kind(msgspec.Struct):
    type: str = ""


_kind_decoder = msgspec.json.Decoder(_Kind)


def refused_line(line: bytes, err: Exception, known_kinds: Container[str]) -> ParseError | Unknown:
    """What a line is when a parser's typed decoder refused it: not a JSON object, or a kind the
    parser knows in the wrong shape (``ParseError``, with the line's first KiB), or well-formed JSON
    of a ``type`` it does not know (``Unknown``, the whole line, which can be forwarded as it is)."""
    try:
        kind = _kind_decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ParseError(message=f"not a JSON object: {err}", line=bytes(line[:MAX_LINE_IN_EVENT]))
    name = kind.type[:MAX_KIND_CHARS]
    if kind.type in known_kinds:
        message = f"malformed {name} line: {err}"
        return ParseError(message=message, line=bytes(line[:MAX_LINE_IN_EVENT]))
    return Unknown(kind=name or "?", line=bytes(line))


def elapsed_ms(started: str | None, ended: str | None) -> int | None:
    """Milliseconds between two ISO 8601 timestamps an agent printed (a tool call's and its
    result's: the core reads no clock). None when either is missing or unreadable, when one has a
    time zone and the other not, or when the second is the earlier."""
    if not started or not ended:
        return None
    try:
        elapsed = datetime.fromisoformat(ended) - datetime.fromisoformat(started)
    except (ValueError, TypeError):
        return None
    ms = round(elapsed.total_seconds() * 1000)
    return ms if ms >= 0 else None


class JsonLinesParser:
    """Base of the JSON-lines parsers: counts the lines they could not use (tests and logs read
    ``parse_errors`` and ``unknown_lines``) and says what a refused line was."""

    __slots__ = ("parse_errors", "unknown_lines")
    KNOWN_KINDS: ClassVar[Container[str]] = ()

    def __init__(self) -> None:
        self.parse_errors = 0
        self.unknown_lines = 0

    def feed(self, line: bytes) -> list[AgentEvent]:
        raise NotImplementedError

    def _refused(self, line: bytes, err: Exception) -> list[AgentEvent]:
        """A line the typed decoder refused: read again when all that was wrong is a number
        msgspec cannot decode (``NaN``, ``1e400``: ``parsers/numbers.py``), with those numbers as
        null and an ``OddNumbers`` note first; else what ``_undecodable`` makes of it. A result
        line with an odd cost must still end its turn."""
        again = self._read_again(line, err)
        return self._undecodable(line, err) if again is None else again

    def _read_again(self, line: bytes, err: Exception) -> list[AgentEvent] | None:
        """``_refused``'s second reading; None when the line has no odd number to drop."""
        again = without_odd_numbers(line) if isinstance(err, msgspec.DecodeError) else None
        if again is None:
            return None
        fixed, names = again
        try:
            kind = _kind_decoder.decode(fixed).type[:MAX_KIND_CHARS]
        except (msgspec.DecodeError, msgspec.ValidationError):
            kind = ""  # an ACP message has no type
        return [OddNumbers(kind=kind or "?", fields=names), *self.feed(fixed)]

    def _undecodable(self, line: bytes, err: Exception) -> list[AgentEvent]:
        if isinstance(err, RecursionError) or too_deep(line, MAX_AGENT_LINE_DEPTH):
            return self._too_deep(line)
        event = refused_line(line, err, self.KNOWN_KINDS)
        if isinstance(event, ParseError):
            self.parse_errors += 1
        else:
            self.unknown_lines += 1
        return [event]

    def _too_deep(self, line: bytes) -> list[AgentEvent]:
        """A line nested deeper than ``MAX_AGENT_LINE_DEPTH``: a ``ParseError``. Its values could
        reach a frame nested past what masters decode, or make msgspec raise RecursionError (very
        deep lines: ``feed`` catches it with the decode errors). Measuring costs about a third of
        a decode, so a parser measures after decoding, once its hot path (lines whose typed
        decoder keeps no free-form JSON, such as a text delta) has returned."""
        self.parse_errors += 1
        message = f"not a usable line: nested deeper than {MAX_AGENT_LINE_DEPTH} levels"
        return [ParseError(message=message, line=bytes(line[:MAX_LINE_IN_EVENT]))]

    def _unknown(self, kind: str, line: bytes) -> list[AgentEvent]:
        # The whole line: it is well-formed JSON and can be forwarded as it is (its length is
        # bounded by the process adapter's line limit).
        self.unknown_lines += 1
        return [Unknown(kind=kind[:MAX_KIND_CHARS], line=bytes(line))]


class NoInput:
    """For agents that take their prompt on the command line and read nothing on stdin."""

    accepts_images: ClassVar[bool] = False

    def prompt(self, text: str) -> bytes | None:
        return None

    def interrupt(self, request_id: str) -> bytes | None:
        return None

    def permission(self, request_id: str, **_: Any) -> bytes | None:
        return None

    def set_mode(self, request_id: str, mode: str) -> bytes | None:
        return None


@dataclass(frozen=True)
class ParserSpec:
    name: str
    parser: Callable[[], AgentParser]
    input: Callable[[], AgentInput] = NoInput
    description: str = ""
    # DPS §12.2 feature names the agent supports; the rest it does not (profiles may narrow).
    features: frozenset[str] = frozenset()
    # The tools the agent offers by default (the tested version, the built-in profile's flags):
    # the first tool.catalog.publish, sent before the agent reports its own list, which replaces it.
    tools: tuple[str, ...] = ()
    # Where the agent reads its credentials (variables, files), said in the hint of an error
    # about them (parsers.api_errors.about_credentials); empty: the agent needs none.
    credentials: str = ""
    # The agent converses (ACP): one object is parser and input at once, since what was asked
    # decides what an answer means. ``make`` then gives that one object twice.
    converses: bool = False
    # The agent's own store of saved conversations (``parsers/saved.py``), made on demand; None:
    # the gateway cannot list or replay this agent's conversations.
    saved: Callable[[], SavedFormat] | None = None

    def make(self) -> tuple[AgentParser, AgentInput]:
        """A parser and an input for one session."""
        if self.converses:
            both = self.parser()
            return both, cast(AgentInput, both)  # the one object is both (see ``converses``)
        return self.parser(), self.input()

    def plugin(self) -> AgentPlugin:
        """A parser and an input for one session, their optional capabilities resolved."""
        return AgentPlugin.of(*self.make())


# Built-ins are found by module path so importing the registry stays cheap.
_BUILTIN: dict[str, str] = {
    "acp": "parsers.acp:SPEC",
    "claude-code": "parsers.claude_code:SPEC",
    "codex": "parsers.codex:SPEC",
    "gemini": "parsers.gemini:SPEC",
    "plain": "parsers.plain:SPEC",
}


def _load(ref: str) -> ParserSpec:
    module, _, attr = ref.partition(":")
    spec = getattr(importlib.import_module(module), attr)
    if not isinstance(spec, ParserSpec):
        raise TypeError(f"{ref} is not a parsers.base.ParserSpec")
    return spec


def available() -> list[str]:
    """Names of every parser that can be loaded: built-in and registered by packages."""
    names = {name for name, ref in _BUILTIN.items() if _importable(ref)}
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def _importable(ref: str) -> bool:
    return importlib.util.find_spec(ref.partition(":")[0]) is not None


def get(name: str) -> ParserSpec:
    """The parser registered as ``name``; KeyError with the known names if there is none."""
    ref = _BUILTIN.get(name)
    if ref is not None and _importable(ref):
        return _load(ref)
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        spec = ep.load()
        if not isinstance(spec, ParserSpec):
            raise TypeError(f"entry point {name!r} ({ep.value}) is not a parsers.base.ParserSpec")
        return spec
    raise KeyError(f"no agent parser named {name!r}; known: {', '.join(available()) or 'none'}")
