"""ACP toward masters: one ACP client's view of one session (sans-IO).

Theory of operation
-------------------
Toward masters the gateway also speaks the Agent Client Protocol as an ACP *agent*
(docs/acp-masters.md). An ACP client attached to a session is one more master of it: the session
hands its ``AcpView`` the very frames it hands every DPS master, typed (``take(frame)``; the frames
a ``session.history`` carries are JSON, read by ``frame(data)``), and it returns the ACP messages
that frame becomes, already encoded: at most one message per frame, each carrying
``_meta.rawp.messageId`` (the frame's ``message_id``), so that a client that lost its connection
can load again after the last one it saw, as a DPS master reattaches with ``last_message_id``.

What the client asks becomes the control frames a DPS master would send (``prompt``, ``cancel``,
``set_mode``, ``answer``): the shell feeds them to the session as it feeds a DPS master's frame, so
roles, audit, relaying to the other masters (``metadata.rawp_user``) and the session machine's rules
are the same for both. Replies to such a control (``session.error`` naming it as ``parent_id``,
its turn's ``session.turn.start`` and ``session.turn.end``) come back through ``frame`` too and
answer the JSON-RPC request it came from: the machine answers a control in the same call that
receives it, so a prompt whose call made no error and no turn start is refused at ``settle``.

Frames become updates (the table is docs/acp-masters.md's): text ``agent_message_chunk``, thinking
``agent_thought_chunk``, another master's prompt ``user_message_chunk``, ``tool.invoke.*``
``tool_call`` / ``tool_call_update``, todo and plan tools ``plan``, usage ``usage_update``,
commands ``available_commands_update``, a mode switch ``current_mode_update``, what became of
the session's MCP servers ``session_info_update`` (in its ``_meta``); a permission
question is a ``session/request_permission`` request. ``session.history`` (a load) is the same
frames, replayed: nothing in it asks or answers anything. What the session says again when a
view attaches (its commands, its open questions: the greeting, ``greeting``) is its state, not
news: those messages carry the ids they were first sent with and ``_meta.rawp.state: true``, and a
load's sync point (``last_seen``) is the replay's newest frame, not them.

What a view keeps is bounded: the tool calls still open (``MAX_OPEN_TOOLS``, each with at most
``MAX_STREAM_CHARS`` of streamed output, shown again once ``STREAM_STEP_CHARS`` or half as much
again is new), the requests waiting for a reply (one prompt, and one
control at a time), the permission questions asked and not answered (``MAX_ASKED``, the oldest
forgotten: a client that never answers).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Final, Union

import msgspec

from gateway.protocol import acp_content as C
from gateway.protocol import frames as F
from gateway.protocol.factory import FrameFactory
from parsers.acp import schema as S

__all__ = [
    "MAX_ASKED",
    "MAX_OPEN_TOOLS",
    "MAX_STREAM_CHARS",
    "PROTOCOL_VERSION",
    "STREAM_STEP_CHARS",
    "AcpView",
    "RpcId",
    "encode",
    "error_response",
    "result_response",
]

PROTOCOL_VERSION: Final = S.PROTOCOL_VERSION
RpcId = Union[int, str]  # noqa: UP007 (a runtime alias)

MAX_OPEN_TOOLS: Final = 1024  # tool calls remembered until their result (the oldest forgotten)
MAX_ASKED: Final = 256  # questions asked and not answered that an answer is still taken for
MAX_STREAM_CHARS: Final = 8192  # the tail of a running tool's output each update carries
STREAM_STEP_CHARS: Final = 1024  # new output that makes an update once the output is long

# DPS stop reasons ACP has a stop reason for; the others (error, disconnected) answer with an error.
STOP_REASONS: Final = {
    "end_turn": "end_turn",
    "max_tokens": "max_tokens",
    "cancelled": "cancelled",
    "tool_use": "end_turn",
    "awaiting_input": "end_turn",
}
FAILED_TURN: Final = {"error": "TURN_FAILED", "disconnected": "AGENT_DISCONNECTED"}

# JSON-RPC 2.0 error codes (and ACP's).
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
REFUSED: Final = -32000  # a refusal of the gateway's (data.error_code says which)
RESOURCE_NOT_FOUND: Final = -32002

_encoder = msgspec.json.Encoder()
encode = _encoder.encode
_frame_decoder = msgspec.json.Decoder(Union[tuple(F.FRAME_CLASSES.values())])  # noqa: UP007
_answer_decoder = msgspec.json.Decoder(S.PermissionResult)


def result_response(rpc_id: RpcId | None, result: Any) -> bytes:
    return encode({"jsonrpc": "2.0", "id": rpc_id, "result": result})


def error_response(
    rpc_id: RpcId | None, code: int, message: str, error_code: str | None = None, **data: Any
) -> bytes:
    """A JSON-RPC error; ``error_code``: the gateway's (``FORBIDDEN``, ...), in ``data``."""
    error: dict[str, Any] = {"code": code, "message": message}
    if error_code is not None:
        error["data"] = {"error_code": error_code, "message": message, **data}
    return encode({"jsonrpc": "2.0", "id": rpc_id, "error": error})


class _Tool:
    __slots__ = ("input", "kind", "name", "out", "unsent")

    def __init__(self, name: str, kind: str, tool_input: dict[str, Any]) -> None:
        self.name = name
        self.kind = kind
        self.input = tool_input
        self.out = ""
        self.unsent = 0  # characters streamed since the last update


class AcpView:
    """One ACP client's view of one session: frames in, ACP messages out (module docstring)."""

    def __init__(
        self,
        session_id: str,
        factory: FrameFactory,
        *,
        turn_events: bool = False,
    ) -> None:
        self.session_id = session_id
        self._heads: dict[str, bytes] = {}  # the start of each kind of chunk message (``_chunk``)
        self.factory = factory
        self.turn_events = turn_events  # ``_rawp/turn`` notifications (a relay asks for them)
        self.turn_id: str | None = None  # the session's running turn
        self.mode: str = "default"
        self._waiting: dict[str, tuple[RpcId, str]] = {}  # control message_id -> (request, method)
        self._prompt: tuple[str, RpcId] | None = None  # sent; its turn has not started yet
        self._turns: dict[str, RpcId] = {}  # turn id -> the session/prompt its end answers
        self._tools: OrderedDict[str, _Tool] = OrderedDict()
        self.asked: dict[str, str] = {}  # our session/request_permission id -> interaction_id
        self.in_history = False
        # The newest frame seen: a load after it (``_meta.rawp.lastMessageId``) misses nothing.
        self.last_seen: str | None = None
        self.lost_frames = 0  # of a load: frames the buffer no longer had (1: some, uncounted)
        # While the session greets this view (its attach): what comes is state said again
        # (commands, open questions) under the ids it was first sent with, not news; the frames
        # it replays come inside session.history.
        self.greeting = False
        self._agent_error: dict[str, str] | None = None  # the turn's last error of the agent
        self._owed: list[bytes] = []  # a turn's answer, sent after its usage (``take``)
        # What this view last said of the session's MCP servers (``_mcp_servers``): None, nothing.
        self._mcp_said: list[Any] | None = None

    # --- frames in, ACP messages out --------------------------------------------------------

    def frame(self, data: bytes | memoryview) -> list[bytes]:
        """``take`` of a frame as JSON (one a ``session.history`` carries)."""
        try:
            frame = _frame_decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):  # not a frame the gateway makes
            return []
        return self.take(frame)

    def take(self, frame: F.Frame) -> list[bytes]:
        """The ACP messages one frame the session sent becomes (none, one, or the replies it
        carries for this client's requests)."""
        payload = frame.payload
        if isinstance(payload, F.History):
            out: list[bytes] = []
            # The history comes inside the greeting, but it is the session's news, not its state:
            # its messages carry no ``state`` mark, so a client keeps their ids to load after.
            greeting, self.greeting, self.in_history = self.greeting, False, True
            try:
                for raw in payload.frames:
                    out += self.frame(raw)
            finally:
                self.in_history, self.greeting = False, greeting
            self.last_seen = payload.last_message_id
            status = payload.buffer_status
            self.lost_frames += status.lost_frame_count or (1 if status.truncated else 0)
            return out
        if not self.greeting or self.last_seen is None:
            self.last_seen = frame.message_id
        out = self._translate(frame, payload)
        owed = self._owed
        if owed and not isinstance(payload, F.TurnEnd):
            # The answer of a turn's session/prompt waits for the turn's usage_update: the
            # session.usage comes right after the turn's end (DPS-7.5.2-usage), and a client
            # reads its answer as the end of everything the turn says.
            self._owed = []
            return out + owed if isinstance(payload, F.Usage) else owed + out
        return out

    def _translate(self, frame: F.Frame, payload: Any) -> list[bytes]:
        mid = frame.message_id
        if isinstance(payload, F.TextDelta):
            return self._chunk("agent_message_chunk", payload.text, mid)
        if isinstance(payload, F.ThinkingDelta):
            if payload.redacted or not payload.text:
                return []
            return self._chunk("agent_thought_chunk", payload.text, mid)
        if isinstance(payload, F.InvokeStream):
            return self._tool_stream(payload, mid)
        if isinstance(payload, F.InvokeRequest):
            return self._tool_call(payload, mid)
        if isinstance(payload, F.InvokeResult):
            return self._tool_result(payload, mid)
        if isinstance(payload, F.PromptRequest):
            # Another master's prompt (one's own is never relayed back), or any prompt replayed.
            return self._chunk("user_message_chunk", payload.prompt_text, mid)
        if isinstance(payload, F.TurnStart):
            return self._turn_start(payload, mid)
        if isinstance(payload, F.TurnEnd):
            return self._turn_end(payload, mid)
        if isinstance(payload, F.SessionError):
            return self._error(frame, payload)
        if isinstance(payload, F.InteractionRequest):
            return self._ask(frame, payload)
        if isinstance(payload, F.Usage):
            return self._usage(payload, mid)
        if isinstance(payload, F.CommandsPublish):
            commands = [C.command(c) for c in payload.commands]
            return [self._update({"sessionUpdate": "available_commands_update",
                                  "availableCommands": commands}, mid)]  # fmt: skip
        if isinstance(payload, F.StateChanged):
            mode = (frame.metadata or {}).get("mode")
            if payload.reason == "mode_switch" and isinstance(mode, str):
                self.mode = mode
                return [self._update({"sessionUpdate": "current_mode_update",
                                      "currentModeId": mode}, mid)]  # fmt: skip
            return []
        if isinstance(payload, F.CatalogPublish):
            return self._mcp_servers(frame, mid)
        if isinstance(payload, F.Capabilities):
            return []  # its extensions.mcp_servers is the greeting's catalog's, said there
        if isinstance(payload, F.Deleted):
            return self.ended("SESSION_TERMINATED", "the session was deleted")
        if isinstance(payload, F.AgentError) and payload.severity != "warning":
            # ACP has no error update: a failed turn's answer says what went wrong.
            self._agent_error = {"error_code": payload.error_code, "message": payload.message}
        return []

    def _mcp_servers(self, frame: F.Frame, mid: str) -> list[bytes]:
        """What became of the session's MCP servers (the catalog's ``metadata.rawp_mcp_servers``,
        names and statuses, never a secret) as a ``session_info_update`` whose ``_meta.rawp``
        has ``mcpServers`` (docs/acp-masters.md): ACP has no update of its own for it, and this one
        takes ``_meta`` in the pinned schema and the TypeScript SDK alike. Said when it changed
        since this view last said it, and again in the greeting (the session's state)."""
        servers = (frame.metadata or {}).get("rawp_mcp_servers")
        if not isinstance(servers, list):
            servers = []
        if (not servers and self._mcp_said is None) or (
            servers == self._mcp_said and not self.greeting
        ):
            return []
        self._mcp_said = servers
        update = {
            "sessionUpdate": "session_info_update",
            "_meta": {"rawp": {"mcpServers": servers}},
        }
        return [self._update(update, mid)]

    def _meta(self, mid: str) -> dict[str, Any]:
        if self.greeting:  # the session's state, said again (module docstring)
            return {"rawp": {"messageId": mid, "state": True}}
        return {"rawp": {"messageId": mid}}

    def _update(self, update: dict[str, Any], mid: str) -> bytes:
        return encode(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": self.session_id,
                    "update": update,
                    "_meta": self._meta(mid),
                },
            }
        )

    def _chunk(self, kind: str, text: str, mid: str) -> list[bytes]:
        # The most frequent message by far (a delta of text), written from its parts: the same
        # JSON as ``_update`` makes, without building and walking its dicts for every delta.
        head = self._heads.get(kind)
        if self.greeting:
            update = {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
            return [self._update(update, mid)]
        if head is None:
            head = self._heads[kind] = (
                b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":'
                + encode(self.session_id)
                + b',"update":{"sessionUpdate":"'
                + kind.encode()
                + b'","content":{"type":"text","text":'
            )
        return [
            b"".join(
                (head, encode(text), b'}},"_meta":{"rawp":{"messageId":', encode(mid), b"}}}}")
            )
        ]

    # tool calls ----------------------------------------------------------------------------

    def _tool_call(self, req: F.InvokeRequest, mid: str) -> list[bytes]:
        name = req.tool_name
        if name in C.PLAN_TOOLS:
            entries = C.plan_entries(req.input)
            if entries is None:
                return []
            return [self._update({"sessionUpdate": "plan", "entries": entries}, mid)]
        kind = C.kind(name)
        tools = self._tools
        while len(tools) >= MAX_OPEN_TOOLS:
            tools.popitem(last=False)
        tools[req.invocation_id] = _Tool(name, kind, req.input)
        update: dict[str, Any] = {
            "sessionUpdate": "tool_call",
            "toolCallId": req.invocation_id,
            "title": C.title(name, req.input),
            "kind": kind,
            "status": "pending",
            "rawInput": req.input,
        }
        locations = C.locations(req.input)
        if locations:
            update["locations"] = locations
        return [self._update(update, mid)]

    def _tool_stream(self, stream: F.InvokeStream, mid: str) -> list[bytes]:
        tool = self._tools.get(stream.invocation_id)
        if tool is None:
            return []
        # ACP's content replaces what a tool call showed: an update carries the output so far
        # (its tail). Sent once enough is new (half what it shows, at most STREAM_STEP_CHARS):
        # a command that prints byte by byte must not cost a whole tail per byte. The result
        # carries the whole output at the end.
        tool.out = (tool.out + stream.chunk)[-MAX_STREAM_CHARS:]
        tool.unsent += len(stream.chunk)
        if tool.unsent < min(STREAM_STEP_CHARS, len(tool.out) // 2):
            return []
        tool.unsent = 0
        update = {
            "sessionUpdate": "tool_call_update",
            "toolCallId": stream.invocation_id,
            "status": "in_progress",
            "content": [C.text_content(tool.out)],
        }
        return [self._update(update, mid)]

    def _tool_result(self, result: F.InvokeResult, mid: str) -> list[bytes]:
        if result.tool_name in C.PLAN_TOOLS:
            return []
        tool = self._tools.pop(result.invocation_id, None)
        tool_input = tool.input if tool is not None else {}
        update: dict[str, Any] = {
            "sessionUpdate": "tool_call_update",
            "toolCallId": result.invocation_id,
            "status": "completed" if result.status == "success" else "failed",
        }
        content = C.result_content(result, tool_input)
        if content is not None:
            update["content"] = content
        if result.output_type == "structured":
            update["rawOutput"] = result.output
        return [self._update(update, mid)]

    # turns, replies and questions -----------------------------------------------------------

    def _turn_start(self, start: F.TurnStart, mid: str) -> list[bytes]:
        self.turn_id = start.turn_id
        self._agent_error = None
        if self._prompt is not None and not self.in_history:
            # This client's prompt opened this turn (the machine opens it in the same call).
            prompt_mid, rpc_id = self._prompt
            self._prompt = None
            self._waiting.pop(prompt_mid, None)
            self._turns[start.turn_id] = rpc_id
            return self._turn_event(start.turn_id, "start", None, mid, rpc_id)
        return self._turn_event(start.turn_id, "start", None, mid)

    def _turn_end(self, end: F.TurnEnd, mid: str) -> list[bytes]:
        if self.turn_id == end.turn_id:
            self.turn_id = None
        out = self._turn_event(end.turn_id, "end", end.stop_reason, mid)
        rpc_id = None if self.in_history else self._turns.pop(end.turn_id, None)
        if rpc_id is None:
            return out
        stop = STOP_REASONS.get(end.stop_reason)
        meta = {"rawp": {"turnId": end.turn_id}}
        if stop is not None:
            self._owed.append(result_response(rpc_id, {"stopReason": stop, "_meta": meta}))
        else:
            code = FAILED_TURN.get(end.stop_reason, "TURN_FAILED")
            why = f"the turn ended with {end.stop_reason}"
            cause = self._agent_error
            if cause is not None:
                why += f": {cause['error_code']}: {cause['message'][:500]}"
            extra = (
                {"turnId": end.turn_id, "agentError": cause} if cause else {"turnId": end.turn_id}
            )
            self._owed.append(error_response(rpc_id, INTERNAL_ERROR, why, code, **extra))
        self._agent_error = None
        return out

    def _turn_event(
        self, turn_id: str, event: str, stop: str | None, mid: str, request: RpcId | None = None
    ) -> list[bytes]:
        if not self.turn_events:
            return []
        params: dict[str, Any] = {"sessionId": self.session_id, "turnId": turn_id, "event": event}
        if stop is not None:
            params["stopReason"] = stop
        if request is not None:  # this client's session/prompt opened the turn
            params["requestId"] = request
        params["_meta"] = {"rawp": {"messageId": mid}}
        return [encode({"jsonrpc": "2.0", "method": "_rawp/turn", "params": params})]

    def _error(self, frame: F.Frame, error: F.SessionError) -> list[bytes]:
        parent = frame.parent_id
        waiting = self._waiting.pop(parent, None) if parent is not None else None
        if waiting is None:
            return []
        rpc_id, _method = waiting
        if self._prompt is not None and self._prompt[0] == parent:
            self._prompt = None
        return [error_response(rpc_id, REFUSED, error.message, error.error_code)]

    def _ask(self, frame: F.Frame, req: F.InteractionRequest) -> list[bytes]:
        if self.in_history:
            return []  # asked and answered long ago; an open question comes after the history
        metadata = frame.metadata or {}
        context = req.context or F.InteractionContext()
        invocation_id = metadata.get("invocation_id")
        tool = self._tools.get(invocation_id) if isinstance(invocation_id, str) else None
        if tool is not None:
            tool_name, tool_input = tool.name, tool.input
        else:
            tool_name, tool_input = context.tool_name or "", context.tool_input or {}
        tool_call: dict[str, Any] = {
            "toolCallId": invocation_id if isinstance(invocation_id, str) else req.interaction_id,
            # The call's own title, as its tool_call said it: clients take toolCall as an update
            # of that call, so the question's words here would rename it. ACP 1 gives a
            # permission request no title of its own (drafts of ACP 2 do): the question goes in
            # _meta.rawp.question.
            "title": C.title(tool_name, tool_input),
            "kind": C.kind(tool_name) if tool_name else "other",
            "status": "pending",
            "rawInput": tool_input,
        }
        locations = [{"path": p} for p in context.affected_paths or ()] or C.locations(tool_input)
        if locations:
            tool_call["locations"] = locations
        options = [
            {"optionId": o.value, "name": o.label, "kind": C.option_kind(o)} for o in req.options
        ]
        rpc_id = f"rawp-ask-{req.interaction_id}"
        asked = self.asked
        asked.pop(rpc_id, None)
        asked[rpc_id] = req.interaction_id
        while len(asked) > MAX_ASKED:  # a client that never answers: forget the oldest
            del asked[next(iter(asked))]
        params = {
            "sessionId": self.session_id,
            "toolCall": tool_call,
            "options": options,
            "_meta": {
                "rawp": {
                    **self._meta(frame.message_id)["rawp"],
                    "interactionId": req.interaction_id,
                    "question": req.question_text[: C.MAX_TITLE_CHARS],
                }
            },
        }
        return [
            encode(
                {
                    "jsonrpc": "2.0",
                    "id": rpc_id,
                    "method": "session/request_permission",
                    "params": params,
                }
            )
        ]

    def _usage(self, usage: F.Usage, mid: str) -> list[bytes]:
        window = usage.context_window
        if window is None or window.used is None or window.capacity is None:
            return []
        update: dict[str, Any] = {
            "sessionUpdate": "usage_update",
            "used": window.used,
            "size": window.capacity,
        }
        if usage.cost_usage.unit.upper() == "USD" and usage.cost_usage.used >= 0:
            update["cost"] = {"amount": usage.cost_usage.used, "currency": "USD"}
        return [self._update(update, mid)]

    def ended(self, error_code: str, message: str) -> list[bytes]:
        """The session ended or this view leaves it: every request still waiting is answered."""
        out, self._owed = self._owed, []
        out += [
            error_response(rpc_id, REFUSED, message, error_code)
            for rpc_id, _ in self._waiting.values()
        ]
        out += [error_response(r, REFUSED, message, error_code) for r in self._turns.values()]
        self._waiting.clear()
        self._turns.clear()
        self._prompt = None
        return out

    # --- requests in, controls out ---------------------------------------------------------

    def _control(self, payload: F.Payload, rpc_id: RpcId | None, method: str) -> tuple[str, bytes]:
        frame = self.factory.frame(payload)
        if rpc_id is not None:
            self._waiting[frame.message_id] = (rpc_id, method)
        return frame.message_id, encode(frame)

    def prompt(self, rpc_id: RpcId, text: str) -> tuple[str, bytes]:
        """``session/prompt``: the ``control.prompt.request`` to feed to the session, and its id."""
        mid, data = self._control(F.PromptRequest(prompt_text=text), rpc_id, "session/prompt")
        self._prompt = (mid, rpc_id)
        return mid, data

    def cancel(self) -> bytes | None:
        """``session/cancel``: a ``control.prompt.cancel`` of the running turn (None: none runs)."""
        if self.turn_id is None:
            return None
        return self._control(F.PromptCancel(target_turn_id=self.turn_id), None, "")[1]

    def set_mode(self, rpc_id: RpcId, mode: F.Mode) -> tuple[str, bytes]:
        return self._control(F.ModeSwitch(mode=mode), rpc_id, "session/set_mode")

    def answer(self, rpc_id: RpcId, result: bytes | None) -> bytes | None:
        """The client's answer to a ``session/request_permission`` of ours: the
        ``control.interaction.response`` to feed (None: nothing to say, e.g. ``cancelled``)."""
        interaction_id = self.asked.pop(str(rpc_id), None)
        if interaction_id is None or result is None:
            return None
        try:
            outcome = _answer_decoder.decode(result).outcome
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return None
        if outcome.outcome != "selected" or not outcome.optionId:
            return None  # cancelled: the turn's cancel (session/cancel) says the rest
        payload = F.InteractionResponse(
            interaction_id=interaction_id, selected_value=outcome.optionId[:256]
        )
        return self._control(payload, None, "")[1]

    def settle(self, mid: str) -> list[bytes]:
        """After the session took the control ``mid``: a request it neither refused nor opened
        a turn for is answered here (a mode switch succeeded; a prompt was dropped)."""
        waiting = self._waiting.pop(mid, None)
        if waiting is None:
            return []
        rpc_id, method = waiting
        if method == "session/set_mode":
            return [result_response(rpc_id, {})]
        if self._prompt is not None and self._prompt[0] == mid:
            self._prompt = None
        return [error_response(rpc_id, REFUSED, "the session did not take the prompt", "REFUSED")]
