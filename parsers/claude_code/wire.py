"""Claude Code's stream-json stdout lines as msgspec structs: one tagged union of the line kinds
(``type``), decoded once per line by ``line_decoder``.

Nested parts that only some lines need (a user line's ``tool_use_result``, a tool's ``input``) are
typed loosely and read on demand; everything else is skipped by the decoder without building Python
objects.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

LINE_KINDS: Final = frozenset(
    {"stream_event", "assistant", "user", "system", "result", "control_request", "control_response"}
)


# --- the line kinds -------------------------------------------------------------------------------
# Field names are the CLI's. Every field has a default: the CLI adds and drops fields between
# versions, and a missing field must not turn a good line into a ParseError.


class _Delta(msgspec.Struct):
    type: str = ""
    text: str | None = None
    thinking: str | None = None


class _StartBlock(msgspec.Struct):
    type: str = ""
    id: str | None = None
    name: str | None = None


class _StartMessage(msgspec.Struct):
    id: str | None = None


class _StreamEvent(msgspec.Struct):
    type: str = ""
    index: int = 0
    delta: _Delta | None = None
    content_block: _StartBlock | None = None
    message: _StartMessage | None = None


class StreamEventLine(msgspec.Struct, tag="stream_event", tag_field="type"):
    event: _StreamEvent = msgspec.field(default_factory=_StreamEvent)
    parent_tool_use_id: str | None = None
    api_message_id: str | None = None


class Block(msgspec.Struct):
    type: str = ""
    text: str | None = None
    thinking: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None


class ApiUsage(msgspec.Struct):
    # Counts typed loosely: one the wrong type ("5", 1.5) must not refuse the whole line (a
    # result line refused never ends its turn); usage_of and context_of read them through
    # parsers/numbers.py.
    input_tokens: Any = 0
    output_tokens: Any = 0
    cache_read_input_tokens: Any = None
    cache_creation_input_tokens: Any = None
    output_tokens_details: dict[str, Any] | None = None


class _AssistantMessage(msgspec.Struct):
    id: str = ""
    model: str | None = None
    content: list[Block] = []
    usage: ApiUsage | None = None


class AssistantLine(msgspec.Struct, tag="assistant", tag_field="type"):
    message: _AssistantMessage = msgspec.field(default_factory=_AssistantMessage)
    parent_tool_use_id: str | None = None
    aborted: bool = False
    is_api_error_message: bool = False
    api_error_status: int | None = None
    api_error_type: str | None = None
    error: Any = None
    timestamp: str | None = None


class UserBlock(msgspec.Struct):
    type: str = ""
    text: str | None = None
    tool_use_id: str | None = None
    content: Any = None
    is_error: bool | None = None


class _UserMessage(msgspec.Struct):
    content: str | list[UserBlock] = ""


class UserLine(msgspec.Struct, tag="user", tag_field="type"):
    message: _UserMessage = msgspec.field(default_factory=_UserMessage)
    parent_tool_use_id: str | None = None
    tool_use_result: Any = None
    tool_result_meta: list[dict[str, Any]] | None = None
    isSynthetic: bool = False  # the CLI's camelCase names
    isReplay: bool = False
    timestamp: str | None = None


class _McpServerInfo(msgspec.Struct):
    name: str = ""
    status: str = ""
    error: str | None = None


class CompactMeta(msgspec.Struct):
    trigger: str = "auto"
    pre_tokens: int = 0
    post_tokens: int | None = None


class SystemLine(msgspec.Struct, tag="system", tag_field="type"):
    subtype: str = ""
    session_id: str | None = None
    # init
    tools: list[str] = []
    mcp_servers: list[_McpServerInfo] = []
    slash_commands: list[str] = []
    model: str | None = None
    permissionMode: str | None = None
    # status
    status: str | None = None
    compact_result: str | None = None
    # compact_boundary
    compact_metadata: CompactMeta | None = None
    # api_retry
    attempt: int | None = None
    max_retries: int | None = None
    retry_delay_ms: int | None = None
    error_status: int | None = None
    error: Any = None
    # permission_denied
    tool_name: str | None = None
    tool_use_id: str | None = None
    message: str | None = None
    decision_reason_type: str | None = None
    # task_*
    task_id: str | None = None
    description: str | None = None
    subagent_type: str | None = None
    is_backgrounded: bool | None = None
    summary: str | None = None
    usage: dict[str, Any] | None = None
    last_tool_name: str | None = None


class ResultLine(msgspec.Struct, tag="result", tag_field="type"):
    subtype: str = ""
    is_error: bool = False
    stop_reason: str | None = None
    terminal_reason: str | None = None
    # Loosely typed, read through parsers/numbers.py (see ApiUsage).
    num_turns: Any = None
    total_cost_usd: Any = None
    usage: ApiUsage | None = None
    modelUsage: dict[str, dict[str, Any]] | None = None
    api_error_status: int | None = None
    result: str | None = None
    errors: list[Any] | None = None


class _ControlRequestBody(msgspec.Struct):
    subtype: str = ""
    tool_name: str | None = None
    input: dict[str, Any] = {}
    tool_use_id: str | None = None
    decision_reason_type: str | None = None
    blocked_path: str | None = None


class ControlRequestLine(msgspec.Struct, tag="control_request", tag_field="type"):
    request_id: str = ""
    request: _ControlRequestBody = msgspec.field(default_factory=_ControlRequestBody)


class _ControlResponseBody(msgspec.Struct):
    subtype: str = ""
    request_id: str = ""
    response: dict[str, Any] | None = None
    error: str | None = None


class ControlResponseLine(msgspec.Struct, tag="control_response", tag_field="type"):
    response: _ControlResponseBody = msgspec.field(default_factory=_ControlResponseBody)


_Line = (
    StreamEventLine
    | AssistantLine
    | UserLine
    | SystemLine
    | ResultLine
    | ControlRequestLine
    | ControlResponseLine
)
line_decoder: Final = msgspec.json.Decoder(_Line)
