"""Normalised agent events: what every agent parser returns, whatever the agent.

Theory of operation
-------------------
A parser (``parsers/claude_code/``, ``parsers/codex/``, ...) is fed one stdout line at a time and
returns a list of these events. They say *what the agent did* in agent-neutral terms and carry the
agent's own identifiers (block keys, tool call ids); turning them into DPS frames (UUIDs, content
indexes, invocation ids, ``output_type``, subagent context, turn frames) is the mapper's job
(``gateway/protocol/mapper.py``), and owning turns, modes and interactions is the session machine's
(``gateway/protocol/machine.py``). So the next agent's parser only has to say what it saw.

Conventions:

* ``parent`` on every event is the agent's id of the subagent call (e.g. Claude Code's
  ``parent_tool_use_id``) the event came from inside; ``None`` for the main agent.
* ``block`` keys are the parser's own, unique within a turn (e.g. ``"msg_01:0"``); the mapper gives
  each block a DPS ``content_index``.
* ``call_id`` is the agent's id of a tool call (e.g. ``toolu_...``); the mapper gives each a UUID v4
  ``invocation_id`` and keeps the agent's id in ``metadata``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "AgentEvent",
    "BinaryData",
    "CommandsListed",
    "Compacted",
    "ControlAck",
    "FeaturesDeclared",
    "McpServer",
    "ModeChanged",
    "Notice",
    "OddNumbers",
    "ParseError",
    "PermissionAnswered",
    "PermissionChoice",
    "PermissionRequest",
    "SessionStarted",
    "SlashCommand",
    "StdinWrite",
    "StoredFile",
    "SubagentEnded",
    "TextDelta",
    "TextEnd",
    "ThinkingDelta",
    "ThinkingEnd",
    "ToolCall",
    "ToolOutput",
    "ToolResult",
    "TurnEnded",
    "Unknown",
    "UsageInfo",
]


class _Value(msgspec.Struct, kw_only=True, gc=False):
    pass


class AgentEvent(msgspec.Struct, kw_only=True):
    """Base of every event. ``parent``: the subagent call this came from inside (None: main agent)."""

    parent: str | None = None


# --- values carried by events -----------------------------------------------------------------


class McpServer(_Value):
    name: str
    status: str  # the agent's word: "connected", "failed", "pending", "needs-auth", ...
    error: str | None = None
    tools: list[str] = []  # the names in SessionStarted.tools that this server provides


class SlashCommand(_Value):
    name: str
    description: str | None = None


class BinaryData(_Value):
    """Binary content a tool returned, as the agent printed it: base64 and its MIME type (Claude
    Code's ``Read`` of an image gives the model an image block). ``path``: the file the tool read,
    as the agent named it, when known."""

    data: str
    mime_type: str
    path: str | None = None


class StoredFile(_Value):
    """A file kept in the session's file store (``gateway/storage/files.py``): what ``agent.file.transfer``
    and a ``binary_ref`` result say about it. The shell fills these in; parsers never do."""

    transfer_id: str
    file_url: str
    file_name: str
    mime_type: str
    size_bytes: int
    checksum: str  # "sha256:<hex>"
    workspace_relative_path: str | None = None


class UsageInfo(_Value):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    thinking_tokens: int | None = None
    # Some agents report only a total for a piece of work (Claude Code's background subagents).
    total_tokens: int | None = None


# --- session ------------------------------------------------------------------------------------


class SessionStarted(AgentEvent):
    """The agent said who it is and what it has (Claude Code's ``system/init``)."""

    agent_session_id: str | None = None
    model: str | None = None
    tools: list[str] = []
    mcp_servers: list[McpServer] = []
    commands: list[SlashCommand] = []
    permission_mode: str | None = None


class CommandsListed(AgentEvent):
    """The agent listed its slash commands outside any turn (Claude Code's answer to the
    ``initialize`` request the gateway sends at spawn), before it says anything else."""

    commands: list[SlashCommand] = []


# --- content ------------------------------------------------------------------------------------


class TextDelta(AgentEvent):
    block: str
    text: str
    role: str | None = None  # "plan" for plan documents (metadata.content_role)


class TextEnd(AgentEvent):
    block: str
    full_text: str | None = None  # the agent's own full text, when it gives one
    cancelled: bool = False  # the block was cut off by an interrupt (agent.text.done is_cancelled)


class ThinkingDelta(AgentEvent):
    block: str
    text: str
    redacted: bool = False


class ThinkingEnd(AgentEvent):
    block: str
    cancelled: bool = False


# --- tools --------------------------------------------------------------------------------------


class ToolCall(AgentEvent):
    """The agent calls a tool. Calls sharing ``group`` were issued together (one API message)."""

    call_id: str
    name: str
    input: dict[str, Any]
    group: str | None = None
    # Set when the call starts a subagent (§10.1).
    subagent_type: str | None = None
    description: str | None = None
    background: bool = False


class ToolOutput(AgentEvent):
    """Output of a running tool (§5.3.2)."""

    call_id: str
    chunk: str
    stream: Literal["stdout", "stderr", "progress"] = "progress"


class ToolResult(AgentEvent):
    """A tool call finished. ``output`` is already in the shape its ``output_type`` promises.

    ``changed`` (a write changed something) and ``listing`` (a search returned paths) feed the
    §5.3.3 rule; ``output_type`` overrides it when the parser knows better (rare).
    """

    call_id: str
    is_error: bool
    output: Any
    tool_name: str | None = None  # when the call itself was never seen
    changed: bool | None = None
    listing: bool = False
    output_type: str | None = None
    duration_ms: int | None = None
    cancelled: bool = False
    # The agent itself kept only part of the output (Claude Code: a Bash output too large is
    # saved to a file and 30000 characters of it are printed).
    truncated: bool = False
    # The call returned at once while its work goes on in the background (a background subagent):
    # its real end is a later SubagentEnded, and the mapper holds this result until then.
    background: bool = False
    # Binary content the tool returned (base64, from the parser). It never reaches a master as
    # is: the shell stores it (gateway/storage/files.py) and replaces it with ``files`` before the session
    # machine sees the event; the mapper then sends agent.file.transfer and a binary_ref result.
    binary: list[BinaryData] = []
    files: list[StoredFile] = []


class SubagentEnded(AgentEvent):
    """A subagent (started by tool call ``call_id``) finished; its own usage, when known."""

    call_id: str
    status: Literal["completed", "failed", "cancelled"]
    duration_ms: int | None = None
    summary: str | None = None
    usage: UsageInfo | None = None


# --- interaction with the host ------------------------------------------------------------------


class PermissionChoice(_Value):
    """One answer an agent offers to its own permission question (ACP ``PermissionOption``):
    its id, its label, and its kind (``allow_once``, ``allow_always``, ``reject_once``,
    ``reject_always``)."""

    option_id: str
    name: str
    kind: str


class PermissionRequest(AgentEvent):
    """The agent asks whether it may run a tool; the answer goes back with ``request_id``.
    ``options``: the agent's own answers (ACP); empty for agents whose answer is allow or deny."""

    request_id: str
    tool_name: str
    input: dict[str, Any]
    call_id: str | None = None
    reason: str | None = None  # e.g. Claude Code's decision_reason_type ("mode", ...)
    affected_paths: list[str] = []
    options: list[PermissionChoice] = []
    title: str | None = None  # how the agent itself describes the call (ACP ``title``)
    kind: str | None = (
        None  # what sort of call the agent says it is (ACP ``kind``: read, edit, ...)
    )
    # Where each path of the call leads on the disk: set by the gateway's shell, never a parser
    # (gateway/session/tool_paths.py), for the permission rules; None: nobody read the disk.
    resolved_paths: dict[str, str] | None = None


class ControlAck(AgentEvent):
    """The agent answered a control request the gateway sent (interrupt, set mode, ...)."""

    request_id: str
    ok: bool
    error: str | None = None
    response: dict[str, Any] | None = None


class StdinWrite(AgentEvent):
    """Bytes the parser must have written on the agent's stdin: its answer to a request of the
    agent (ACP ``fs/*``, an unknown method) or the next step of a handshake. The parser decides
    them (sans-IO); the session machine writes them while the process runs."""

    data: bytes


class PermissionAnswered(AgentEvent):
    """In a replayed transcript (``rawp-gateway translate``): the client answered the agent's
    permission request ``request_id`` then, allowing it or not."""

    request_id: str
    allow: bool


class ModeChanged(AgentEvent):
    """The agent changed its own mode (ACP ``current_mode_update``): ``mode`` is the DPS mode it
    amounts to (``plan`` or ``default``), ``agent_mode`` the agent's own id for it."""

    mode: Literal["default", "plan"]
    agent_mode: str


class FeaturesDeclared(AgentEvent):
    """The agent said what it can do (ACP ``initialize`` and ``session/new`` answers): DPS §12.2
    feature names, each on or off. The session announces them instead of the profile's guess."""

    features: dict[str, bool]


# --- session-level outcomes ---------------------------------------------------------------------


class Compacted(AgentEvent):
    trigger: Literal["auto", "manual"]
    summary: str
    pre_tokens: int
    post_tokens: int
    preserved: dict[str, list[Any]] | None = None  # §7.2.1 preserved_elements, where named


class Notice(AgentEvent):
    """Something the master should see that is not content: an API retry, a refusal, an error."""

    severity: Literal["warning", "error", "fatal"]
    code: str
    message: str
    recoverable: bool = True
    tool_name: str | None = None
    call_id: str | None = None
    http_status: int | None = None
    # Said between turns, it opens none (an ACP agent's protocol fault: only a prompt opens a turn).
    turnless: bool = False


class TurnEnded(AgentEvent):
    """The agent finished handling a prompt (Claude Code's ``result``)."""

    stop_reason: Literal[
        "end_turn", "max_tokens", "cancelled", "error", "tool_use", "awaiting_input"
    ]
    usage: UsageInfo | None = None
    cost_usd: float | None = None  # cumulative over the agent's session
    num_turns: int | None = None
    context_window: int | None = None
    context_used: int | None = None
    is_error: bool = False
    error: str | None = None


# --- what could not be understood ---------------------------------------------------------------


class Unknown(AgentEvent):
    """A well-formed line of a kind the parser does not know: counted, logged, maybe forwarded."""

    kind: str
    line: bytes


class OddNumbers(AgentEvent):
    """Numbers of a line that were dropped as unusable (a cost as a string, a count that is
    negative, ``NaN``: ``parsers/numbers.py``); the rest of the line was used. Logged."""

    kind: str  # the line's kind
    fields: list[str]


class ParseError(AgentEvent):
    """A line that is not what the agent's format promises (not JSON, wrong shape)."""

    message: str
    line: bytes  # at most the first 1 KiB
