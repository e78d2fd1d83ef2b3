"""``LiveSession``: one session's lifecycle (start, restore, suspend, delete), its record on disk,
the actions of the machine carried out in order (``perform``, ``_act``, ``_emit``: a broadcast
encoded once, kept in the buffer, offered to the connections), what the shell does with some of
the frames it broadcasts (turn, tool, usage and record hooks, webhooks) and its timers and tasks.
The agent's side is ``agent_link.py``'s, the masters' side ``masters.py``'s (see the package's
docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

from gateway import config as cfg
from gateway.agent.process import AgentProcess
from gateway.agent.sandbox import spawn as sandboxes
from gateway.metrics import GatewayMetrics
from gateway.protocol import actions as act
from gateway.protocol import codec, recovery
from gateway.protocol import frames as F
from gateway.protocol import machine as sm
from gateway.protocol import mcp_servers as mcp
from gateway.protocol.buffer import FrameBuffer
from gateway.protocol.capabilities import ConnectionFilter, strip_subagent_context
from gateway.protocol.mcp_delivery import acp_servers
from gateway.protocol.states import Lifecycle, TimerKey
from gateway.protocol.usage import CONTEXT_FULL, UsageTally
from gateway.session.agent_link import AgentLink, machine_config, restored_mcp_servers
from gateway.session.connection import MasterConnection, Outgoing, text_frame
from gateway.session.fanout import CLOSE_TIMEOUT_SEC, Flusher
from gateway.session.masters import Masters, Route
from gateway.storage.files import FileStore, files_path, store_tool_files
from gateway.storage.state_dir import COMPACT_SLACK, FORMAT, VERSION, Loaded, SavedSession
from gateway.team import roles
from parsers.base import AgentPlugin
from parsers.base import get as get_parser
from parsers.saved import Transcript

__all__ = ["LiveSession"]

log = logging.getLogger("rawp_gateway.session")


class LiveSession(AgentLink, Masters):
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
        buffer: FrameBuffer | None = None,
        on_terminated: Callable[[LiveSession], None] | None = None,
        saved: SavedSession | None = None,
        mcp_servers: Sequence[mcp.ServerSpec] = (),
    ) -> None:
        self.id = session_id
        self.profile = profile
        self.workspace = workspace
        self.config = config
        self.metrics = metrics
        self.origin = origin
        # Its MCP servers (docs/mcp.md), secrets included: only their redacted views go out.
        self.mcp_servers = tuple(mcp_servers)
        # Who may see and drive the session (gateway/team/roles.py): set by the server when it is created
        # or restored. "local" when the gateway has no credentials configured.
        self.owner = roles.LOCAL.user
        self.members: dict[str, str] = {}
        self.senders: dict[str, roles.Sender] = {}  # who is on each connection
        # The gateway's audit log and webhook notifier (gateway/team/audit.py, gateway/team/notify.py).
        self.audit: Any = None
        self.notifier: Any = None
        self.budgets: Any = None  # the gateway's (gateway/team/budgets.py), when wired
        self.created_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.reattach_window_sec = (
            config.server.reattach_window_sec
            if reattach_window_sec is None
            else reattach_window_sec
        )
        if buffer is None:
            buffer = FrameBuffer(config.server.buffer_policy, config.server.buffer_max_bytes)  # type: ignore[arg-type]
        self.buffer = buffer
        spec = get_parser(profile.parser)
        self.files = FileStore(
            session_id,
            max_session_bytes=config.server.max_session_file_bytes,
            max_upload_bytes=config.server.max_upload_bytes,
            metrics=metrics,
            directory=(saved.dir_fd, saved.path) if saved is not None else None,
            url_of=lambda transfer_id, _path: (
                config.server.route_prefix + files_path(session_id, transfer_id)
            ),
        )

        def new_plugin() -> AgentPlugin:
            """The session's parser and input, at its start and after one raised (the machine
            asks for a fresh pair then): told the workspace before the first line."""
            plugin = spec.plugin()
            if plugin.set_workspace is not None:  # parsers.base.ReadsWorkspace: it reads files
                plugin.set_workspace(str(workspace))
            if plugin.set_mcp_servers is not None:  # parsers.base.TakesMcpServers: ACP's own way
                plugin.set_mcp_servers(acp_servers(self.mcp_servers))
            return plugin

        plugin = new_plugin()
        self.machine = sm.SessionMachine(
            session_id,
            plugin.parser,
            plugin.input,
            machine_config(
                profile, config, workspace, self.reattach_window_sec, plugin, self.mcp_servers
            ),
            files=self.files.files,
            plugin=plugin,
            plugins=new_plugin,
        )
        self.machine.name = name
        self.connections: dict[str, MasterConnection] = {}
        self._routes: dict[str, Route] = {}
        self._flusher = Flusher()
        self.process: AgentProcess | None = None
        self._spawning = False
        self._spawned = asyncio.Event()
        self.start_error: str | None = None
        self._stdin_pending: list[bytes] = []
        self._unplaced: list[tuple[str, str]] = []  # (file name, why): PlaceFile that failed
        self._timers: dict[TimerKey, asyncio.TimerHandle] = {}
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
            saved.entries = buffer.entries
            saved.compact_above = 2 * buffer.max_bytes + COMPACT_SLACK
        sandboxes.register_workspace(session_id, str(workspace))  # masked from other agents

    # --- public view -------------------------------------------------------------------------

    @property
    def state(self) -> str:
        if self.machine.lifecycle is Lifecycle.TERMINATED:
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
            "agent_state": self.machine.mapper.agent_state,
            "mode": self.machine.mode,
            "turn_index": self.machine.turn_count,
            "connections": len(self.connections),
            "created_at": self.created_at,
            "ws_path": f"{self.config.server.route_prefix}/v1/session/{self.id}/ws",
            "workspace_path": str(self.workspace),
            "owner": self.owner,
            "members": dict(self.members),
            "isolation": self.config.isolation.mode,
            "system": self.config.isolation.system,
        }
        if self.budgets is not None:
            obj["budget"] = self.budgets.view(self)
        if self.machine.agent_session_id:
            obj["agent_session_id"] = self.machine.agent_session_id
        if self.machine.mapper.mcp_servers:  # names, kinds, statuses: never a secret
            obj["mcp_servers"] = self.machine.mapper.mcp_servers
        if self.config.server.route_prefix:  # a fleet: the gateway that holds it (docs/fleet.md)
            obj["pod"] = self.config.server.pod_name
        return obj

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the session; for a long-lived agent, wait until its process runs (or failed to
        start: then ``start_error`` says why and the session is already terminated). A restored
        session closes the turn it had open first; its agent starts with the next prompt. No
        master is attached yet: the machine's ``start`` opens the reattach window."""
        if self._restored is not None:
            items, self._restored = self._restored, None
            if items.turn_id:
                self.perform(self.machine.close_interrupted_turn(items))
        self.perform(self.machine.start())
        if self.budgets is not None:
            self.budgets.opened(self)
        self._save_record()
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
        saved_buffer = record["buffer"]
        buffer = FrameBuffer(
            saved_buffer.get("policy", "RING"), int(saved_buffer.get("max_bytes", 0))
        )
        frames = [data for _, _, data in loaded.entries if data is not None]
        last = frames[-1] if frames else None
        boundary = record.get("crash_boundary")
        buffer.load(
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
            buffer=buffer,
            on_terminated=on_terminated,
            saved=loaded.saved,
            mcp_servers=restored_mcp_servers(record, config, profile),
        )
        session.created_at = record["created_at"]
        # A record written before sessions had owners was the token holder's: user admin.
        owner = record.get("owner")
        session.owner = owner if isinstance(owner, str) and owner else roles.ADMIN.user
        try:
            session.members = roles.check_members(record.get("members", {}))
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
        machine.factory.clock_not_before(buffer.last_timestamp)
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
        if self.machine.lifecycle is Lifecycle.TERMINATED or self.saved is None or self._suspended:
            return
        self._suspended = True
        for key in list(self._timers):
            self._cancel_timer(key)
        await self._stop_agent()
        self.saved.sync()
        # Clean only when every frame reached the log: frames a full disk kept out make the
        # restart say a reattach is truncated there.
        self._save_record(clean=not self.saved.failing)
        self.files.release()
        self.saved.release()
        conns = list(self.connections.values())
        for conn in conns:
            conn.close_after_flush(1012, "the gateway is restarting; reattach with last_message_id")
        if conns:
            # A master that reads nothing does not hold up the stop: what it has not taken by
            # then is in the saved history, and its reattach gets it.
            await asyncio.wait(
                [asyncio.ensure_future(c.closed.wait()) for c in conns], timeout=CLOSE_TIMEOUT_SEC
            )

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
            "buffer": {"policy": self.buffer.buffer_policy, "max_bytes": self.buffer.max_bytes},
            "clean": clean,
            "crash_boundary": self.buffer.crash_boundary,
            # configured ones by name, a master's whole (docs/mcp.md#what-is-kept)
            "mcp_servers": mcp.to_record(self.mcp_servers),
        }

    def write_first_record(self) -> None:
        """Write a new session's record before anything else of it runs: ``OSError`` when it
        cannot be written (a full disk), and then the session is not created."""
        if self.saved is not None:
            record = self._record()
            self.saved.write_record(record)
            self._last_record = record

    def _save_record(self, *, clean: bool = False) -> None:
        """Rewrite the record if what it says changed (or, ``clean``, for a graceful stop). One
        that cannot be written is tried again by the ``SavedSession`` (which logs it)."""
        saved = self.saved
        if saved is None or saved.removed or self.machine.lifecycle is Lifecycle.TERMINATED:
            return
        record = self._record(clean=clean)
        if record == self._last_record:
            return
        self._last_record = record
        with contextlib.suppress(OSError):
            saved.write_record(record)

    async def delete(
        self,
        reason: F.DeleteReason = "master_request",
        deleted_by: F.DeletedBy = "master",
        *,
        shutdown: bool = False,
    ) -> None:
        self.perform(self.machine.delete(reason, deleted_by, shutdown=shutdown))
        await self.terminated.wait()

    def rename(self, name: str) -> None:
        self.perform(self.machine.rename(name, renamed_by="master"))

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
        elif isinstance(action, act.PolicyDecided):
            self._audit_policy(action)
        elif isinstance(action, act.ReadMcpReasons):
            self._task(self._read_mcp_reasons(action.names))
        elif isinstance(action, act.Log):
            log.log(
                logging.getLevelName(action.level.upper()),
                action.message,
                extra={"session": self.id, **action.fields},
                exc_info=action.exc,
            )

    def _emit(self, action: act.Emit) -> None:
        frame = action.frame
        data = codec.encode(frame)
        if action.to is not None:
            conn = self.connections.get(action.to)
            if conn is not None:
                self._send_to(conn, Outgoing.of(frame, data))
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
            stripped = strip_subagent_context(frame)
            flat = Outgoing.of(stripped, codec.encode(stripped), t_ns)
            for conn in strip:
                if conn.id != exclude:
                    conn.send(flat)
            targets = keepers
        out = Outgoing(frame, data, text_frame(data), t_ns)
        for conn in targets:
            if conn.id != exclude:
                conn.send(out)

    def _keep(self, frame: F.Frame, data: bytes) -> None:
        """A broadcast frame into the buffer (and the frame log of a saved session)."""
        metrics = self.metrics
        kept, evicted, evicted_bytes = self.buffer.append(frame.message_id, frame.timestamp, data)
        if self.saved is not None:
            self.saved.append(self.buffer.last_seq, frame.message_id, data)
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
        if self.budgets is not None:  # the ledger is written before it acts
            self.budgets.report(self, usage)
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
        self.metrics.history_released(self.buffer.clear())
        self.metrics.context_fill(self.usage.fill, None)
        self.files.close()
        if self.saved is not None:
            self.saved.remove()  # its HOME with it
        sandboxes.forget_workspace(self.id)
        sandboxes.remove_temp_home(self.id)
        self._track_state()
        self.terminated.set()
        if self._on_terminated is not None:
            self._on_terminated(self)
        if self.budgets is not None:  # after the summary above kept the session's budget
            self.budgets.ended(self)

    # --- timers and tasks --------------------------------------------------------------------------

    def _set_timer(self, key: TimerKey, seconds: float) -> None:
        self._cancel_timer(key)
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(seconds, self._fire, key)

    def _cancel_timer(self, key: TimerKey) -> None:
        handle = self._timers.pop(key, None)
        if handle is not None:
            handle.cancel()

    def _fire(self, key: TimerKey) -> None:
        self._timers.pop(key, None)
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
