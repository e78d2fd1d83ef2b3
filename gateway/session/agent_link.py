"""The agent's side of a live session: its process started from the profile (``_spawn``), its
stdout lines carried through parser, session machine and fan-out (``take_lines``, the per-line
path), and what is written to its stdin: prompts with their images, uploads placed in the
workspace, and the bound on input the agent has not read (``max_stdin_bytes``).

``AgentLink`` is a part of ``LiveSession`` (``gateway/session/live.py``), not an object of its
own: the per-line path stays on the one instance, with no hop between objects.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway import config as cfg
from gateway.agent import mcp as agent_mcp
from gateway.agent.environment import agent_environment
from gateway.agent.exit import AgentProcessError, AgentStartError, AgentStdinFull
from gateway.agent.mcp_home import write_gemini_settings
from gateway.agent.process import WIDE_STDOUT_PIPE_BYTES, AgentProcess
from gateway.agent.sandbox import SpawnSandbox, limit_named
from gateway.agent.sandbox import spawn as sandboxes
from gateway.agent.stdout import DEFAULT_MAX_LINE_BYTES, StdoutLine
from gateway.protocol import actions as act
from gateway.protocol import frames as F
from gateway.protocol import machine as sm
from gateway.protocol import prompts
from gateway.protocol.mcp_delivery import CliDelivery, codex_delivery, gemini_delivery
from gateway.protocol.mcp_servers import ServerSpec, from_record, redacted
from gateway.protocol.states import Lifecycle, ProcessState
from gateway.session.tool_paths import resolve_tool_paths
from gateway.storage import nofollow
from gateway.storage.files import FileError, store_tool_files
from parsers import events as ev
from parsers.base import AgentPlugin, PromptImage
from parsers.base import get as get_parser

if TYPE_CHECKING:
    from gateway.metrics import AgentLineMetrics, GatewayMetrics
    from gateway.session.fanout import Flusher
    from gateway.storage.files import FileStore
    from gateway.storage.state_dir import SavedSession

__all__ = ["BATCH_LINES", "LINE_TOO_LONG", "AgentLink", "machine_config", "restored_mcp_servers"]

log = logging.getLogger("rawp_gateway.session")

BATCH_LINES = 256  # agent lines handled between two turns of the event loop, at most
MCP_LOG_AGAIN_SEC = 1.0  # a failed MCP server's log is read again once after this, if needed

# agent.error code of a warning: the agent printed a line over the reader's limit (it was dropped)
LINE_TOO_LONG = "AGENT_LINE_TOO_LONG"


def machine_config(
    profile: cfg.AgentProfile,
    config: cfg.Config,
    workspace: Path,
    reattach_window_sec: float,
    plugin: AgentPlugin,
    mcp_servers: Sequence[ServerSpec] = (),
) -> sm.SessionConfig:
    """What the session machine is told of the agent (its profile and parser), the gateway's
    settings and the session (its workspace, its reattach window, its MCP servers redacted)."""
    return sm.SessionConfig(
        agent=profile.name,
        features=profile.features,
        single_turn_process=profile.single_turn_process,
        auto_allow=profile.auto_allow,
        permission_timeout_sec=profile.permission_timeout_sec,
        max_frame_size=config.server.max_frame_size,
        accepts_images=(
            profile.image_flag is not None if profile.prompt_in_argv else plugin.accepts_images
        ),
        stall_warning_sec=profile.stall_warning_sec,
        stall_timeout_sec=profile.stall_timeout_sec,
        prompt_argv_max=(
            cfg.MAX_ARGV_PROMPT_BYTES
            if profile.prompt_in_argv and profile.stdin_prompt_arg is None
            else None
        ),
        tools=profile.tools,
        credentials=get_parser(profile.parser).credentials,
        policy=config.policy.rules,
        workspace=str(workspace),
        reattach_window_sec=reattach_window_sec,
        mcp_servers=tuple(redacted(server) for server in mcp_servers),
        mcp_kinds=agent_mcp.kinds_of(profile),
    )


def restored_mcp_servers(
    record: Mapping[str, Any], config: cfg.Config, profile: cfg.AgentProfile
) -> tuple[ServerSpec, ...]:
    """A restored session's MCP servers, the same as before the restart: a configured one read
    from the configuration again (its values as the environment says them now); ValueError when
    the record's cannot be used."""
    servers, dropped = from_record(record.get("mcp_servers"), config.mcp.for_profile(profile.name))
    for why in dropped:
        log.warning(
            "restored without an MCP server: %s", why, extra={"session": record["session_id"]}
        )
    return servers


class AgentLink:
    """The agent's side of ``LiveSession`` (see the module's docstring)."""

    if TYPE_CHECKING:
        # The session's, set in LiveSession.__init__ (gateway/session/live.py).
        id: str
        profile: cfg.AgentProfile
        workspace: Path
        config: cfg.Config
        metrics: GatewayMetrics
        machine: sm.SessionMachine
        files: FileStore
        saved: SavedSession | None
        process: AgentProcess | None
        start_error: str | None
        mcp_servers: tuple[ServerSpec, ...]
        _spawning: bool
        _spawned: asyncio.Event
        _stdin_pending: list[bytes]
        _unplaced: list[tuple[str, str]]
        _line_t_ns: int
        _lines: AgentLineMetrics
        _suspended: bool
        _flusher: Flusher

        def perform(self, actions: list[act.Action]) -> None: ...
        def _emit(self, action: act.Emit) -> None: ...
        def _act_other(self, action: act.Action) -> None: ...
        def _track_state(self) -> None: ...
        def _task(self, coro: Any) -> None: ...

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
        given: list[str] = []  # files of the store the argv names, shown to a sandboxed agent
        if profile.prompt_in_argv and profile.image_flag:
            for image in action.images:
                path = str(self.files.get(image.transfer_id)[1])
                flags += cfg.template_args(profile.image_flag, path=path)
                given.append(path)
        delivery = self._mcp_delivery()
        flags += delivery.args
        overrides = action.overrides
        if overrides is not None:
            for key, flag in profile.override_flags.items():
                value = getattr(overrides, key, None)
                if value:
                    flags += [flag, ",".join(value) if isinstance(value, list) else str(value)]
        flags += self._mcp_flags()
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
        self._task(self._run_process(argv, close_stdin=close_stdin, given=given, delivery=delivery))

    def _mcp_delivery(self) -> CliDelivery:
        """What the agent's own configuration takes of the session's MCP servers, when its
        command line or settings carry them (Codex, Gemini; an ACP agent's are in its
        ``session/new``, Claude Code's in its --mcp-config file): docs/mcp.md."""
        parser = self.profile.parser
        if not self.mcp_servers or parser not in ("codex", "gemini"):
            return CliDelivery()
        render = codex_delivery if parser == "codex" else gemini_delivery
        return render(self.mcp_servers)

    async def _mcp_env(self, delivery: CliDelivery, box: SpawnSandbox | None) -> dict[str, str]:
        """The profile's environment with what the servers need: their secrets in the variables
        the agent's configuration names and, for Gemini, its settings file written (outside the
        sandbox in a home of the session's own, ``GEMINI_CLI_HOME``: gateway/agent/mcp_home.py)."""
        env = {**self.profile.env, **delivery.env}
        if delivery.servers is None:
            return env
        seed: str | None = None
        if box is not None:
            await box.seed_home()  # the profile's HOME first, as for every sandboxed start
            home = box.home
        else:
            home = self.home()
            seed = agent_environment(self.profile.env).get("HOME")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, write_gemini_settings, home, delivery.servers, seed)
        except OSError as err:  # a server never fails the session: the agent runs without them
            log.error(
                "MCP servers not given to the agent: %s",
                err.strerror or str(err),
                extra={"session": self.id, "servers": [s.name for s in self.mcp_servers]},
            )
            return env
        if box is None:
            env["GEMINI_CLI_HOME"] = home
        return env

    def home(self) -> str:
        """The session's own HOME directory (made on first use): the agent's HOME in the
        sandbox; without it, a directory of the session's that holds what the gateway writes
        for its agent (its MCP configuration)."""
        saved = self.saved
        where = (saved.dir_fd, str(saved.path)) if saved is not None and saved.dir_fd >= 0 else None
        return sandboxes.session_home(self.id, where)

    def _mcp_flags(self) -> list[str]:
        """The argv flags that give the agent the session's MCP servers, their files written
        first, mode 0600, into the session's HOME (docs/mcp.md). None when it has none it takes;
        a file that cannot be written leaves the agent without them, said in the log: a server
        never fails the session."""
        if not self.mcp_servers:
            return []
        home = self.home()
        given = agent_mcp.delivery(self.profile, self.mcp_servers, home)
        try:
            dir_fd = nofollow.open_dir(home)
            try:
                for name, text in given.files.items():
                    nofollow.replace_file(dir_fd, name, text.encode(), fsync=False, mode=0o600)
            finally:
                os.close(dir_fd)
        except OSError as err:
            log.error(
                "MCP servers not given to the agent: %s",
                err.strerror,
                extra={"session": self.id, "servers": [s.name for s in self.mcp_servers]},
            )
            return []
        return list(given.flags)

    async def _read_mcp_reasons(self, names: Sequence[str]) -> None:
        """Why the agent's MCP servers failed, where it wrote it (Claude Code's MCP logs in the
        session's HOME), told to the machine: a catalog again, with the reasons."""
        if self.profile.parser != "claude-code":
            return
        box = self.sandbox()
        home = (
            box.home
            if box is not None
            else self.profile.env.get("HOME") or os.environ.get("HOME", "")
        )
        reasons: dict[str, str] = {}
        for wait_sec in (0.0, MCP_LOG_AGAIN_SEC):  # its log may be written just after its init
            await asyncio.sleep(wait_sec)
            missing = [name for name in names if name not in reasons]
            reasons |= await asyncio.to_thread(
                agent_mcp.claude_failure_reasons,
                home,
                str(self.workspace),
                missing,
                self.mcp_servers,
            )
            if len(reasons) == len(names) or self.machine.lifecycle is Lifecycle.TERMINATED:
                break
        self.perform(self.machine.mcp_reasons(reasons))

    def sandbox(self, given: Sequence[str] = ()) -> SpawnSandbox | None:
        """The sandbox this session's agents run in (``[isolation] mode = "sandbox"``), its HOME
        made on first use (docs/isolation.md), or None; ``given``: files of the session's store
        that this command names, shown to it read-only."""
        isolation = self.config.isolation
        if not isolation.sandboxed:
            return None
        return SpawnSandbox(
            isolation,
            workspace=str(self.workspace),
            home=self.home(),
            hidden=self.config.hidden_paths,
            template=self.profile.env.get("HOME"),
            given=given,
        )

    async def _run_process(
        self,
        argv: list[str],
        *,
        close_stdin: bool = False,
        given: Sequence[str] = (),
        delivery: CliDelivery | None = None,
    ) -> None:
        try:
            box = self.sandbox(given)
            env = self.profile.env
            if delivery is not None and (delivery.env or delivery.servers is not None):
                env = await self._mcp_env(delivery, box)
            proc = await AgentProcess.start(
                argv,
                env=env,
                session_id=self.id,
                workspace=self.workspace,
                grace=self.config.server.shutdown_grace_sec,
                sandbox=box,
                # It exits at its turn's end, dropping what its pipe could not take yet.
                stdout_pipe_bytes=WIDE_STDOUT_PIPE_BYTES if self.profile.single_turn_process else 0,
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
        tail = proc.stderr_tail()
        limit = limit_named(self.config.isolation, tail) if status.kind != "ok" else None
        self.perform(
            self.machine.agent_exited(
                status.kind, status.returncode, status.signal, tail, limit=limit
            )
        )

    def _take_delivered(self, batch: list[StdoutLine]) -> None:
        # Stopping, or its parser raised: what the agent says is no longer the session's (and a
        # parser that raised is fed nothing more; its successor reads the next process).
        if not (self._suspended or self.machine.process is ProcessState.STOPPING_FOR_PLUGIN):
            self.take_lines(batch)

    def take_lines(self, batch: list[StdoutLine]) -> None:
        """The agent's stdout lines of one batch, through parser, session machine and fan-out: the
        per-line hot path (``bench/bench_session_path.py`` times this very method)."""
        lines = self._lines
        machine = self.machine
        parser = machine.parser
        files, workspace = self.files, self.workspace
        workspace_text = machine.config.workspace
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
                    try:
                        events = parser.feed(item.line)
                    except Exception as err:  # a plugin's bug (free in 3.11 until it happens)
                        self._parser_raised(err)
                        break
                    events = store_tool_files(events, files, workspace)
                    resolve_tool_paths(events, workspace_text)
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

    def _parser_raised(self, err: Exception) -> None:
        """The parser raised on a line: its turn ends and the agent is stopped
        (``SessionMachine.plugin_failed``); the rest of the batch, and of the process's output,
        is not fed to it (``_take_delivered``)."""
        self.perform(self.machine.plugin_failed(err, "feed"))

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
        """The prompt for the agent's stdin, its images read from the file store (the machine
        gives images only to an input that takes them); None when the input raised, which ends
        the turn and stops the agent being spawned (``SessionMachine.plugin_failed``)."""
        with_images = self.machine.plugin.prompt_with_images
        attached = (
            [PromptImage(f.mime_type, self.files.read(f.transfer_id)) for f in images]
            if with_images is not None
            else []
        )
        try:
            if with_images is not None and attached:
                return with_images(text, attached)
            return self.machine.input.prompt(text)
        except Exception as err:
            self.perform(self.machine.plugin_failed(err, "prompt"))
            return None

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
                proc.write(data, limit=self.config.server.max_stdin_bytes)
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
        return backlog > 0 and backlog + size > self.config.server.max_stdin_bytes

    def _stdin_full_error(self, parent_id: str | None, to: str | None = None) -> None:
        """``session.error`` ``AGENT_STDIN_FULL`` (non-fatal): to the sender of a refused prompt,
        or to every master when other input (an interrupt, a permission answer) was dropped."""
        backlog, limit = self._stdin_backlog(), self.config.server.max_stdin_bytes
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
        await proc.terminate(self.config.server.shutdown_grace_sec)
        return True
