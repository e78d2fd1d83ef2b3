"""The decisions of ``rawp-gateway acp``, the stdio relay to a gateway's ``/acp``, with no I/O.

An editor launches ``rawp-gateway acp --url URL`` as a custom ACP agent: newline-delimited JSON-RPC
on stdin and stdout. The relay passes every message on to the gateway's ``/acp`` WebSocket and
back. What it adds is what a dropped connection needs, decided here with messages in and messages
out (``docs/acp-masters.md``, "The stdio relay"); the shell (``acp_link.py``) owns the pipes, the
socket and the backoff and feeds this object:

* **Ids on the socket are the relay's.** Every request the editor sends goes out under a fresh
  integer id and its answer comes back under the editor's id, so the requests the relay makes
  itself (``initialize`` and ``session/load`` after a reconnect) never collide with the editor's.
  Requests the gateway sends (``session/request_permission``) reach the editor under ids the relay
  numbers, the same across connections.
* **Reconnect, then load again.** After a drop the relay initializes the new connection with the
  editor's own ``initialize`` params and loads every session the editor created, loaded or resumed,
  with the ``cwd`` it gave, after the last update it passed on (``_meta.rawp.lastMessageId``: the
  gateway replays only what came later, as a DPS master's reattach). Editor messages wait in a
  bounded queue until then, and go out in their order.
* **No update lost or repeated.** Every update the gateway sends carries its frame's id
  (``_meta.rawp.messageId``); the relay remembers the last ``seen_window`` ids and drops an update
  it already passed on, so a reload that replays more than the gap repeats nothing. The editor's
  own ``session/load`` gets its whole replay (it asked for it), except what it already got of that
  very load before a drop.
* **Requests in flight at the drop.** ``initialize``, ``session/list``, ``session/load``,
  ``session/resume`` and ``session/set_mode`` are safe to send twice and are sent again. A
  ``session/prompt`` is never sent twice: its turn goes on in the gateway, and the relay answers it
  from the turn's end (the gateway's ``_rawp/turn`` notifications, which the relay asks for and
  keeps to itself), or, when the gateway shows no turn for it after the reload, with a JSON-RPC
  error ``CONNECTION_LOST`` that says it was not received. Anything else (``session/new``, unknown
  methods) may have acted already: ``CONNECTION_LOST``, never sent again. A ``session/cancel``
  written while the socket was down is sent after the reload.
* **A permission question asked again** after a reload (the same ``_meta.rawp.interactionId``) is
  not shown twice: the editor's open question takes the new request's place, and an answer the
  editor gave while the socket was down goes to it.
* **A gateway that stopped and kept nothing** closes its socket with 1001 (a restart that keeps
  the sessions closes with 1012): the sessions of that link ended with it. They are not loaded
  again; the prompts waiting on them, and every later request about them, are answered
  ``SESSION_TERMINATED`` saying so and what to do (start a new session), never "send it again" or
  "load it"; the relay reconnects for the sessions the editor starts next.
* **A fleet.** ``--url`` may be a fleet's router, which sends ``/acp`` to any gateway. A session
  lives on one: the relay learns where from ``session/list`` (``_meta.rawp.pod``; the editor's
  own, or the relay's after a reconnect for the sessions it created) and speaks to it on a
  WebSocket of its own, ``/pods/<pod>/acp`` (``Connect``; one per pod), so a session on another
  pod loads, and a reconnect that lands on another pod still finds every session.
* **Bounded:** the editor's line size (the shell cuts it), requests in flight, queued messages and
  their bytes, sessions, open questions, remembered ids (``RelayLimits``); a limit refuses with a
  JSON-RPC error and loses nothing else.
"""

from __future__ import annotations

import itertools
from typing import Any, Final

import msgspec

from gateway.client import acp_messages as M
from gateway.client import acp_state as R
from gateway.client.acp_messages import (
    CONNECTION_LOST,
    GATEWAY_STOPPED,
    GATEWAY_UNREACHABLE,
    SESSION_TERMINATED,
    TOO_MANY_REQUESTS,
    Action,
    Connect,
    Id,
    Log,
    RelayLimits,
    ToEditor,
    ToGateway,
)
from gateway.protocol.codec import SeenWindow
from parsers.json_depth import too_deep

__all__ = ["RETRY_SAFE", "Relay"]

# Requests the relay sends again after a reconnect: doing them twice changes nothing.
RETRY_SAFE: Final = frozenset(
    {"initialize", "session/list", "session/load", "session/resume", "session/set_mode"}
)
# Requests that attach the editor to a session: the relay loads it again after a drop.
ATTACHING: Final = frozenset({"session/new", "session/load", "session/resume"})
# Requests about no one session: they go to the WebSocket at --url.
UNPLACED: Final = frozenset({"initialize", "authenticate", "session/new", "session/list"})
PRIMARY: Final = ""  # the link at --url
ENDED: Final = (
    "session {} ended with the gateway: it stopped, and a gateway without a state dir keeps no "
    "sessions; start a new session (session/new)"
)


class Relay:
    """Feed it what happens; it returns what to write where. See the module docstring."""

    def __init__(self, limits: RelayLimits | None = None) -> None:
        self.limits = limits or RelayLimits()
        self._links: dict[str, R.Link] = {PRIMARY: R.Link(PRIMARY)}
        self._initialized: Any = None  # the editor's initialize params, once accepted
        self._queued = 0  # messages waiting on every link, and their bytes
        self._queued_bytes = 0
        self._ids = itertools.count(1)  # relay ids on the sockets
        self._question_ids = itertools.count(1)  # relay ids toward the editor
        self._sent: dict[int, R.Sent] = {}
        self._sessions: dict[str, R.Session] = {}
        self._pods: dict[str, str] = {}  # session -> its pod, as session/list said
        self._mark: dict[str, str] = {}  # session -> the last update id passed on
        self._seen = SeenWindow(self.limits.seen_window)
        self._loading: dict[str, SeenWindow] = {}  # an editor's load: what it already got
        self._prompts: dict[str, R.Prompt] = {}  # session -> the editor's prompt on it
        # A reload from before a turn's start: session -> that start's id, until it is replayed
        self._own_prompt_reloaded: dict[str, str | None] = {}
        self._questions: dict[int, R.Question] = {}
        self._by_key: dict[str, int] = {}
        self._ended: dict[str, None] = {}  # sessions that ended with their gateway (oldest first)

    @property
    def live(self) -> bool:
        return all(link.phase == "live" for link in self._links.values())

    @property
    def sessions(self) -> list[str]:
        return list(self._sessions)

    # --- the connections --------------------------------------------------------------------------

    def connected(self, link: str = PRIMARY) -> list[Action]:
        """A new WebSocket of ``link`` is open."""
        ln = self._links[link]
        ln.epoch += 1
        ln.failures = 0
        ln.reloads_left = 0
        if self._initialized is None:
            ln.phase = "live"
            return self._flush(ln)
        ln.phase = "reloading"
        params = M.with_turn_events(self._initialized)
        count = sum(1 for s in self._sessions.values() if s.link == link)
        return [
            ln.says(f"{'re' * (ln.epoch > 1)}connected; loading {count} session(s) again"),
            self._own(ln, "initialize", params),
        ]

    def disconnected(
        self, reason: str = "", link: str = PRIMARY, code: int | None = None
    ) -> list[Action]:
        """The WebSocket of ``link`` closed (with ``code``) or failed."""
        ln = self._links[link]
        mine = [rid for rid, sent in self._sent.items() if sent.link == link]
        ended = self._gateway_stopped(ln) if code == GATEWAY_STOPPED else []
        if ln.phase == "connecting" and not mine and not ended:
            return []
        ln.phase = "connecting"
        out: list[Action] = [
            ln.says(f"connection to the gateway lost{_colon(reason)}; reconnecting")
        ]
        if ended:
            out = [
                ln.says(
                    f"the gateway stopped{_colon(reason)}; {len(ended)} session(s) ended with "
                    "it: start new ones; reconnecting"
                )
            ]
        retry: list[tuple[dict[str, Any], int]] = []
        for rid in mine:
            sent = self._sent.pop(rid)
            if not sent.from_editor or sent.message is None:
                continue
            if sent.session_id in self._ended:
                out.append(
                    self._error(sent.editor_id, SESSION_TERMINATED, ENDED.format(sent.session_id))
                )
            elif sent.method in RETRY_SAFE:
                retry.append((sent.message, 0))
            elif sent.method == "session/prompt" and sent.session_id in self._prompts:
                self._prompts[sent.session_id].orphan = True  # answered after the reload
            else:
                text = f"the connection to the gateway dropped while {sent.method} was in flight"
                text += "; the gateway may have acted on it, so it is not sent again"
                out.append(self._error(sent.editor_id, CONNECTION_LOST, text))
        ln.queue[:0] = retry  # sent again first, in the order they were first sent
        self._queued += len(retry)
        return out

    def _gateway_stopped(self, ln: R.Link) -> list[str]:
        """The gateway of ``ln`` stopped keeping nothing: its sessions ended, and are not loaded
        again. Those sessions."""
        ended = [s for s, attached in self._sessions.items() if attached.link == ln.name]
        for session in ended:
            del self._sessions[session]
            self._mark.pop(session, None)
            self._loading.pop(session, None)
            self._prompts.pop(session, None)  # its request in flight is answered as ended
            self._own_prompt_reloaded.pop(session, None)
            self._ended[session] = None
            while len(self._ended) > self.limits.max_sessions:
                del self._ended[next(iter(self._ended))]
        return ended

    def connect_failed(self, reason: str, retry_in: float, link: str = PRIMARY) -> list[Action]:
        """An attempt to connect ``link`` failed; the shell tries again in ``retry_in`` s."""
        ln = self._links[link]
        ln.failures += 1
        out: list[Action] = [
            ln.says(f"cannot reach the gateway{_colon(reason)}; retrying in {retry_in:g} s")
        ]
        if ln.failures >= self.limits.fail_queue_after:
            queue, ln.queue = ln.queue, []
            self._queued -= len(queue)
            self._queued_bytes -= sum(size for _, size in queue)
            for message, _ in queue:
                text = f"the gateway is unreachable: {reason}"
                out += self._refuse(message, GATEWAY_UNREACHABLE, text)
        return out

    # --- editor -> gateway ---------------------------------------------------------------------

    def editor_line_too_long(self) -> list[Action]:
        text = f"message over {self.limits.max_line_bytes} bytes"
        return [self._error(None, M.LINE_TOO_LONG, text, M.INVALID_REQUEST)]

    def editor_line(self, line: bytes) -> list[Action]:
        """One line the editor wrote (without its newline)."""
        if not line.strip():
            return []
        if len(line) > self.limits.max_line_bytes:
            return self.editor_line_too_long()
        try:
            if too_deep(line):
                raise msgspec.DecodeError("nested too deeply")
            message = msgspec.json.decode(line)
        except (msgspec.DecodeError, RecursionError) as err:
            return [self._error(None, "PARSE_ERROR", f"not JSON: {err}", M.PARSE_ERROR)]
        if not isinstance(message, dict):
            text = "not a JSON-RPC message"
            return [self._error(None, "INVALID_REQUEST", text, M.INVALID_REQUEST)]
        method, has_id = message.get("method"), "id" in message
        if method is None and has_id:
            return self._editor_answer(message)
        if not isinstance(method, str) or (has_id and not M.valid_id(message["id"])):
            id_ = message["id"] if has_id and M.valid_id(message["id"]) else None
            text = "not a JSON-RPC request, notification or response"
            return [self._error(id_, "INVALID_REQUEST", text, M.INVALID_REQUEST)]
        return self._route(message, len(line))

    def _route(self, message: dict[str, Any], size: int) -> list[Action]:
        """Send on the link of the session the message is about, once that link is live."""
        session = M.session_params(message).sessionId
        if session in self._ended and message["method"] not in UNPLACED:
            return self._refuse(message, SESSION_TERMINATED, ENDED.format(session))
        name = PRIMARY
        if message["method"] not in UNPLACED and session:
            attached = self._sessions.get(session)
            name = attached.link if attached else self._pods.get(session, PRIMARY)
        out: list[Action] = []
        if name not in self._links:
            self._links[name] = R.Link(name)
            out.append(Connect(name))
        ln = self._links[name]
        if ln.phase == "live":
            return out + self._send(ln, message)
        if self._queued >= self.limits.max_queued or (
            self._queued_bytes + size > self.limits.max_queued_bytes
        ):
            text = "too many messages wait for the gateway"
            return out + self._refuse(message, TOO_MANY_REQUESTS, text)
        ln.queue.append((message, size))
        self._queued += 1
        self._queued_bytes += size
        return out

    def _send(self, ln: R.Link, message: dict[str, Any]) -> list[Action]:
        method: str = message["method"]
        if "id" not in message:  # a notification: nothing comes back
            return [ToGateway(M.encode(message), ln.name)]
        if len(self._sent) >= self.limits.max_pending:
            return self._refuse(message, TOO_MANY_REQUESTS, "too many requests in flight")
        params = M.session_params(message)
        sent = R.Sent(method, ln.name, message["id"], message=message, session_id=params.sessionId)
        if method in ATTACHING:
            if (
                params.sessionId not in self._sessions
                and len(self._sessions) >= self.limits.max_sessions
            ):
                text = f"over {self.limits.max_sessions} sessions"
                return self._refuse(message, M.TOO_MANY_SESSIONS, text)
            mcp_servers = (message.get("params") or {}).get("mcpServers")
            sent.attach = (params.cwd, [] if mcp_servers is None else mcp_servers)
            if method == "session/load":
                self._loading.setdefault(params.sessionId, SeenWindow(self.limits.seen_window))
        elif method == "session/close":
            self._sessions.pop(params.sessionId, None)
            self._mark.pop(params.sessionId, None)
            self._loading.pop(params.sessionId, None)
            self._prompts.pop(params.sessionId, None)
        if method == "initialize":
            message = {**message, "params": M.with_turn_events(message.get("params"))}
        relay_id = next(self._ids)
        self._sent[relay_id] = sent
        if method == "session/prompt":
            self._prompts[params.sessionId] = R.Prompt(message["id"], relay_id)
        return [ToGateway(M.encode({**message, "id": relay_id}), ln.name)]

    def _editor_answer(self, message: dict[str, Any]) -> list[Action]:
        """The editor answered one of the gateway's requests (a permission question)."""
        editor_id = message["id"]
        question = self._questions.get(editor_id) if isinstance(editor_id, int) else None
        if question is None:
            return [Log(f"the editor answered an unknown request {editor_id!r}; dropped")]
        ln = self._links[question.link]
        if question.epoch == ln.epoch and ln.phase != "connecting":
            self._forget_question(editor_id)
            return [ToGateway(M.encode({**message, "id": question.gateway_id}), ln.name)]
        if question.key is None:  # asked on a connection that is gone, not one to ask again
            self._forget_question(editor_id)
            return [Log(f"answer to request {editor_id} dropped: its connection is gone")]
        question.answer = message  # sent when the gateway asks it again after the reload
        return []

    # --- gateway -> editor ---------------------------------------------------------------------

    def gateway_message(self, data: bytes | str, link: str = PRIMARY) -> list[Action]:
        """One text message from the WebSocket of ``link``."""
        raw = data.encode() if isinstance(data, str) else data
        try:
            env = msgspec.json.decode(raw, type=M.Envelope)
        except (msgspec.DecodeError, RecursionError) as err:
            return [Log(f"the gateway sent a message that is not JSON-RPC ({err}); dropped")]
        if env.method is not None:
            if isinstance(env.id, msgspec.UnsetType):
                return self._notification(env, raw)
            return self._gateway_request(self._links[link], env, env.id, raw)
        if isinstance(env.id, int) and env.id in self._sent and self._sent[env.id].link == link:
            return self._answer(self._sent.pop(env.id), env, raw)
        return [Log(f"the gateway answered an unknown request {env.id!r}; dropped")]

    def _notification(self, env: M.Envelope, raw: bytes) -> list[Action]:
        if env.method not in ("session/update", M.TURN_EVENT):
            return [ToEditor(raw + b"\n")]
        placed = M.decode_placed(env.params)
        session, message_id = placed.sessionId, placed.rawp.messageId
        before = self._mark.get(session)
        if session in self._own_prompt_reloaded:
            # Replayed from before the turn's start: the editor's own prompt, which it never got
            # as an update (the gateway relays a prompt to the other masters only), stays out.
            if message_id is not None and message_id == self._own_prompt_reloaded[session]:
                del self._own_prompt_reloaded[session]
            elif placed.update is not None and placed.update.sessionUpdate == "user_message_chunk":
                return []
        if message_id is not None:
            loading = self._loading.get(session)
            if loading is not None:  # the editor's load: its whole replay, once
                if not loading.first_time(message_id):
                    return []
                self._seen.first_time(message_id)
            elif not self._seen.first_time(message_id):
                return []  # passed on before the drop
            if session in self._sessions or len(self._mark) < self.limits.max_sessions:
                self._mark[session] = message_id
        if env.method == M.TURN_EVENT:
            return self._turn_event(placed, before)
        return [ToEditor(raw + b"\n")]

    def _turn_event(self, placed: M.Placed, before: str | None) -> list[Action]:
        if placed.event == "end":
            self._forget_stale_questions(placed.sessionId)
        prompt = self._prompts.get(placed.sessionId)
        if prompt is None or placed.turnId is None:
            return []
        if placed.event == "start" and prompt.turn_id is None:
            # A live start names the prompt that opened it; a replayed one does not, and the
            # first start after the prompt is its turn (another master's prompt is refused
            # while a turn runs).
            if placed.requestId is None or placed.requestId == prompt.relay_id:
                prompt.turn_id = placed.turnId
                prompt.before_start, prompt.start_seen = before, True
                prompt.start_id = placed.rawp.messageId
        elif placed.event == "end" and prompt.turn_id == placed.turnId and prompt.orphan:
            del self._prompts[placed.sessionId]
            return [M.turn_answer(prompt.editor_id, placed.turnId, placed.stopReason or "")]
        return []

    def _gateway_request(
        self, ln: R.Link, env: M.Envelope, gateway_id: Id, raw: bytes
    ) -> list[Action]:
        key = None
        placed = M.Placed()
        if env.method == "session/request_permission":
            placed = M.decode_placed(env.params)
            key = placed.rawp.interactionId or (
                f"{placed.sessionId} {placed.toolCall.toolCallId}"
                if placed.toolCall and placed.toolCall.toolCallId
                else None
            )
        if key is not None and key in self._by_key:  # asked again after a reload
            editor_id = self._by_key[key]
            question = self._questions[editor_id]
            question.link, question.epoch, question.gateway_id = ln.name, ln.epoch, gateway_id
            if question.answer is None:
                return []
            self._forget_question(editor_id)
            return [ToGateway(M.encode({**question.answer, "id": gateway_id}), ln.name)]
        if len(self._questions) >= self.limits.max_questions:
            error = M.rpc_error(
                gateway_id,
                M.RELAY_ERROR,
                "the editor has too many open requests",
                TOO_MANY_REQUESTS,
            )
            refused = ToGateway(M.encode(error), ln.name)
            return [refused, Log("too many open editor requests; one refused")]
        editor_id = next(self._question_ids)
        session = placed.sessionId if key is not None else ""
        self._questions[editor_id] = R.Question(ln.name, ln.epoch, gateway_id, key, session)
        if key is not None:
            self._by_key[key] = editor_id
        return [M.line(M.with_id(raw, editor_id))]

    def _answer(self, sent: R.Sent, env: M.Envelope, raw: bytes) -> list[Action]:
        failed = M.is_error(env)
        session = sent.session_id
        pod = M.other_pod(env.error) if failed and sent.method in ATTACHING else None
        if pod is not None and pod != sent.link:
            return self._elsewhere(sent, session, pod)
        if sent.method == "session/new" and not failed:
            session = M.decode_placed(env.result).sessionId
            sent.session_id = session
        if sent.method in ATTACHING and not failed and session and sent.from_editor:
            self._sessions[session] = R.Session(*sent.attach, sent.link)
        out: list[Action] = []
        if sent.method == "session/list" and not failed and sent.from_editor:
            self._learn_pods(M.pods_of(env.result), move=False)
        if sent.method in ("session/load", "session/resume"):
            self._loading.pop(session, None)
            out += self._loaded(session, env, failed)
        if not sent.from_editor:
            return out + self._reloaded(sent, env, failed)
        if sent.method == "initialize" and not failed and sent.message is not None:
            self._initialized = sent.message.get("params") or {}
        if sent.method == "session/prompt":
            self._prompts.pop(session, None)
        return [*out, M.line(M.with_id(raw, sent.editor_id))]

    # --- the reload after a reconnect -------------------------------------------------------------

    def _own(self, ln: R.Link, method: str, params: Any, session_id: str = "") -> ToGateway:
        relay_id = next(self._ids)
        self._sent[relay_id] = R.Sent(method, ln.name, from_editor=False, session_id=session_id)
        message = {"jsonrpc": "2.0", "id": relay_id, "method": method, "params": params}
        return ToGateway(M.encode(message), ln.name)

    def _load_again(self, ln: R.Link, session: str) -> ToGateway:
        attached = self._sessions[session]
        params: dict[str, Any] = {
            "sessionId": session,
            "cwd": attached.cwd,
            "mcpServers": attached.mcp_servers,
        }
        mark = self._mark.get(session)
        prompt = self._prompts.get(session)
        if prompt is not None and prompt.orphan and prompt.start_seen:
            # From just before its turn's start: the gateway's view of this connection then
            # knows the running turn (a session/cancel needs it); what the editor already got
            # of the turn is dropped as seen.
            mark = prompt.before_start
            self._own_prompt_reloaded[session] = prompt.start_id
        if mark:
            params["_meta"] = {"rawp": {"lastMessageId": mark}}
        ln.reloads_left += 1
        return self._own(ln, "session/load", params, session)

    def _elsewhere(self, sent: R.Sent, session: str, pod: str) -> list[Action]:
        """A load refused SESSION_ON_OTHER_POD: the same load, on that pod's own socket (the
        editor's, which waits for it; or the relay's own after a reconnect)."""
        self._pods[session] = pod
        if not sent.from_editor:
            ln = self._links[sent.link]
            ln.reloads_left -= 1
            return self._move(session, pod) + self._reloaded_done(ln)
        assert sent.message is not None
        self._loading.pop(session, None)
        if session in self._sessions:
            self._sessions[session].link = pod
        return [
            Log(f"session {session} is on pod {pod}: loading it there"),
            *self._route(sent.message, 0),
        ]

    def _move(self, session: str, pod: str) -> list[Action]:
        """Our session lives on ``pod``: load it on that pod's socket, now or once it connects."""
        out: list[Action] = []
        self._sessions[session].link = pod
        if pod not in self._links:
            self._links[pod] = R.Link(pod)
            out.append(Connect(pod))
        elif self._links[pod].phase != "connecting":
            out.append(self._load_again(self._links[pod], session))
        return out

    def _learn_pods(self, pods: dict[str, str], *, move: bool = True) -> list[Action]:
        """Where sessions live, from a session/list answer. With ``move`` (the relay's own list
        after the link at --url reconnected) a session of ours attached at --url moves to its
        pod's own link, and is loaded there, now or when that link connects."""
        out: list[Action] = []
        for session, pod in pods.items():
            if session in self._pods or len(self._pods) < self.limits.max_sessions:
                self._pods[session] = pod
            attached = self._sessions.get(session)
            if move and attached is not None and attached.link == PRIMARY:
                out += self._move(session, pod)
        return out

    def _loaded(self, session: str, env: M.Envelope, failed: bool) -> list[Action]:
        """A load answered: where the replay left off, what the gateway's buffer had lost, and
        the prompt of this session whose connection dropped."""
        out: list[Action] = []
        self._own_prompt_reloaded.pop(session, None)
        rawp = M.Rawp() if failed else M.decode_placed(env.result).rawp
        if rawp.lastMessageId:
            self._mark[session] = rawp.lastMessageId
        if rawp.lostFrames:
            out.append(
                Log(f"session {session}: the gateway no longer had {rawp.lostFrames} update(s)")
            )
        prompt = self._prompts.get(session)
        if prompt is None or not prompt.orphan:
            return out
        if not failed and rawp.turnId is not None and prompt.turn_id in (None, rawp.turnId):
            prompt.turn_id = rawp.turnId  # still running: its end answers the prompt
            return out
        if not failed and prompt.turn_id is not None and not rawp.lostFrames:
            # Its end would have been in the replay (it came after the last update passed on,
            # and the buffer lost nothing): still running, whatever the load's turnId says.
            return out
        del self._prompts[session]
        if prompt.turn_id is None:
            text = "the connection dropped before the gateway took this prompt; send it again"
        else:
            text = "the turn of this prompt ended while the connection was down"
        return [*out, self._error(prompt.editor_id, CONNECTION_LOST, text)]

    def _reloaded(self, sent: R.Sent, env: M.Envelope, failed: bool) -> list[Action]:
        ln = self._links[sent.link]
        out: list[Action] = []
        if sent.method == "initialize":
            if failed:
                refused = M.error_text(env.error)
                out.append(ln.says(f"the gateway refused initialize again: {refused}"))
            if ln.name == PRIMARY and any(s.link == PRIMARY for s in self._sessions.values()):
                # Through a router this socket may now be on another gateway than the one that
                # holds them: where are they? (One gateway alone names no pod: they stay.)
                ln.reloads_left += 1
                out.append(self._own(ln, "session/list", {}))
            else:
                out += self._load_all(ln)
        elif sent.method == "session/list":
            ln.reloads_left -= 1
            out += self._learn_pods({} if failed else M.pods_of(env.result))
            out += self._load_all(ln)
        elif sent.method == "session/load":
            ln.reloads_left -= 1
            if failed:
                self._sessions.pop(sent.session_id, None)
                why = M.error_text(env.error)
                out.append(ln.says(f"session {sent.session_id} could not be loaded again: {why}"))
        return out + self._reloaded_done(ln)

    def _reloaded_done(self, ln: R.Link) -> list[Action]:
        if ln.phase != "reloading" or ln.reloads_left > 0:
            return []
        ln.phase = "live"
        return [ln.says("sessions loaded again; relaying"), *self._flush(ln)]

    def _load_all(self, ln: R.Link) -> list[Action]:
        return [self._load_again(ln, s) for s, a in self._sessions.items() if a.link == ln.name]

    # --- helpers ---------------------------------------------------------------------------------

    def _flush(self, ln: R.Link) -> list[Action]:
        queue, ln.queue = ln.queue, []
        self._queued -= len(queue)
        self._queued_bytes -= sum(size for _, size in queue)
        out: list[Action] = []
        for message, _ in queue:
            out += self._send(ln, message)
        return out

    def _refuse(self, message: dict[str, Any], error_code: str, text: str) -> list[Action]:
        if "id" not in message:  # a notification cannot be answered
            return [Log(f"{message.get('method')} dropped: {text}")]
        return [self._error(message["id"], error_code, text)]

    @staticmethod
    def _error(id_: Id, error_code: str, text: str, code: int = M.RELAY_ERROR) -> ToEditor:
        return M.line(M.rpc_error(id_, code, text, error_code))

    def _forget_stale_questions(self, session: str) -> None:
        """A turn of ``session`` ended: its questions asked on a connection that is gone will not
        be asked again (those still open were, after the reload)."""
        for editor_id, q in list(self._questions.items()):
            if q.session == session and q.epoch != self._links[q.link].epoch:
                self._forget_question(editor_id)

    def _forget_question(self, editor_id: int) -> None:
        question = self._questions.pop(editor_id)
        if question.key is not None:
            self._by_key.pop(question.key, None)


def _colon(reason: str) -> str:
    return f": {reason}" if reason else ""
