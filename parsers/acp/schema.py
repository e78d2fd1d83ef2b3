"""The Agent Client Protocol messages the gateway reads, as thin msgspec structs.

Theory of operation
-------------------
ACP (protocol version 1) is JSON-RPC 2.0 over stdio, one message per line. These structs are the
parts of its schema (``schema/v1/schema.json`` of agentclientprotocol/agent-client-protocol) that the
adapter (``parsers/acp/adapter.py``) reads, with the schema's own field names. They are not the
protocol's full model: every field has a default, unknown fields are skipped by the decoder without
building objects, and free-form values (``rawInput``, ``rawOutput``, ``_meta``) stay plain JSON
values.

Why not the SDK on PyPI (``agent-client-protocol``): its models are pydantic and its connection
is an asyncio reader/writer pair, while the gateway's parsers are sans-IO and decode each agent
line once with msgspec (the hot path: a text chunk is one decode of ``Message`` and one of its
``content``). What is read of ACP here is small and stable (``session/update`` kinds, a few
responses and requests); the schema is the reference for every name.

A line is decoded as ``Message``: a request (``id`` and ``method``), a notification (``method``),
or a response (``id`` and ``result`` or ``error``). ``params`` is the superset of the params the
adapter reads (``session/update``, ``session/request_permission``, ``fs/*``), ``result`` stays raw
and is decoded by the method of the request it answers.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "AgentCapabilities",
    "Command",
    "ContentBlock",
    "InitializeResult",
    "McpCapabilities",
    "Message",
    "Mode",
    "ModeState",
    "NewSessionResult",
    "Params",
    "PermissionOption",
    "PromptCapabilities",
    "PromptResult",
    "ToolCallContent",
    "ToolCallFields",
    "Update",
    "Usage",
]

PROTOCOL_VERSION = 1


class ContentBlock(msgspec.Struct):
    """``ContentBlock``: text, image, audio, resource_link, resource."""

    type: str = ""
    text: str | None = None
    data: str | None = None  # image, audio: base64
    mimeType: str | None = None
    uri: str | None = None  # resource_link
    name: str | None = None
    resource: dict[str, Any] | None = None  # resource: {uri, text | blob, mimeType}


class ToolCallContent(msgspec.Struct):
    """``ToolCallContent``: ``content`` (a ContentBlock), ``diff``, ``terminal``."""

    type: str = ""
    content: ContentBlock | None = None
    path: str | None = None  # diff
    oldText: str | None = None
    newText: str | None = None
    terminalId: str | None = None


class Location(msgspec.Struct):
    path: str = ""
    line: int | None = None


class ToolCallFields(msgspec.Struct):
    """The fields of ``ToolCall`` and ``ToolCallUpdate`` (all optional in an update)."""

    toolCallId: str = ""
    title: str | None = None
    name: str | None = None  # newer schemas: the tool's own name
    kind: str | None = None
    status: str | None = None
    content: list[ToolCallContent] | None = None
    locations: list[Location] | None = None
    rawInput: Any = None
    rawOutput: Any = None
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class Command(msgspec.Struct):
    name: str = ""
    description: str = ""
    input: dict[str, Any] | None = None


class Cost(msgspec.Struct):
    # Numbers typed loosely here and in Usage and usage_update: one the wrong type must not
    # refuse the whole message (a prompt's answer refused loses its stop reason); the adapter reads
    # them through parsers/numbers.py.
    amount: Any = None
    currency: str = ""


class Update(msgspec.Struct):
    """``SessionUpdate``: every kind's fields together, told apart by ``sessionUpdate``.
    ``content`` stays raw: a ContentBlock in a chunk, a list of ToolCallContent in a tool call."""

    sessionUpdate: str = ""
    content: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # empty: absent
    messageId: str | None = None
    # tool_call, tool_call_update
    toolCallId: str | None = None
    title: str | None = None
    name: str | None = None
    kind: str | None = None
    status: str | None = None
    locations: list[Location] | None = None
    rawInput: Any = None
    rawOutput: Any = None
    # plan
    entries: list[dict[str, Any]] | None = None
    # available_commands_update
    availableCommands: list[Command] | None = None
    # current_mode_update
    currentModeId: str | None = None
    modeId: str | None = None  # early spelling
    # usage_update
    used: Any = None
    size: Any = None
    cost: Cost | None = None
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class PermissionOption(msgspec.Struct):
    optionId: str = ""
    name: str = ""
    kind: str = ""


class Params(msgspec.Struct):
    """The params the adapter reads, of every method it reads (see the module docstring)."""

    sessionId: str | None = None
    update: Update | None = None  # session/update
    toolCall: ToolCallFields | None = None  # session/request_permission
    options: list[PermissionOption] | None = None
    path: str | None = None  # fs/*


class RpcError(msgspec.Struct):
    code: int = 0
    message: str = ""
    data: Any = None


class Message(msgspec.Struct):
    jsonrpc: str = ""
    id: int | str | None = None
    method: str | None = None
    params: Params | None = None
    result: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # empty: absent
    error: RpcError | None = None


class Envelope(msgspec.Struct):
    """A message whose params do not fit ``Params``: enough to answer it."""

    jsonrpc: str = ""
    id: int | str | None = None
    method: str | None = None


class Sent(msgspec.Struct):
    """A client line of a recorded transcript (``rawp-gateway translate``)."""

    sent: Envelope


class Outcome(msgspec.Struct):
    outcome: str = ""
    optionId: str | None = None


class PermissionResult(msgspec.Struct):
    outcome: Outcome = msgspec.field(default_factory=Outcome)


class Answer(msgspec.Struct):
    result: PermissionResult = msgspec.field(default_factory=PermissionResult)


class SentAnswer(msgspec.Struct):
    """A client's answer to a permission request, in a recorded transcript."""

    sent: Answer


# --- results ------------------------------------------------------------------------------------


class PromptCapabilities(msgspec.Struct):
    image: bool = False
    audio: bool = False
    embeddedContext: bool = False


class McpCapabilities(msgspec.Struct):
    """The kinds of MCP server an agent takes besides stdio, which every ACP agent takes."""

    http: bool = False
    sse: bool = False


class AgentCapabilities(msgspec.Struct):
    loadSession: bool = False
    promptCapabilities: PromptCapabilities = msgspec.field(default_factory=PromptCapabilities)
    mcpCapabilities: McpCapabilities = msgspec.field(default_factory=McpCapabilities)
    sessionCapabilities: dict[str, Any] | None = None


class Implementation(msgspec.Struct):
    name: str = ""
    title: str | None = None
    version: str | None = None


class InitializeResult(msgspec.Struct):
    protocolVersion: int = 0
    agentCapabilities: AgentCapabilities = msgspec.field(default_factory=AgentCapabilities)
    agentInfo: Implementation | None = None


class Mode(msgspec.Struct):
    id: str = ""
    name: str = ""
    description: str | None = None


class ModeState(msgspec.Struct):
    currentModeId: str = ""
    availableModes: list[Mode] = []


class ModelState(msgspec.Struct):
    """``SessionModelState`` (unstable in the schema; Gemini and Claude's adapter send it)."""

    currentModelId: str = ""


class NewSessionResult(msgspec.Struct):
    sessionId: str = ""
    modes: ModeState | None = None
    models: ModelState | None = None


class LoadSessionResult(msgspec.Struct):
    modes: ModeState | None = None


class Usage(msgspec.Struct):
    """``Usage`` of a prompt response (unstable in the schema; Claude's adapter sends it)."""

    totalTokens: Any = None
    inputTokens: Any = 0
    outputTokens: Any = 0
    thoughtTokens: Any = None
    cachedReadTokens: Any = None
    cachedWriteTokens: Any = None


class PromptResult(msgspec.Struct):
    stopReason: str = ""
    usage: Usage | None = None
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


# --- saved sessions (session/list) ---------------------------------------------------------------


class SessionInfo(msgspec.Struct):
    sessionId: str
    cwd: str
    title: str | None = None
    updatedAt: str | None = None


class ListSessionsResult(msgspec.Struct):
    sessions: list[SessionInfo]
    nextCursor: str | None = None


# --- the gateway as an ACP agent (toward masters: gateway/protocol/acp_master.py) ----------------
# The requests an ACP client sends the gateway; the results above (InitializeResult,
# NewSessionResult, PromptResult, ...) are what it answers, with the same names.


class ClientCapabilities(msgspec.Struct):
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class InitializeParams(msgspec.Struct):
    protocolVersion: int = 0
    clientCapabilities: ClientCapabilities = msgspec.field(default_factory=ClientCapabilities)
    clientInfo: Implementation | None = None


class NewSessionParams(msgspec.Struct):
    cwd: str = ""
    mcpServers: list[Any] = []
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class LoadSessionParams(msgspec.Struct):
    sessionId: str = ""
    cwd: str | None = None
    mcpServers: list[Any] = []
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class ListSessionsParams(msgspec.Struct):
    cwd: str | None = None
    cursor: str | None = None


class PromptParams(msgspec.Struct):
    sessionId: str = ""
    prompt: list[ContentBlock] = []
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class SessionParams(msgspec.Struct):
    """``session/cancel`` (a notification) and ``session/set_mode``."""

    sessionId: str = ""
    modeId: str | None = None
