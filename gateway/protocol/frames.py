"""RAWP-DPS 1.0.1 frame types: the envelope (§2.1) and every payload of Appendix B.

Theory of operation
-------------------
A *payload* class is the thing code builds and inspects: ``TextDelta(content_index=0, text="hi")``.
Each payload class names its event type in ``TYPE``. For every payload class there is a generated
*frame* class (the §2.1 envelope with that payload), tagged with the event type, so that one
``msgspec`` decoder over the union of all frame classes decodes any known frame in one pass, and one
encoder writes any frame. ``FRAME_CLASSES`` maps event type to frame class; ``frame_class(payload)``
finds the frame class for a payload. Frames are built by ``factory.FrameFactory``, which fills the
envelope.

Field names are the wire names. A field without a default is required by the spec; every optional
field defaults to ``None`` (or the spec's default) and is omitted on the wire (``omit_defaults``).
Unknown keys in a received payload are ignored (msgspec's default), as §2.2 requires.

Sections 8, 11 and 16 of the spec are not available; the payloads of §16's file search events are
therefore permissive (every field optional) and the README's protocol notes say so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

import msgspec

__all__ = [
    "FRAME_CLASSES",
    "PAYLOAD_CLASSES",
    "Frame",
    "frame_class",
]

PROTOCOL_VERSION: str = "rawp-dps-1.0"
ENVELOPE_VERSION: int = 1
VENDOR_PREFIX: str = "x-rawp-gateway."

OutputType = Literal[
    "text",
    "structured",
    "file_content",
    "file_list",
    "diff",
    "web_content",
    "empty",
    "binary_ref",
    "agent_result",
]
ToolCategory = Literal[
    "filesystem",
    "shell",
    "search",
    "web",
    "notebook",
    "task_management",
    "agent",
    "planning",
    "mcp",
    "custom",
]
ToolStatus = Literal["available", "unavailable", "degraded"]
InvokeStatus = Literal["success", "error", "timeout", "cancelled"]
StopReason = Literal["end_turn", "max_tokens", "cancelled", "error", "tool_use", "awaiting_input"]
Mode = Literal["default", "plan", "review"]
InteractionType = Literal["YN", "SELECT", "MULTI_SELECT", "TEXT_INPUT", "PERMISSION"]
Severity = Literal["fatal", "error", "warning"]
RenamedBy = Literal["edge", "client", "master"]
DeleteReason = Literal["user_request", "master_request", "timeout", "error"]
DeletedBy = Literal["edge", "client", "master", "system"]
AgentState = str  # reserved: idle, thinking, tool_calling, awaiting_input, error; or x-{vendor}.*


class _Object(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Base of every payload and nested object: keyword-only, optional fields omitted."""


class Payload(_Object):
    """Base of every payload; ``TYPE`` is the event type it travels under."""

    TYPE: ClassVar[str] = ""


# --- nested objects --------------------------------------------------------------------------


class InteractionOption(_Object):
    value: str
    label: str
    description: str | None = None
    risk_level: Literal["safe", "moderate", "dangerous"] | None = None


class InteractionContext(_Object):
    tool_name: str | None = None
    tool_input: dict[str, Any] | None = None
    affected_paths: list[str] | None = None


class ErrorDetails(_Object):
    module: str | None = None
    trace: str | None = None
    related_tool: str | None = None
    related_invocation_id: str | None = None
    # Gateway additions (unknown keys are ignored by receivers, §2.2): what the process adapter
    # knows about a dead agent.
    exit_code: int | None = None
    signal: int | None = None
    stderr: str | None = None
    http_status: int | None = None
    hint: str | None = None  # what the user can do about it (which credentials, ...)


class FileTransferContext(_Object):
    workspace_relative_path: str | None = None
    related_tool_invocation_id: str | None = None


class CommandParameter(_Object):
    name: str
    type: Literal["string", "number", "boolean"]
    required: bool
    description: str | None = None


class Command(_Object):
    name: str
    description: str
    parameters: list[CommandParameter] | None = None
    category: Literal["session", "display", "config", "navigation"] | None = None


class SubagentInfo(_Object):
    agent_type: str | None = None
    description: str | None = None


class SubagentContext(_Object):
    """``metadata.subagent_context`` (§10.2)."""

    parent_invocation_id: str
    depth: int
    agent_type: str | None = None


class CatalogTool(_Object):
    name: str
    description: str
    version: str | None = None
    input_schema: dict[str, Any] | None = None
    output_type: OutputType | None = None
    requires_approval: bool | None = None
    category: ToolCategory | None = None
    status: ToolStatus | None = None
    status_description: str | None = None


class Diagnostic(_Object):
    severity: Literal["info", "warning", "error", "fatal"]
    code: str
    message: str
    tool_name: str | None = None


class ContextFile(_Object):
    file_url: str
    file_name: str
    mime_type: str | None = None
    intent: Literal["reference", "edit_target", "context"] | None = None


class FileReference(_Object):
    ref_id: str
    path: str
    name: str
    workspace_relative_path: str
    extension: str | None = None
    mime_type: str | None = None
    size_bytes: int | None = None
    # §16 is not available; conformance names a display_path that replaces a reference's token.
    display_path: str | None = None


class ConfigOverrides(_Object):
    output_format: Literal["text", "json", "stream-json"] | None = None
    json_schema: dict[str, Any] | None = None
    max_turns: int | None = None
    allowed_tools: list[str] | None = None
    denied_tools: list[str] | None = None


class BufferStatus(_Object):
    policy_applied: Literal["RING", "DROP", "NONE"]
    truncated: bool
    lost_frame_count: int | None = None
    buffer_high_watermark: int | None = None


class PreservedElements(_Object):
    files_modified: list[str] | None = None
    decisions_made: list[str] | None = None
    errors_encountered: list[str] | None = None
    active_todos: list[dict[str, Any]] | None = None


class TokenUsage(_Object):
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    thinking_tokens: int | None = None


class Quota(_Object):
    """``cost_usage`` and ``message_usage``: ``limit`` -1 means unlimited."""

    limit: float
    used: float
    unit: str


class ContextWindow(_Object):
    capacity: int | None = None
    used: int | None = None
    utilization: float | None = None


class Features(_Object):
    thinking_stream: bool | None = None
    tool_streaming: bool | None = None
    structured_output: bool | None = None
    subagent: bool | None = None
    subagent_context: bool | None = None
    context_compaction: bool | None = None
    plan_mode: bool | None = None
    file_reference: bool | None = None
    file_search_fuzzy: bool | None = None
    adapter_type: Literal["process", "sdk"] | None = None


# --- agent.* (§4, §10, §12.1) ----------------------------------------------------------------


class TextDelta(Payload):
    TYPE: ClassVar[str] = "agent.text.delta"
    content_index: int
    text: str


class TextDone(Payload):
    TYPE: ClassVar[str] = "agent.text.done"
    content_index: int
    full_text: str | None = None
    is_cancelled: bool | None = None  # §6.1.2


class ThinkingDelta(Payload):
    TYPE: ClassVar[str] = "agent.thinking.delta"
    content_index: int
    text: str
    redacted: bool = False


class ThinkingDone(Payload):
    TYPE: ClassVar[str] = "agent.thinking.done"
    content_index: int
    is_cancelled: bool | None = None


class InteractionRequest(Payload):
    TYPE: ClassVar[str] = "agent.interaction.request"
    interaction_id: str
    interaction_type: InteractionType
    question_text: str
    timeout_sec: float
    options: list[InteractionOption]
    context: InteractionContext | None = None
    default_value: str | None = None


class AgentError(Payload):
    TYPE: ClassVar[str] = "agent.error"
    error_code: str
    message: str
    severity: Severity
    recoverable: bool
    details: ErrorDetails | None = None


class FileTransfer(Payload):
    TYPE: ClassVar[str] = "agent.file.transfer"
    transfer_id: str
    direction: Literal["upload", "download"]
    file_url: str
    file_name: str
    mime_type: str
    size_bytes: int
    checksum: str | None = None
    context: FileTransferContext | None = None


class StateChanged(Payload):
    TYPE: ClassVar[str] = "agent.state.changed"
    previous_state: AgentState
    current_state: AgentState
    reason: str | None = None


class CommandsPublish(Payload):
    TYPE: ClassVar[str] = "agent.commands.publish"
    commands: list[Command]


class SubagentStarted(Payload):
    TYPE: ClassVar[str] = "agent.subagent.started"
    parent_invocation_id: str
    depth: int
    agent_type: str | None = None
    description: str | None = None


class SubagentEnded(Payload):
    TYPE: ClassVar[str] = "agent.subagent.ended"
    parent_invocation_id: str
    status: Literal["completed", "failed", "cancelled"]
    duration_ms: int | None = None


# --- tool.* (§5) -------------------------------------------------------------------------------


class InvokeRequest(Payload):
    TYPE: ClassVar[str] = "tool.invoke.request"
    invocation_id: str
    tool_name: str
    input: dict[str, Any]
    tool_version: str | None = None
    parallel_group_id: str | None = None
    subagent: SubagentInfo | None = None


class InvokeResult(Payload):
    TYPE: ClassVar[str] = "tool.invoke.result"
    invocation_id: str
    tool_name: str
    status: InvokeStatus
    output: Any  # required, even when null
    output_type: OutputType
    duration_ms: int | None = None
    truncated: bool | None = None


class InvokeStream(Payload):
    TYPE: ClassVar[str] = "tool.invoke.stream"
    invocation_id: str
    tool_name: str
    stream_type: Literal["stdout", "stderr", "progress"]
    chunk: str
    sequence: int


class CatalogPublish(Payload):
    TYPE: ClassVar[str] = "tool.catalog.publish"
    tools: list[CatalogTool]
    diagnostics: list[Diagnostic] | None = None


# --- control.* (§6, §16) ---------------------------------------------------------------------


class PromptRequest(Payload):
    TYPE: ClassVar[str] = "control.prompt.request"
    prompt_text: str
    input_type: Literal["text", "slash_command", "continuation", "piped_stdin"] = "text"
    context_files: list[ContextFile] | None = None
    file_references: list[FileReference] | None = None
    config_overrides: ConfigOverrides | None = None


class PromptCancel(Payload):
    TYPE: ClassVar[str] = "control.prompt.cancel"
    target_turn_id: str
    reason: Literal["user_cancelled", "timeout", "quota_exceeded"] | None = None


class InteractionResponse(Payload):
    TYPE: ClassVar[str] = "control.interaction.response"
    interaction_id: str
    selected_value: str | list[str]
    text_input: str | None = None


class InteractionTimeout(Payload):
    TYPE: ClassVar[str] = "control.interaction.timeout"
    interaction_id: str


class SessionCompact(Payload):
    TYPE: ClassVar[str] = "control.session.compact"
    instruction: str | None = None
    target_token_ratio: float | None = None


class ModeSwitch(Payload):
    TYPE: ClassVar[str] = "control.mode.switch"
    mode: Mode
    config: dict[str, Any] | None = None


class FileSearch(Payload):
    """§16.1.1 is not available: every field is optional."""

    TYPE: ClassVar[str] = "control.file.search"
    search_id: str | None = None
    query: str | None = None
    limit: int | None = None


class FileSearchCancel(Payload):
    TYPE: ClassVar[str] = "control.file.search.cancel"
    search_id: str | None = None


# --- session.* (§7, §12.2, §16) ----------------------------------------------------------------


class History(Payload):
    TYPE: ClassVar[str] = "session.history"
    frames: list[msgspec.Raw]  # whole envelopes, already encoded: embedded, never re-encoded
    buffer_status: BufferStatus
    last_sync_timestamp: str
    last_message_id: str


class Compacted(Payload):
    TYPE: ClassVar[str] = "session.compacted"
    summary: str
    previous_token_count: int
    current_token_count: int
    trigger: Literal["auto", "manual", "requested"]
    preserved_elements: PreservedElements | None = None


class Usage(Payload):
    TYPE: ClassVar[str] = "session.usage"
    token_usage: TokenUsage
    cost_usage: Quota
    message_usage: Quota
    time_to_reset: str
    turn_id: str | None = None
    context_window: ContextWindow | None = None


class SessionError(Payload):
    TYPE: ClassVar[str] = "session.error"
    error_code: str
    message: str
    fatal: bool


class TurnStart(Payload):
    TYPE: ClassVar[str] = "session.turn.start"
    turn_id: str
    turn_index: int
    mode: Mode | None = None


class TurnEnd(Payload):
    TYPE: ClassVar[str] = "session.turn.end"
    turn_id: str
    stop_reason: StopReason
    tool_invocation_count: int | None = None


class Capabilities(Payload):
    TYPE: ClassVar[str] = "session.capabilities"
    protocol_version: str
    supported_namespaces: list[str]
    features: Features
    max_frame_size: int | None = None
    extensions: dict[str, Any] | None = None


class FileCandidates(Payload):
    """§16.1.2 is not available: every field is optional."""

    TYPE: ClassVar[str] = "session.file.candidates"
    search_id: str | None = None
    candidates: list[dict[str, Any]] | None = None


class Renamed(Payload):
    TYPE: ClassVar[str] = "session.renamed"
    session_id: str
    name: str
    renamed_by: RenamedBy
    previous_name: str | None = None


class Deleted(Payload):
    TYPE: ClassVar[str] = "session.deleted"
    session_id: str
    reason: DeleteReason
    deleted_by: DeletedBy


# --- the gateway's own events (§3.1.1: x-rawp-gateway.*) --------------------------------------


class AgentRaw(Payload):
    """An agent stdout line of a kind the parser does not know, passed through for debugging."""

    TYPE: ClassVar[str] = VENDOR_PREFIX + "agent.raw"
    agent: str
    kind: str
    line: msgspec.Raw


# --- envelope -----------------------------------------------------------------------------------


class Frame(msgspec.Struct, kw_only=True, omit_defaults=True, tag_field="type"):
    """The §2.1 envelope. Concrete frame classes add ``payload`` and carry the type as their tag."""

    TYPE: ClassVar[str] = ""
    v: int
    message_id: str
    timestamp: str
    session_id: str
    turn_id: str | None = None
    parent_id: str | None = None
    metadata: dict[str, Any] | None = None
    if TYPE_CHECKING:
        # For the type checker only: a field declared here would be a field of the envelope
        # itself, and every concrete frame class declares its own (``_make_frame_class``).
        payload: Payload


PAYLOAD_CLASSES: dict[str, type[Payload]] = {
    cls.TYPE: cls
    for cls in (
        TextDelta,
        TextDone,
        ThinkingDelta,
        ThinkingDone,
        InteractionRequest,
        AgentError,
        FileTransfer,
        StateChanged,
        CommandsPublish,
        SubagentStarted,
        SubagentEnded,
        InvokeRequest,
        InvokeResult,
        InvokeStream,
        CatalogPublish,
        PromptRequest,
        PromptCancel,
        InteractionResponse,
        InteractionTimeout,
        SessionCompact,
        ModeSwitch,
        FileSearch,
        FileSearchCancel,
        History,
        Compacted,
        Usage,
        SessionError,
        TurnStart,
        TurnEnd,
        Capabilities,
        FileCandidates,
        Renamed,
        Deleted,
        AgentRaw,
    )
}

# Appendix B: the spec's own types (the vendor ones are ours and never received).
SPEC_TYPES: frozenset[str] = frozenset(t for t in PAYLOAD_CLASSES if not t.startswith("x-"))


def _make_frame_class(payload_cls: type[Payload]) -> type[Frame]:
    name = payload_cls.__name__ + "Frame"
    # defstruct is typed as returning any Struct class; with Frame as its base it is a Frame one.
    cls = cast(
        type[Frame],
        msgspec.defstruct(
            name,
            [("payload", payload_cls)],
            bases=(Frame,),
            tag=payload_cls.TYPE,
            kw_only=True,
            module=__name__,
        ),
    )
    cls.TYPE = payload_cls.TYPE
    return cls


FRAME_CLASSES: dict[str, type[Frame]] = {
    t: _make_frame_class(cls) for t, cls in PAYLOAD_CLASSES.items()
}
_FRAME_BY_PAYLOAD: dict[type[Payload], type[Frame]] = {
    PAYLOAD_CLASSES[t]: cls for t, cls in FRAME_CLASSES.items()
}


def frame_class(payload: Payload) -> type[Frame]:
    """The frame class that carries ``payload``."""
    return _FRAME_BY_PAYLOAD[type(payload)]


def namespace(frame_type: str) -> str:
    """``agent``, ``tool``, ``control``, ``session`` or the ``x-vendor`` prefix of a type."""
    return frame_type.partition(".")[0]
