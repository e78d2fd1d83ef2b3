"""A live session: the asyncio shell around one ``SessionMachine``.

Theory of operation
-------------------
``LiveSession`` owns what the sans-IO machine may not touch: the agent process, the WebSocket
connections, the history buffer, timers and metrics. It feeds the machine (agent lines, master
frames, exits, timers) and carries out the actions it returns, in order, in ``perform``:

* ``Emit`` broadcast: encode once, append to history, offer the same bytes to every connection whose
  announced features admit the frame (a second encoding without ``subagent_context`` is made at
  most once per frame, for connections that did not announce it);
* ``Emit`` to one connection: a reply (``session.error``) or a greeting; not buffered;
* ``Spawn``/``WriteStdin``/``Signal``/``Terminate``: the agent process (writes made while the process
  is still starting are queued and flushed once it runs). Input the agent has not read (that queue,
  or the stdin pipe's buffer) is bounded by ``max_stdin_bytes``: a prompt that would pass it is
  refused before it opens a turn, with a non-fatal ``session.error`` ``AGENT_STDIN_FULL`` to its
  sender; any other write past it is dropped and every master is told the same way;
* ``StartTimer``/``CancelTimer``: ``loop.call_later`` handles by key;
* ``CloseAll``: every connection flushes its queue, then closes.
* ``WritePrompt``/``PlaceFile`` and ``Spawn.images``: a prompt's attached files, read from the
  session's ``FileStore`` (``gateway/storage/files.py``), which also keeps what tools return as bytes
  (stored between the parser and the machine, in ``_pump``) and is emptied with the session.

The reattach window (docs/http-api.md): while no connection is attached the session is
``DETACHED``; when the window runs out the machine deletes it with ``reason: "timeout"``.

With a state directory (``gateway/storage/state_dir.py``) every broadcast frame also goes to the
session's frame log and the record is rewritten when what it holds changes. ``suspend`` stops the
agent without a word to the machine when the gateway stops; ``LiveSession.restore`` makes the
session again from its files, closes the turn that was open (``gateway/protocol/recovery.py``) and
leaves the agent to be spawned, resumed, by the next prompt.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar, Final, cast

import msgspec

from gateway import config as cfg
from gateway.agent.process import (
    DEFAULT_MAX_LINE_BYTES,
    AgentProcess,
    AgentProcessError,
    AgentStartError,
    AgentStdinFull,
    StdoutLine,
)
from gateway.metrics import GatewayMetrics
from gateway.protocol import actions as act
from gateway.protocol import codec, prompts, recovery
from gateway.protocol import frames as F
from gateway.protocol import machine as sm
from gateway.protocol.capabilities import ConnectionFilter, strip_subagent_context
from gateway.protocol.history import History, Replay
from gateway.protocol.replay import history_frames
from gateway.protocol.usage import CONTEXT_FULL, UsageTally
from gateway.session.fanout import Connection, Flusher, text_frame
from gateway.storage import nofollow
from gateway.storage.files import FileError, FileStore, files_path, store_tool_files
from gateway.storage.state_dir import COMPACT_SLACK, FORMAT, VERSION, Loaded, SavedSession
from gateway.team import auth
from gateway.team.audit import cut_input as audit_input
from parsers import events as ev
from parsers.base import PromptImage
from parsers.base import get as get_parser
from parsers.saved import Transcript

__all__ = ["LiveSession"]

_Route = tuple[tuple[Connection, ...], tuple[Connection, ...], tuple[Connection, ...]]

log = logging.getLogger("rawp_gateway.session")

BATCH_LINES = 256  # agent lines handled between two turns of the event loop, at most

# agent.error code of a warning: the agent printed a line over the reader's limit (it was dropped)
LINE_TOO_LONG = "AGENT_LINE_TOO_LONG"


class LiveSession:
    def __init__(
        self,
        session_id: str,
        profile: cfg.AgentProfile,
        workspace: Path,
        *,
        config: cfg.Config,
        metrics: GatewayMetrics,
        name: str | None = None,
        origin: str = "remote",
        reattach_window_sec: float | None = None,
        history: History | None = None,
        on_terminated: Callable[[LiveSession], None] | None = None,
        saved: SavedSession | None = None,
    ) -> None:
        self.id = session_id
        self.profile = profile
        self.workspace = workspace
        self.config = config
        self.metrics = metrics
        self.origin = origin
        # Who may see and drive the session (gateway/team/auth.py): set by the server when it is created
        # or restored. "local" when the gateway has no credentials configured.
        self.owner = auth.LOCAL.user
        self.members: dict[str, str] = {}
        self.senders: dict[str, auth.Sender] = {}  # who is on each connection
        # The gateway's audit log and webhook notifier (gateway/team/audit.py, gateway/team/notify.py).
        self.audit: Any = None
        self.notifier: Any = None
        self.created_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.reattach_window_sec = (
            config.reattach_window_sec if reattach_window_sec is None else reattach_window_sec
        )
        if history is None:
            history = History(config.buffer_policy, config.buffer_max_bytes)  # type: ignore[arg-type]
        self.history = history
        spec = get_parser(profile.parser)
        parser, self.agent_input = spec.make()
        self.files = FileStore(
            session_id,
            max_session_bytes=config.max_session_file_bytes,
            max_upload_bytes=config.max_upload_bytes,
            metrics=metrics,
            directory=(saved.dir_fd, saved.path) if saved is not None else None,
            url_of=lambda transfer_id, _path: (
                config.route_prefix + files_path(session_id, transfer_id)
            ),
        )
        set_workspace = getattr(parser, "set_workspace", None)
        if set_workspace is not None:  # parsers.base.ReadsWorkspace: it reads the agent's files
            set_workspace(str(workspace))
        self.machine = sm.SessionMachine(
            session_id,
            parser,
            self.agent_input,
            sm.SessionConfig(
                agent=profile.name,
                features=profile.features,
                single_turn_process=profile.single_turn_process,
                auto_allow=profile.auto_allow,
                permission_timeout_sec=profile.permission_timeout_sec,
                max_frame_size=config.max_frame_size,
                accepts_images=(
                    profile.image_flag is not None
                    if profile.prompt_in_argv
                    else getattr(self.agent_input, "accepts_images", False)
                ),
                stall_warning_sec=profile.stall_warning_sec,
                stall_timeout_sec=profile.stall_timeout_sec,
                prompt_argv_max=(
                    cfg.MAX_ARGV_PROMPT_BYTES
                    if profile.prompt_in_argv and profile.stdin_prompt_arg is None
                    else None
                ),
                tools=profile.tools,
                credentials=spec.credentials,
            ),
            files=self.files.files,
        )
        self.machine.name = name
        self.connections: dict[str, Connection] = {}
        self._routes: dict[str, _Route] = {}
        self._flusher = Flusher()
        self.process: AgentProcess | None = None
        self._spawning = False
        self._spawned = asyncio.Event()
        self.start_error: str | None = None
        self._stdin_pending: list[bytes] = []
        self._unplaced: list[tuple[str, str]] = []  # (file name, why): PlaceFile that failed
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._line_t_ns = 0
        self._turn_started = 0.0
        self._lines = metrics.agent_lines(profile.name)
        self.terminated = asyncio.Event()
        self._on_terminated = on_terminated
        self._state = "DETACHED"
        metrics.session_state(None, self._state, agent=profile.name)
        # What the agent used (gateway/protocol/usage.py): counted into the metrics, kept in the record.
        self.usage = UsageTally()
        self._limit_turn: str | None = None  # the last turn counted as hitting the context limit
        # Persistence (None: in memory only).
        self.saved = saved
        self._restored: recovery.OpenItems | None = None
        self._suspended = False
        self._last_record: dict[str, Any] | None = None  # what the record on disk says
        if saved is not None:
            saved.entries = history.entries
            saved.compact_above = 2 * history.max_bytes + COMPACT_SLACK

    # --- public view -------------------------------------------------------------------------

    @property
    def state(self) -> str:
        if self.machine.phase == "terminated":
            return "TERMINATED"
        if not self.connections:
            return "DETACHED"
        return "RUNNING" if self.machine.turn is not None else "IDLE"

    def _track_state(self) -> None:
        new = self.state
        if new != self._state:
            self.metrics.session_state(self._state, new)
            self._state = new

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "session_id": self.id,
            "name": self.machine.name,
            "agent": self.profile.name,
            "origin": self.origin,
            "state": self.state,
            "agent_state": self.machine.mapper.state,
            "mode": self.machine.mode,
            "turn_index": self.machine.turn_count,
            "connections": len(self.connections),
            "created_at": self.created_at,
            "ws_path": f"{self.config.route_prefix}/v1/session/{self.id}/ws",
            "workspace_path": str(self.workspace),
            "owner": self.owner,
            "members": dict(self.members),
        }
        if self.machine.agent_session_id:
            obj["agent_session_id"] = self.machine.agent_session_id
        if self.config.route_prefix:  # a fleet: the gateway that holds it (docs/fleet.md)
            obj["pod"] = self.config.pod_name
        return obj

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the session; for a long-lived agent, wait until its process runs (or failed to
        start: then ``start_error`` says why and the session is already terminated). A restored
        session closes the turn it had open instead; its agent starts with the next prompt."""
        if self._restored is not None:
            items, self._restored = self._restored, None
            if items.turn_id:
                self.perform(self.machine.close_interrupted_turn(items))
        else:
            self.perform(self.machine.start())
        self._save_record()
        self._arm_reattach_window()
        if self._spawning:
            await self._spawned.wait()

    @classmethod
    def restore(
        cls,
        loaded: Loaded,
        profile: cfg.AgentProfile,
        workspace: Path,
        *,
        config: cfg.Config,
        metrics: GatewayMetrics,
        on_terminated: Callable[[LiveSession], None] | None = None,
    ) -> LiveSession:
        """The session ``loaded`` from its files after a restart (then ``start()`` it). Raises
        ValueError when its record cannot be used."""
        record = loaded.record
        buffer = record["buffer"]
        history = History(buffer.get("policy", "RING"), int(buffer.get("max_bytes", 0)))
        frames = [data for _, _, data in loaded.entries if data is not None]
        last = frames[-1] if frames else None
        boundary = record.get("crash_boundary")
        history.load(
            loaded.entries,
            last_timestamp=recovery.timestamp_of(last) if last else None,
            crashed=not record["clean"] or loaded.torn,
            crash_boundary=boundary if type(boundary) is int else None,
        )
        session = cls(
            record["session_id"],
            profile,
            workspace,
            config=config,
            metrics=metrics,
            name=record.get("name"),
            origin=record["origin"],
            reattach_window_sec=float(record["reattach_window_sec"]),
            history=history,
            on_terminated=on_terminated,
            saved=loaded.saved,
        )
        session.created_at = record["created_at"]
        # A record written before sessions had owners was the token holder's: user admin.
        owner = record.get("owner")
        session.owner = owner if isinstance(owner, str) and owner else auth.ADMIN.user
        try:
            session.members = auth.check_members(record.get("members", {}))
        except ValueError:
            session.members = {}
        session.files.restore()
        newest = recovery.last_frames_of(frames, ("tool.catalog.publish", "agent.commands.publish"))
        machine = session.machine
        machine.restore(
            name=record.get("name"),
            mode=record["mode"],
            turn_count=record["turn_index"],
            agent_session_id=record.get("agent_session_id"),
            catalog=_decoded(newest.get("tool.catalog.publish")),
            commands=_decoded(newest.get("agent.commands.publish")),
        )
        machine.factory.clock_not_before(history.last_timestamp)
        session.usage.restore(record.get("usage"))
        open_turn = record.get("open_turn_id")
        session._restored = (
            recovery.open_items(frames, open_turn) if open_turn else recovery.OpenItems("")
        )
        return session

    async def suspend(self) -> None:
        """The gateway stops and the session is to live on (state directory): stop the agent
        without telling the machine (the open turn is closed when the session is loaded again),
        write everything down as a clean stop, and close every WebSocket with 1012 (service
        restart) so masters reattach later with their last message id."""
        if self.machine.phase == "terminated" or self.saved is None or self._suspended:
            return
        self._suspended = True
        for key in list(self._timers):
            self._cancel_timer(key)
        await self._stop_agent()
        self._save_record(clean=True)
        self.saved.sync()
        self.files.release()
        self.saved.release()
        conns = list(self.connections.values())
        for conn in conns:
            conn.close_after_flush(1012, "the gateway is restarting; reattach with last_message_id")
        if conns:
            await asyncio.wait([asyncio.ensure_future(c.closed.wait()) for c in conns], timeout=5)

    def _record(self, *, clean: bool = False) -> dict[str, Any]:
        machine = self.machine
        return {
            "format": FORMAT,
            "version": VERSION,
            "session_id": self.id,
            "name": machine.name,
            "agent": self.profile.name,
            "workspace_path": str(self.workspace),
            "origin": self.origin,
            "created_at": self.created_at,
            "owner": self.owner,
            "members": dict(self.members),
            "mode": machine.mode,
            "turn_index": machine.turn_count,
            "open_turn_id": machine.turn.turn_id if machine.turn is not None else None,
            "reattach_window_sec": self.reattach_window_sec,
            "agent_session_id": machine.agent_session_id,
            "usage": self.usage.to_json(),
            "buffer": {"policy": self.history.policy, "max_bytes": self.history.max_bytes},
            "clean": clean,
            "crash_boundary": self.history.crash_boundary,
        }

    def _save_record(self, *, clean: bool = False) -> None:
        """Rewrite the record if what it says changed (or, ``clean``, for a graceful stop)."""
        saved = self.saved
        if saved is None or saved.removed or self.machine.phase == "terminated":
            return
        record = self._record(clean=clean)
        if record == self._last_record:
            return
        self._last_record = record
        try:
            saved.write_record(record)
        except OSError as err:
            log.error("cannot write the session record", extra={"session": self.id, "error": err})

    async def delete(
        self, reason: F.DeleteReason = "master_request", deleted_by: F.DeletedBy = "master"
    ) -> None:
        self.perform(self.machine.delete(reason, deleted_by))
        await self.terminated.wait()

    def rename(self, name: str) -> None:
        self.perform(self.machine.rename(name, renamed_by="master"))

    def share(self, members: dict[str, str]) -> None:
        """Replace who the session is shared with; a connection whose user may no longer see it
        is closed (1008, policy violation)."""
        self.members = dict(members)
        self._save_record()
        gone = {
            sender.identity.user
            for sender in self.senders.values()
            if auth.session_role(sender.identity, self.owner, self.members) is None
        }
        self.close_users(gone, "the session is no longer shared with you")

    def close_users(self, users: set[str], reason: str) -> None:
        """Close (1008, policy violation) every connection of these users."""
        for conn_id, sender in list(self.senders.items()):
            conn = self.connections.get(conn_id)
            if sender.identity.user in users and conn is not None:
                conn.close_after_flush(1008, reason)

    # --- connections ----------------------------------------------------------------------------

    def attach(
        self,
        conn_id: str,
        ws: Any,
        *,
        role: str,
        last_message_id: str | None,
        full_history: bool = False,
        transport: asyncio.WriteTransport,
        drain: Callable[[], Awaitable[None]],
        abort: Callable[[], None] | None = None,
        sender: auth.Sender | None = None,
    ) -> Connection:
        """A new connection; with ``last_message_id`` a reattach, with ``full_history`` a master
        that has nothing yet and asks for everything buffered (``?history=all``). ``sender``: who
        is on it, whose role on the session decides what it may send (None: no checks)."""
        conn = Connection(
            conn_id,
            ws,
            transport=transport,
            drain=drain,
            role=role,
            max_queue_bytes=self.config.send_queue_bytes,
            observe_latency_ns=self.metrics.observe_latency_ns,
            clock_ns=time.perf_counter_ns,
            abort=abort,
            flusher=self._flusher,
        )
        self.connections[conn_id] = conn
        if sender is not None:
            self.senders[conn_id] = sender
        self._routes.clear()
        self._cancel_timer("reattach-window")
        self.metrics.ws_connected(role)
        # The greeting (Emits to this connection alone), each frame encoded once: capabilities
        # first, then (on reattach) the history in the room the rest leaves in the send queue, then
        # catalog/commands/interactions.
        greeting = [
            (a.frame, text_frame(codec.encode(a.frame)))
            for a in self.machine.attached(conn_id)
            if isinstance(a, act.Emit)
        ]
        first, rest = greeting[0], greeting[1:]
        self._send_to(conn, *first)
        if last_message_id is not None or full_history:
            after = sum(len(framed) for _, framed in rest)
            if last_message_id is not None:
                replay = self.history.since(last_message_id)
                lost = self._send_history(conn, replay, last_message_id, after)
                self.metrics.reattached(lost_frames=lost)
            else:
                # An empty history is still in sync with the capabilities just sent (they are
                # marked in the buffer): a later reattach after that id is exact.
                greeting_id = first[0].message_id
                self._send_history(conn, self.history.everything(), greeting_id, after)
        for frame, framed in rest:
            self._send_to(conn, frame, framed)
        self._track_state()
        return conn

    def _send_to(self, conn: Connection, frame: F.Frame, framed: bytes) -> None:
        """A frame (``text_frame``) for one connection alone: queued for it and marked in the
        history, so that a reattach naming it replays what came after it."""
        conn.send(framed)
        if self.history.mark(frame.message_id) and self.saved is not None:
            self.saved.append(self.history.last_seq, frame.message_id, None)

    def _send_history(self, conn: Connection, replay: Replay, since: str, reserve: int) -> int:
        """``session.history`` in frames that fit ``max_frame_size`` (``protocol/replay.py``), no
        more in all than the connection's send queue takes beside the ``reserve`` still to come.
        ``since`` is the id the history is in sync with when the session has produced nothing.
        Returns the frames lost (1 when some are and their number is unknown)."""
        frames, unsent = history_frames(
            self.machine.factory,
            replay.frames,
            truncated=replay.truncated,
            lost_frame_count=replay.lost_frame_count,
            last_message_id=replay.last_message_id or since,
            last_sync_timestamp=replay.last_timestamp or self.machine.factory.clock(),
            policy=self.history.policy,
            buffer_high_watermark=self.history.high_watermark,
            max_frame_size=self.config.max_frame_size,
            max_total_bytes=conn.max_queue_bytes - conn.queued_bytes - reserve,
        )
        for data in frames:
            conn.offer(data)
        lost = (replay.lost_frame_count or 0) + unsent
        return lost or (1 if replay.truncated else 0)

    def detach(self, conn_id: str) -> None:
        conn = self.connections.pop(conn_id, None)
        self.senders.pop(conn_id, None)
        if conn is None:
            return
        self._routes.clear()
        self.metrics.ws_disconnected(conn.role)
        self._arm_reattach_window()
        self._track_state()

    def _arm_reattach_window(self) -> None:
        if not self.connections and self.machine.phase != "terminated" and not self._suspended:
            self._set_timer("reattach-window", self.reattach_window_sec)

    def receive(self, conn_id: str, data: str | bytes) -> None:
        """A frame from a master. One its sender's role on this session forbids is answered with
        ``session.error`` ``FORBIDDEN`` on its connection alone and changes nothing."""
        sender = self.senders.get(conn_id)
        if self._suspended:
            return  # the gateway is stopping; the master reattaches and sends it again
        peek = _peek_frame(data)
        self.metrics.frame_in(peek.type, len(data))
        self._line_t_ns = 0
        if sender is not None and not self._permitted(conn_id, peek, sender):
            return
        if peek.type == "control.prompt.request" and self._stdin_full(len(data)):
            # Refused before the machine opens a turn for it (the frame's size bounds what the
            # prompt becomes on stdin): nothing is started that the agent could not be told.
            mid = peek.message_id if isinstance(peek.message_id, str) else None
            self._stdin_full_error(mid, to=conn_id)
            return
        if sender is None:
            self.perform(self.machine.receive(conn_id, data))
            return
        audited = self.audit is not None and peek.type in auth.AUDITED
        asked = self._permission_asked(data) if audited else None
        self.perform(self.machine.receive(conn_id, data, user=sender.identity.user))
        if audited:
            self._audit_control(peek.type, sender, asked)

    def _permitted(self, conn_id: str, peek: _Peek, sender: auth.Sender) -> bool:
        role = auth.session_role(sender.identity, self.owner, self.members)
        if auth.may_send(role, peek.type):
            return True
        mid = peek.message_id if isinstance(peek.message_id, str) else None
        payload = F.SessionError(
            error_code="FORBIDDEN",
            message=f"{peek.type} needs role {auth.needed(peek.type)} on this session; "
            f"{sender.identity.user} has {role or 'none'}",
            fatal=False,
        )
        self.perform([act.Emit(self.machine.factory.frame(payload, parent_id=mid), to=conn_id)])
        if self.audit is not None:
            self.audit.record(
                auth.AUDITED.get(peek.type, peek.type),
                sender.identity,
                peer=sender.peer,
                session_id=self.id,
                result="refused",
                detail={"frame": peek.type[:64], "session_role": role},
            )
        return False

    def _permission_asked(self, data: str | bytes) -> tuple[str, Any] | None:
        """The interaction a ``control.interaction.*`` frame answers, before the machine settles
        it: (its id, what it asked) for the audit record."""
        interaction_id = _peek_answer(data)
        if interaction_id is None:
            return None
        return interaction_id, self.machine.interactions.get(interaction_id)

    def _audit_control(
        self, type_: str, sender: auth.Sender, asked: tuple[str, Any] | None
    ) -> None:
        detail: dict[str, Any] = {}
        if asked is not None:
            interaction_id, pending = asked
            detail["interaction_id"] = interaction_id
            if pending is not None and interaction_id not in self.machine.interactions:
                detail["tool_name"] = pending.tool_name
                detail["decision"] = self.machine.last_decision
                detail["input"] = audit_input(pending.input)
        self.audit.record(
            auth.AUDITED[type_],
            sender.identity,
            peer=sender.peer,
            session_id=self.id,
            detail=detail,
        )

    # --- the agent process ----------------------------------------------------------------------

    def _spawn(self, action: act.Spawn) -> None:
        profile = self.profile
        resume_id = action.resume_id or None
        on_stdin = cfg.prompt_on_stdin(profile, action.prompt)
        argv = cfg.command_for(
            profile,
            prompt=action.prompt,
            workspace=str(self.workspace),
            resume_id=resume_id,
            on_stdin=on_stdin,
        )
        flags: list[str] = []
        if resume_id and profile.resume_flag and not profile.resume_command:
            flags += cfg.template_args(profile.resume_flag, session_id=resume_id)
        cli_mode = "plan" if action.mode == "plan" else None
        if cli_mode and profile.mode_flag:
            flags += cfg.template_args(profile.mode_flag, mode=cli_mode)
        if profile.prompt_in_argv and profile.image_flag:
            for image in action.images:
                path = str(self.files.get(image.transfer_id)[1])
                flags += cfg.template_args(profile.image_flag, path=path)
        overrides = action.overrides
        if overrides is not None:
            for key, flag in profile.override_flags.items():
                value = getattr(overrides, key, None)
                if value:
                    flags += [flag, ",".join(value) if isinstance(value, list) else str(value)]
        # Flags go before the template's end of options ("--" ahead of "{prompt}") if it has one;
        # found in the template, since a prompt may itself be "--". Templates map one to one.
        template = (
            profile.resume_command if resume_id and profile.resume_command else profile.command
        )
        end = template.index("--") if "--" in template else len(argv)
        argv[end:end] = flags
        # A single-turn agent with its prompt in argv has nothing to read on stdin, and some CLIs
        # read a piped stdin to EOF before starting (codex exec appends it to the prompt): it is
        # closed once the process runs, as a terminal's /dev/null would be.
        close_stdin = profile.single_turn_process and profile.prompt_in_argv
        if on_stdin:
            # Too long for argv (E2BIG): the CLI reads it from stdin, which then closes (EOF).
            self._stdin_pending.append(action.prompt.encode())  # type: ignore[union-attr]
        elif action.prompt is not None and not profile.prompt_in_argv:
            data = self._prompt_bytes(action.prompt, action.images)
            if data is not None:
                self._stdin_pending.append(data)
        self._spawning = True
        self._task(self._run_process(argv, close_stdin=close_stdin))

    async def _run_process(self, argv: list[str], *, close_stdin: bool = False) -> None:
        env = dict(os.environ)
        env.update(self.profile.env)
        try:
            proc = await AgentProcess.start(
                argv,
                env=env,
                session_id=self.id,
                workspace=self.workspace,
                grace=self.config.shutdown_grace_sec,
            )
        except (AgentStartError, OSError, ValueError) as err:
            self._spawning = False
            self.start_error = str(err)
            self._spawned.set()
            log.error("agent did not start", extra={"session": self.id, "error": str(err)})
            self.metrics.process_started(self.profile.name)
            self.metrics.process_exited(self.profile.name, "error")
            self.perform(self.machine.agent_exited("error", 127, start_error=str(err)))
            return
        self.process = proc
        self._spawning = False
        self._spawned.set()
        self.metrics.process_started(self.profile.name)
        log.info("agent started", extra={"session": self.id, "pid": proc.pid, "argv": argv})
        try:
            for data in self._stdin_pending:
                proc.write(data)
        except AgentProcessError as err:  # it exited before reading: the exit will be reported
            log.warning("stdin write failed", extra={"session": self.id, "error": str(err)})
        self._stdin_pending.clear()
        if close_stdin:
            proc.close_stdin()
        await self._pump(proc)

    async def _pump(self, proc: AgentProcess) -> None:
        # The lines read in one go are handled in one go (up to BATCH_LINES, then the loop turns so
        # that the masters get the first frames while the rest is mapped), straight from the pipe's
        # callback: no task wake-up per batch. The frames of a batch leave in one write per
        # connection.
        await proc.deliver(self._take_delivered, BATCH_LINES)
        self._line_t_ns = 0
        if self._suspended:
            return
        self.perform(self.machine.agent_stdout_closed())
        status = await proc.wait()
        self.metrics.process_exited(self.profile.name, status.kind)
        log.info(
            "agent exited",
            extra={"session": self.id, "returncode": status.returncode, "kind": status.kind},
        )
        self.process = None
        proc.close()
        self.perform(
            self.machine.agent_exited(
                status.kind, status.returncode, status.signal, proc.stderr_tail()
            )
        )

    def _take_delivered(self, batch: list[StdoutLine]) -> None:
        if not self._suspended:  # stopping, what the agent says is no longer the session's
            self.take_lines(batch)

    def take_lines(self, batch: list[StdoutLine]) -> None:
        """The agent's stdout lines of one batch, through parser, session machine and fan-out: the
        per-line hot path (``bench/bench_session_path.py`` times this very method)."""
        lines = self._lines
        machine = self.machine
        parser = machine.parser
        files, workspace = self.files, self.workspace
        clock = time.perf_counter_ns
        emit, act_other = self._emit, self._act_other
        flusher = self._flusher
        flusher.hold()
        try:
            for item in batch:
                self._line_t_ns = item.t_ns
                t0 = clock()
                if item.cut:
                    events = self._cut_line(item)
                else:
                    events = store_tool_files(parser.feed(item.line), files, workspace)
                actions = machine.agent_events(events)
                elapsed = clock() - t0
                if events:
                    kind = type(events[0])
                    if kind is ev.ParseError:
                        lines.parse_error()
                    elif kind is ev.Unknown:
                        lines.unknown_kind()
                    else:
                        lines.line(kind.__name__, elapsed)
                else:
                    lines.line("none", elapsed)  # e.g. a stream event with nothing to say
                for action in actions:
                    if type(action) is act.Emit:
                        emit(action)
                    else:
                        act_other(action)
        finally:
            flusher.flush()
        self._track_state()

    def _cut_line(self, item: StdoutLine) -> list[ev.AgentEvent]:
        """A line over the reader's limit: only its head was kept, so it cannot be parsed. It is
        counted as a parse error and the masters are told that something of the agent's was lost."""
        message = (
            f"the agent printed a line of {item.cut} bytes, over the gateway's limit of "
            f"{DEFAULT_MAX_LINE_BYTES} bytes per line; it was dropped"
        )
        return [
            ev.ParseError(message=message, line=item.line),
            ev.Notice(severity="warning", code=LINE_TOO_LONG, message=message),
        ]

    def _prompt_bytes(self, text: str, images: list[ev.StoredFile]) -> bytes | None:
        """The prompt for the agent's stdin, its images read from the file store."""
        if not images:
            return self.agent_input.prompt(text)
        attached = [PromptImage(f.mime_type, self.files.read(f.transfer_id)) for f in images]
        return self.agent_input.prompt(text, images=attached)  # type: ignore[call-arg]

    def _place_file(self, action: act.PlaceFile) -> None:
        """An uploaded file into the workspace (``.rawp/uploads/<name>``), never through a link:
        each directory is opened without following one (``gateway/storage/nofollow.py``) and the file is
        renamed into place. A file that cannot be placed is said to the masters once the prompt's
        turn is open (``perform``)."""
        fds: list[int] = []
        try:
            fds.append(os.open(self.workspace, nofollow.DIR_FLAGS))
            for part in prompts.UPLOADS_DIR.split("/"):
                # The workspace's own directories: as the agent would make them (the umask's).
                fds.append(nofollow.open_dir(part, dir_fd=fds[-1], create=True, mode=0o777))
            self.files.copy_to(action.transfer_id, fds[-1], action.name)
        except (OSError, FileError) as err:
            linked = isinstance(err, OSError) and err.errno in (errno.ELOOP, errno.ENOTDIR)
            reason = (
                f"{prompts.UPLOADS_DIR} is a link or not a directory"
                if linked
                else getattr(err, "message", None) or getattr(err, "strerror", None) or str(err)
            )
            log.warning(
                "upload not placed in the workspace",
                extra={"session": self.id, "file": action.name, "error": str(err)},
            )
            self._unplaced.append((action.name, reason))
        finally:
            for fd in fds:
                os.close(fd)

    def _write_stdin(self, data: bytes) -> None:
        proc = self.process
        if proc is not None and proc.returncode is None:
            try:
                proc.write(data, limit=self.config.max_stdin_bytes)
            except AgentStdinFull:
                self._stdin_full_error(None)
            except Exception as err:  # the pipe closed under us: the exit will be reported
                log.warning("stdin write failed", extra={"session": self.id, "error": str(err)})
        elif self._spawning:
            if self._stdin_full(len(data)):
                self._stdin_full_error(None)
            else:
                self._stdin_pending.append(data)

    def _stdin_backlog(self) -> int:
        """Input the agent has not read: queued while it starts, or waiting in the pipe."""
        proc = self.process
        pending = sum(map(len, self._stdin_pending))
        return pending + (proc.stdin_backlog if proc is not None else 0)

    def _stdin_full(self, size: int) -> bool:
        backlog = self._stdin_backlog()
        return backlog > 0 and backlog + size > self.config.max_stdin_bytes

    def _stdin_full_error(self, parent_id: str | None, to: str | None = None) -> None:
        """``session.error`` ``AGENT_STDIN_FULL`` (non-fatal): to the sender of a refused prompt,
        or to every master when other input (an interrupt, a permission answer) was dropped."""
        backlog, limit = self._stdin_backlog(), self.config.max_stdin_bytes
        log.warning(
            "agent stdin full", extra={"session": self.id, "backlog": backlog, "limit": limit}
        )
        what = "this prompt was not sent" if to is not None else "input for it was dropped"
        payload = F.SessionError(
            error_code="AGENT_STDIN_FULL",
            message=f"the agent has not read {backlog} bytes of earlier input (limit "
            f"max_stdin_bytes = {limit}); {what}",
            fatal=False,
        )
        frame = self.machine.factory.frame(payload, parent_id=parent_id)
        self.perform([act.Emit(frame, to=to)])

    async def _terminate(self) -> None:
        if not await self._stop_agent():
            # Nothing runs: report the end ourselves so the cleanup frames follow.
            self.perform(self.machine.agent_exited("signal", None, 15))

    async def _stop_agent(self) -> bool:
        """Stop the agent process, after the start of one in progress (it must not escape);
        False when none runs."""
        while self._spawning:
            await asyncio.sleep(0.01)
        proc = self.process
        if proc is None:
            return False
        await proc.terminate(self.config.shutdown_grace_sec)
        return True

    # --- actions ----------------------------------------------------------------------------------

    def perform(self, actions: list[act.Action]) -> None:
        for action in actions:
            self._act(action)
        while self._unplaced:  # after the prompt's actions: its turn is open now
            name, reason = self._unplaced.pop(0)
            self.perform(self.machine.file_not_placed(name, reason))
        self._track_state()

    def _act(self, action: act.Action) -> None:
        if type(action) is act.Emit:
            self._emit(action)
        else:
            self._act_other(action)

    def _act_other(self, action: act.Action) -> None:
        if isinstance(action, act.WriteStdin):
            self._write_stdin(action.data)
        elif isinstance(action, act.WritePrompt):
            data = self._prompt_bytes(action.text, action.images)
            if data is not None:
                self._write_stdin(data)
        elif isinstance(action, act.PlaceFile):
            self._place_file(action)
        elif isinstance(action, act.Spawn):
            self._spawn(action)
        elif isinstance(action, act.Signal):
            if self.process is not None:
                self.process.send_signal(action.signum)
        elif isinstance(action, act.Terminate):
            self._task(self._terminate())
        elif isinstance(action, act.StartTimer):
            self._set_timer(action.key, action.seconds)
        elif isinstance(action, act.CancelTimer):
            self._cancel_timer(action.key)
        elif isinstance(action, act.SetFeatures):
            conn = self.connections.get(action.conn_id)
            if conn is not None:
                conn.filter = ConnectionFilter(action.features)
                self._routes.clear()
        elif isinstance(action, act.CloseAll):
            self._close_all(action.reason)
        elif isinstance(action, act.Settled):
            self.metrics.interaction(action.interaction_type, action.outcome)
        elif isinstance(action, act.Log):
            log.log(
                logging.getLevelName(action.level.upper()),
                action.message,
                extra={"session": self.id, **action.fields},
            )

    def _emit(self, action: act.Emit) -> None:
        frame = action.frame
        data = codec.encode(frame)
        if action.to is not None:
            conn = self.connections.get(action.to)
            if conn is not None:
                self._send_to(conn, frame, text_frame(data))
            return
        t_ns = self._line_t_ns
        type_ = frame.TYPE
        self.metrics.frame_out(type_, len(data))
        self._keep(frame, data)
        observe = self._OBSERVERS.get(type(frame.payload))
        if observe is not None:
            observe(self, frame)
        route = self._routes.get(type_)
        if route is None:
            route = self._route(type_)
        targets, keepers, strip = route
        if not targets:
            return
        # Each variant of the frame is encoded and framed once, for every connection it goes to.
        exclude = action.exclude
        if strip and frame.metadata and "subagent_context" in frame.metadata:
            flat = text_frame(codec.encode(strip_subagent_context(frame)))
            for conn in strip:
                if conn.id != exclude:
                    conn.send(flat, t_ns)
            targets = keepers
        framed = text_frame(data)
        for conn in targets:
            if conn.id != exclude:
                conn.send(framed, t_ns)

    def _keep(self, frame: F.Frame, data: bytes) -> None:
        """A broadcast frame into the history (and the frame log of a saved session)."""
        metrics = self.metrics
        kept, evicted, evicted_bytes = self.history.append(frame.message_id, frame.timestamp, data)
        if self.saved is not None:
            self.saved.append(self.history.last_seq, frame.message_id, data)
        if kept:
            metrics.history_appended(len(data))
        if evicted:
            metrics.history_evicted(evicted, evicted_bytes)

    async def continue_conversation(self, conversation_id: str, transcript: Transcript) -> None:
        """This new session continues the agent's saved conversation (``gateway/agent/conversations/``;
        call before ``start``, whose spawn resumes it): its earlier turns go into the history,
        marked replayed (``SessionMachine.replay``), before anything live. Binary tool results
        are kept in the file store as live ones are. No master is attached yet, and nothing here
        is a turn of this gateway: no connection, metric or usage total is touched (the agent's
        running cost is noted: docs/usage.md). A long conversation is many frames: they are made
        in a worker thread, which nothing else can race, since the session is not started yet."""
        loop = asyncio.get_running_loop()
        replayed = await loop.run_in_executor(None, self._replayed, conversation_id, transcript)
        for frame, data in replayed:
            self._keep(frame, data)
            payload = frame.payload
            if isinstance(payload, F.Usage) and not (frame.metadata or {}).get("subagent_context"):
                self.usage.seen(payload)

    def _replayed(
        self, conversation_id: str, transcript: Transcript
    ) -> list[tuple[F.Frame, bytes]]:
        for turn in transcript.turns:
            turn.events = store_tool_files(turn.events, self.files, self.workspace)
        frames = self.machine.replay(conversation_id, transcript.turns, transcript.problem)
        return [(frame, codec.encode(frame)) for frame in frames]

    def _route(self, type_: str) -> _Route:
        """The connections that admit a frame type: all, those that keep ``subagent_context`` and
        those that need it stripped; cached until a connection comes, goes or announces features."""
        admitted = tuple(c for c in self.connections.values() if c.filter.admits(type_))
        keepers = tuple(c for c in admitted if c.filter.keeps_subagent_context)
        strip = tuple(c for c in admitted if not c.filter.keeps_subagent_context)
        self._routes[type_] = route = (admitted, keepers, strip)
        return route

    # --- what the shell does with some of the frames it broadcasts ---------------------------------
    # Each is called from _OBSERVERS for the payload type it is listed under, so its casts hold.

    def _turn_began(self, frame: F.Frame) -> None:
        self._turn_started = time.monotonic()
        self._save_record()

    def _turn_ended(self, frame: F.Frame) -> None:
        payload = cast(F.TurnEnd, frame.payload)
        self.metrics.turn_ended(payload.stop_reason, time.monotonic() - self._turn_started)
        self._tell(frame)

    def _tell(self, frame: F.Frame) -> None:
        """Webhooks (gateway/team/notify.py): a permission waits, a turn ended, an error, the end."""
        if self.notifier is not None:
            self.notifier.frame(self, frame)

    def _tool_ended(self, frame: F.Frame) -> None:
        payload = cast(F.InvokeResult, frame.payload)
        self.metrics.tool_result(payload.tool_name, payload.status)

    def _usage_sent(self, frame: F.Frame) -> None:
        if not (frame.metadata and "subagent_context" in frame.metadata):
            self._add_usage(cast(F.Usage, frame.payload))
            self._tell(frame)

    def _compacted(self, frame: F.Frame) -> None:
        if frame.metadata and "subagent_context" in frame.metadata:
            return
        payload = cast(F.Compacted, frame.payload)
        self.metrics.compacted(self.profile.name, payload.trigger)
        before = self.usage.fill
        fill = self.usage.compacted(payload)
        if fill is not None:
            self.metrics.context_fill(before, fill)

    def _record_changed(self, frame: F.Frame) -> None:
        self._save_record()  # a new name, the agent's session id, a mode switch

    # One dict lookup per broadcast frame: most (the deltas) are none of these.
    _OBSERVERS: ClassVar[dict[type, Callable[[LiveSession, F.Frame], None]]] = {
        F.TurnStart: _turn_began,
        F.TurnEnd: _turn_ended,
        F.InvokeResult: _tool_ended,
        F.Usage: _usage_sent,
        F.Compacted: _compacted,
        F.Renamed: _record_changed,
        F.Capabilities: _record_changed,
        F.StateChanged: _record_changed,
        F.InteractionRequest: _tell,
        F.AgentError: _tell,
        F.Deleted: _tell,
    }

    def _add_usage(self, usage: F.Usage) -> None:
        """The main agent's usage of a turn (session.usage right after session.turn.end)."""
        metrics = self.metrics
        before = self.usage.fill
        counted = self.usage.add(usage)
        metrics.usage(self.profile.name, self.machine.model, self.owner, counted)
        if counted.fill is not None:
            metrics.context_fill(before, counted.fill)
            if counted.fill >= CONTEXT_FULL and (
                usage.turn_id is None or usage.turn_id != self._limit_turn
            ):
                self._limit_turn = usage.turn_id
                metrics.context_limit_turn(self.profile.name)
        if self.saved is not None:
            self._save_record()
            self.saved.sync_soon()

    def _close_all(self, reason: str) -> None:
        for conn in list(self.connections.values()):
            conn.close_after_flush(1000, reason)
        for key in list(self._timers):
            self._cancel_timer(key)
        self._task(self._finish_close())

    async def _finish_close(self) -> None:
        conns = list(self.connections.values())
        if conns:
            await asyncio.wait([asyncio.ensure_future(c.closed.wait()) for c in conns], timeout=10)
        self.metrics.history_released(self.history.clear())
        self.metrics.context_fill(self.usage.fill, None)
        self.files.close()
        if self.saved is not None:
            self.saved.remove()
        self._track_state()
        self.terminated.set()
        if self._on_terminated is not None:
            self._on_terminated(self)

    # --- timers and tasks --------------------------------------------------------------------------

    def _set_timer(self, key: str, seconds: float) -> None:
        self._cancel_timer(key)
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(seconds, self._fire, key)

    def _cancel_timer(self, key: str) -> None:
        handle = self._timers.pop(key, None)
        if handle is not None:
            handle.cancel()

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        if key == "reattach-window":
            if not self.connections:
                self.perform(self.machine.delete("timeout", "system"))
            return
        self.perform(self.machine.timer_fired(key))

    def _task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "session task failed",
                exc_info=task.exception(),
                extra={"session": self.id},
            )


def _decoded(data: bytes | None) -> F.Frame | None:
    """A frame this gateway sent, read back (e.g. the catalog kept in a saved history)."""
    if data is None:
        return None
    got = codec.decode(data)
    return got.frame if isinstance(got, codec.Accepted) else None


class _Peek(msgspec.Struct):
    type: str = "other"
    message_id: Any = None  # a wrong kind is the machine's to refuse, not a reason to miscount


_peek = msgspec.json.Decoder(_Peek)


class _AnswerPayload(msgspec.Struct):
    interaction_id: str


class _Answer(msgspec.Struct):
    payload: _AnswerPayload


_peek_answer_decoder = msgspec.json.Decoder(_Answer)


def _peek_answer(data: str | bytes) -> str | None:
    """The ``interaction_id`` a ``control.interaction.*`` frame names, if it is well formed."""
    try:
        return _peek_answer_decoder.decode(data).payload.interaction_id
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeEncodeError):
        return None


_NOTHING: Final = _Peek()


def _peek_frame(data: str | bytes) -> _Peek:
    """The type (for metrics, bounded by the metrics module) and id of a received frame, without
    validating it (the machine does)."""
    try:
        return _peek.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeEncodeError):
        # Deep nesting and lone surrogates are the codec's to refuse (INVALID_FRAME).
        return _NOTHING
