"""The terminal chat on one attached session: ``Chat`` (its receiver, dispatcher, asker and
runner, described in the package's docstring) and what its runner waits for."""

from __future__ import annotations

import asyncio
import contextlib
import mimetypes
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

import aiohttp

from gateway.chat.lines import EOF, LineSource
from gateway.chat.render import (
    Printer,
    Screen,
    answer_shown,
    answer_value,
    answered_text,
    compacted_text,
    deleted_text,
    depth_indent,
    format_totals,
    missing_text,
    permission_question,
    policy_note,
    present,
    question_text,
    turn_end_text,
)
from gateway.client import (
    Connection,
    GatewayClient,
    GatewayError,
    InputType,
    MasterView,
    decode_history,
    is_synthetic,
    payload_of,
)
from gateway.protocol import frames as F
from gateway.protocol.usage import UsageTally

if TYPE_CHECKING:
    from gateway.chat.editor import EditedLines

MODES: Final = ("default", "plan", "review")
ACK_TIMEOUT_SEC: Final = 10.0  # mode switch: the gateway answers at once or not at all
TURN_END_GRACE_SEC: Final = 0.5  # how long a turn end waits for its session.usage
# About 2 minutes of tries: long enough for a gateway that restarts (state_dir) to come back; it
# keeps a detached session for reattach_window_sec (300 s by default).
REATTACH_DELAYS_SEC: Final = (0.2, 0.5, 1.0, 2.0, 4.0, *(8.0,) * 13)

_CLIENT_COMMANDS: Final = frozenset({*MODES, "compact", "mcp", "help", "quit", "exit"})
HELP: Final = """\
commands:
  /plan /default /review    switch the agent's mode (between turns)
  /compact [instruction]    compact the agent's context
  /attach PATH              upload a file (a screenshot) to go with the next prompt
  /mcp                      the session's MCP servers and what became of each
  /quit                     leave (the session is deleted unless --keep)
  /<name> [args]            any other slash command goes to the agent
Ctrl-C cancels the running turn; at the prompt it quits."""
# The commands HELP lists, with what each does: what Tab completes besides the agent's.
OWN_COMMANDS: Final = (
    *((mode, "switch the agent's mode") for mode in MODES),
    ("compact", "compact the agent's context"),
    ("attach", "upload a file to go with the next prompt"),
    ("mcp", "the session's MCP servers"),
    ("help", "list the commands"),
    ("quit", "leave"),
)


class _Quit(Exception):
    """Leave the runner loop (Ctrl-C at the prompt, /quit, or the session ended)."""


@dataclass
class _Awaiting:
    """What the runner waits for after a command: the end of the turn it started, or an answer."""

    kind: str  # "turn" (a prompt or /compact), "mode"
    sent_id: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    turn_id: str | None = None
    outcome: F.Frame | None = None

    def finish(self, frame: F.Frame | None = None) -> None:
        if not self.done.is_set():
            self.outcome = frame
            self.done.set()


def _interaction_id(frame: F.Frame) -> str:
    req = payload_of(frame)
    assert isinstance(req, F.InteractionRequest)
    return req.interaction_id


class Chat:
    """One terminal master on one attached session; ``await run()`` until the user leaves."""

    def __init__(
        self,
        client: GatewayClient,
        conn: Connection,
        *,
        session: dict[str, Any] | None = None,
        screen: Screen,
        lines: LineSource | EditedLines,
        interactive: bool,
        auto_answer: str | None,
        reattach_delays: tuple[float, ...] = REATTACH_DELAYS_SEC,
        turn_end_grace_sec: float = TURN_END_GRACE_SEC,
        role: str | None = None,
    ) -> None:
        self.client = client
        self.role = role  # on this session; "viewer": only watches
        self.conn = conn
        self.session_id = conn.session_id
        self.session: dict[str, Any] = session or {"session_id": conn.session_id}
        self.view = MasterView(conn.session_id)
        self.screen = screen
        self.printer = Printer(screen, client.file_location)
        self.s = screen.s
        self.lines = lines
        self.interactive = interactive
        self.auto_answer = auto_answer
        self.reattach_delays = reattach_delays
        self.turn_end_grace_sec = turn_end_grace_sec
        self.status = 0
        self.commands: list[F.Command] = []
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._asks: asyncio.Queue[F.Frame] = asyncio.Queue()
        self._answer: asyncio.Future[str | None] | None = None
        self._asking: tuple[str, asyncio.Task[None]] | None = None
        self._awaiting: _Awaiting | None = None
        self._ended = asyncio.Event()  # the session is gone for good
        self._quit = asyncio.Event()
        self._cancelled_turn: str | None = None
        self._turn_end: tuple[F.Frame, asyncio.TimerHandle] | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._idle = False  # the runner is at the prompt, waiting for a command
        self._attached: list[F.ContextFile] = []  # uploaded by /attach, for the next prompt
        self._first_attach = True  # a history before any reattach is what ran before we came
        self.usage = UsageTally()  # the session's running totals, from the frames shown

    # -- lifecycle

    async def run(self) -> int:
        self._tasks = [
            asyncio.create_task(self._receive_loop(), name="chat-receive"),
            asyncio.create_task(self._dispatch_loop(), name="chat-dispatch"),
            asyncio.create_task(self._ask_loop(), name="chat-ask"),
        ]
        try:
            await self._run_commands()
        finally:
            if self._asking is not None:
                self._asking[1].cancel()
            for task in self._tasks:
                task.cancel()
            # wait(), not await: their cancellation must not look like ours.
            await asyncio.wait(self._tasks)
        return self.status

    def on_sigint(self) -> None:
        """Ctrl-C: cancel the running turn; at the prompt (or a second time), quit."""
        turn = self.view.turn_id
        if turn is not None and self._cancelled_turn != turn and not self._ended.is_set():
            self._cancelled_turn = turn
            self.screen.line("^C cancelling the turn (Ctrl-C again to quit)", style=self.s.yellow)
            task = asyncio.get_running_loop().create_task(self._send(self.conn.cancel(turn)))
            self._background.add(task)  # the loop keeps only a weak reference to a task
            task.add_done_callback(self._background.discard)
            return
        self.screen.end_line()
        self._quit.set()

    async def _sent(self, frame: F.Frame) -> F.Frame:
        await self.conn.send_frame(frame)
        return frame

    async def _send(self, sending: Awaitable[F.Frame]) -> F.Frame | None:
        try:
            frame = await sending
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as err:
            self.screen.line(f"✗ could not send: {err}", style=self.s.red)
            return None
        self.view.apply(frame)
        return frame

    # -- the runner

    async def _next_command(self) -> str | None:
        if self.interactive and self._queue.empty():
            self._show_prompt()
        self._idle = True
        try:
            return await self._until_quit(self._queue.get())
        finally:
            self._idle = False

    def _show_prompt(self) -> None:
        if self.lines.draws_prompt:
            return  # the line editor's prompt is always there
        self.screen.ask(f"{self.s.bold}>{self.s.reset} ")

    async def _until_quit(self, aw: Awaitable[Any]) -> Any:
        """``aw``'s result, or ``_Quit`` if the user quits or the session ends first."""
        task = asyncio.ensure_future(aw)
        stops = [
            asyncio.ensure_future(self._quit.wait()),
            asyncio.ensure_future(self._ended.wait()),
        ]
        try:
            await asyncio.wait([task, *stops], return_when=asyncio.FIRST_COMPLETED)
        finally:
            finished = task.done()
            for waiting in (task, *stops):
                if not waiting.done():
                    waiting.cancel()
        if not finished:
            raise _Quit
        return task.result()

    async def _run_commands(self) -> None:
        with contextlib.suppress(_Quit):
            while (line := await self._next_command()) is not EOF:
                line = line.strip()
                if not line:
                    continue
                if not self.interactive:
                    self.screen.line(f"> {line}", style=self.s.bold)
                await self._command(line)
        self.screen.end_line()

    async def _command(self, line: str) -> None:
        name = line[1:].partition(" ")[0] if line.startswith("/") else ""
        if self.role == "viewer" and name not in ("quit", "exit", "help", "mcp"):
            self.screen.line(
                "✗ a viewer cannot prompt, attach, compact or switch modes on this session",
                style=self.s.red,
            )
            return
        if not line.startswith("/"):
            await self._prompt(line, "text")
            return
        name, _, rest = line[1:].partition(" ")
        if name in ("quit", "exit"):
            raise _Quit
        if name == "help":
            self._help()
        elif name in MODES:
            await self._switch_mode(cast(F.Mode, name))
        elif name == "compact":
            await self._send_and_wait("turn", F.SessionCompact(instruction=rest.strip() or None))
        elif name == "attach":
            await self._attach_file(rest.strip())
        elif name == "mcp":
            self.screen.line(self.printer.mcp.listed(), style=self.s.dim)
        else:
            await self._prompt(line, "slash_command")

    def _help(self) -> None:
        self.screen.line(HELP, style=self.s.dim)
        # Names this client takes itself (/review switches the mode) never reach the agent.
        names = " ".join(f"/{c.name}" for c in self.commands if c.name not in _CLIENT_COMMANDS)
        if names:
            self.screen.line(f"agent commands: {names}", style=self.s.dim)

    async def _prompt(self, text: str, input_type: InputType) -> None:
        self._cancelled_turn = None
        files, self._attached = self._attached or None, []
        prompt = F.PromptRequest(prompt_text=text, input_type=input_type, context_files=files)
        await self._send_and_wait("turn", prompt)

    async def _attach_file(self, path_text: str) -> None:
        """Upload a file to the session (``PUT .../files``); the next prompt names it."""
        path = Path(path_text).expanduser()
        if not path_text or not path.is_file():
            self.screen.line(f"✗ /attach: no file {path_text!r}", style=self.s.red)
            return
        mime_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        try:
            with path.open("rb") as data:  # streamed: the gateway bounds the size
                stored = await self.client.upload_file(self.session_id, path.name, data, mime_type)
        except (GatewayError, OSError, aiohttp.ClientError) as err:
            self.screen.line(f"✗ /attach {path.name}: {err}", style=self.s.red)
            return
        self._attached.append(F.ContextFile(file_url=stored["file_url"], file_name=path.name))
        size = f"{stored['size_bytes']:,} bytes"
        self.screen.line(
            f"⇧ attached {path.name} ({mime_type}, {size}): goes with the next prompt",
            style=self.s.cyan,
        )

    async def _switch_mode(self, mode: F.Mode) -> None:
        awaiting = await self._send_and_wait("mode", F.ModeSwitch(mode=mode), ACK_TIMEOUT_SEC)
        if awaiting is None:
            return
        outcome = awaiting.outcome
        if outcome is not None and isinstance(payload_of(outcome), F.StateChanged):
            self.screen.line(f"mode: {mode} (from the next turn)", style=self.s.cyan)
        elif outcome is None and not self._ended.is_set():
            self.screen.line(f"mode switch to {mode} not acknowledged", style=self.s.yellow)

    async def _send_and_wait(
        self, kind: str, payload: F.Payload, timeout: float | None = None
    ) -> _Awaiting | None:
        """Send a control frame and wait for what answers it (see ``_Awaiting``)."""
        frame = self.conn.factory.frame(payload)
        # Waiting starts before sending, with the frame's id known: the answer may be received
        # while the send is still being awaited.
        awaiting = _Awaiting(kind, frame.message_id)
        self._awaiting = awaiting
        try:
            if await self._send(self._sent(frame)) is None:
                return None
            await self._until_quit(asyncio.wait_for(awaiting.done.wait(), timeout))
        except TimeoutError:
            pass
        finally:
            self._awaiting = None
        return awaiting

    # -- input routing

    async def _dispatch_loop(self) -> None:
        while True:
            line = await self.lines.get()
            if self.interactive and line is not EOF:
                self.screen.at_line_start = True  # the terminal echoed the line and its newline
            if self._answer is not None and not self._answer.done():
                self._answer.set_result(line)  # a pending question takes the line first
                if line is EOF:
                    self._queue.put_nowait(EOF)
                    return
                continue
            self._queue.put_nowait(line)
            if line is EOF:
                return

    # -- questions

    async def _ask_loop(self) -> None:
        while True:
            request = await self._asks.get()
            req = payload_of(request)
            assert isinstance(req, F.InteractionRequest)
            if req.interaction_id not in self._pending_ids():
                continue  # answered elsewhere, or its turn ended, while it waited in line
            task = asyncio.create_task(self._ask(request))
            self._asking = (req.interaction_id, task)
            try:
                # wait() rather than await: a withdrawn question's cancellation stays in its
                # task, while a cancellation of this loop still ends the loop.
                await asyncio.wait([task])
            finally:
                task.cancel()
                self._asking = None

    def _pending_ids(self) -> set[str]:
        return {_interaction_id(f) for f in self.view.pending_interactions}

    def _withdraw_stale_question(self) -> None:
        if self._asking is not None and self._asking[0] not in self._pending_ids():
            self._asking[1].cancel()
            self._asking = None  # withdrawn once, however many frames say so
            self.screen.line("(question withdrawn)", style=self.s.dim)

    async def _ask(self, request: F.Frame) -> None:
        req = payload_of(request)
        assert isinstance(req, F.InteractionRequest)
        turn_id = request.turn_id
        if self.role == "viewer":  # shown, not asked: answering is an operator's
            what = permission_question(req) if req.interaction_type == "PERMISSION" else None
            self.screen.line(
                f"? {what or req.question_text} (waiting for an operator)",
                style=self.s.yellow,
                indent=depth_indent(request),
            )
            return
        indent = depth_indent(request)
        if ruled := policy_note(request):  # a rule said ask (docs/policies.md)
            self.screen.line(f"({ruled})", style=self.s.dim, indent=indent)
        prompt = f"{indent}{self.s.yellow}{question_text(req)}{self.s.reset}"
        if self.auto_answer is not None or not self.interactive:
            # Nobody to ask: --yes/--no decide, and without them a script declines.
            value, text = answer_value(req, None, auto=self.auto_answer)
            self.screen.ask(prompt)
            if self.auto_answer is None:
                note = "stdin is not a terminal; --yes to allow"
            else:
                note = "--yes" if self.auto_answer == "allow" else "--no"
            self.screen.answer(f"{answer_shown(req, value)} ({note})")
        else:
            self._answer = asyncio.get_running_loop().create_future()
            self.screen.ask(prompt)
            if self.lines.draws_prompt:  # the line editor's prompt says an answer is wanted
                self.lines.set_prompt(f"{self.s.yellow}answer>{self.s.reset} ")
            try:
                answer = await asyncio.wait_for(self._answer, req.timeout_sec or None)
            except TimeoutError:
                self.screen.line(f"(no answer in {req.timeout_sec:g} s)", style=self.s.dim)
                answer = EOF
            finally:
                self._answer = None
                if self.lines.draws_prompt:
                    self.lines.set_prompt(None)
            if answer is EOF:
                value, text = None, None
            else:
                value, text = answer_value(req, answer, auto=None)
        if value is None:
            # control.interaction.timeout declines: a PERMISSION is denied (DPS-6.2-interaction).
            await self._send(self.conn.interaction_timeout(req.interaction_id, turn_id=turn_id))
            return
        await self._send(
            self.conn.answer(req.interaction_id, value, text_input=text, turn_id=turn_id)
        )

    # -- receiving

    async def _receive_loop(self) -> None:
        try:
            while True:
                frame = await self.conn.receive()
                if frame is None:
                    if self.view.deleted is not None or not await self._reattach():
                        break
                    continue
                self._on_frame(frame)
        except Exception as err:  # a bug here must end the chat visibly, not leave it waiting
            self.screen.line(f"✗ internal error: {err!r}", style=self.s.red)
            self.status = 1
            raise
        finally:
            self._flush_turn_end()
            self._ended.set()
            if self._awaiting is not None:
                self._awaiting.finish()

    async def _reattach(self) -> bool:
        """The socket dropped: finalise, then reattach where we stopped (DPS-7.8)."""
        self._flush_turn_end()
        for synthetic in self.view.finalize():
            self._present(synthetic)
        self._flush_turn_end()
        self._withdraw_stale_question()  # finalisation dropped it (DPS-7.8-finalize)
        self.screen.line("connection lost; reattaching…", style=self.s.yellow)
        self._first_attach = False
        for delay in self.reattach_delays:
            await asyncio.sleep(delay)
            try:
                conn = await self.client.attach(
                    self.session, last_message_id=self.conn.last_message_id
                )
            except GatewayError as err:
                if err.status in (401, 403, 404):
                    self.screen.line(f"✗ cannot reattach: {err}", style=self.s.red)
                    break
                continue
            except (aiohttp.ClientError, OSError):
                continue
            self.conn = conn
            return True
        self.screen.line("✗ the connection could not be reattached", style=self.s.red)
        self.status = 1
        return False

    def _on_frame(self, frame: F.Frame) -> None:
        payload = payload_of(frame)
        if isinstance(payload, F.History):
            self._on_history(payload)
            return
        if not self.view.apply(frame):
            return
        self._present(frame)

    def _on_history(self, payload: F.History) -> None:
        if self._first_attach:
            self._first_attach = False
            self._on_earlier(payload)
            return
        outcome = self.view.history(payload)
        if outcome.unfinalized:
            if outcome.applied:
                self.screen.line(
                    f"(reattached; {len(outcome.applied)} missed frames follow)", style=self.s.dim
                )
            else:
                self.screen.line("(reattached)", style=self.s.dim)
            # The view replayed them by timestamp then message_id (DPS-2.3-history-order), which
            # shuffles frames of one millisecond; printed, they keep the order the gateway sent.
            applied = {f.message_id for f in outcome.applied}
            for frame in decode_history(payload):
                if frame.message_id in applied:
                    applied.discard(frame.message_id)
                    self._present(frame)
            # A question that finalisation withdrew and nobody answered since: ask it again.
            asking = self._asking[0] if self._asking is not None else None
            for request in self.view.pending_interactions:
                if _interaction_id(request) != asking:
                    self._asks.put_nowait(request)
        elif outcome.reason == "truncated":
            # §7.1.1: the user must be told the data is incomplete.
            self.screen.line(missing_text(outcome.lost_frame_count), style=self.s.yellow)
            # The finalisation stands, but the errors say why a turn ended (GATEWAY_RESTARTED).
            for frame in outcome.frames:
                if isinstance(payload_of(frame), F.AgentError):
                    self._present(frame)
        else:
            self._session_deleted()
        awaiting = self._awaiting
        if awaiting is not None and awaiting.turn_id and self.view.turn_id != awaiting.turn_id:
            awaiting.finish()  # the turn we waited for is over (or was lost with the session)

    def _session_deleted(self) -> None:
        deleted = self.view.deleted
        if deleted is None:
            return
        self.screen.line(deleted_text(deleted), style=self.s.yellow)
        self.status = 1  # ended under us: a script must not take this for success
        self._ended.set()

    # -- presenting frames

    def _on_earlier(self, payload: F.History) -> None:
        """The conversation so far, on attaching to a session that already ran (``--session``,
        ``?history=all``): shown as it happened, in the order the gateway sent it. Nothing was
        finalised, so a truncated buffer only means its beginning is gone."""
        status = payload.buffer_status
        if status.truncated:
            lost = status.lost_frame_count
            gone = f"{lost} earlier frames" if lost is not None else "some earlier frames"
            self.screen.line(
                f"(the gateway no longer has {gone} of this session; what follows is incomplete)",
                style=self.s.yellow,
            )
        frames = [f for f in decode_history(payload) if self.view.apply(f)]
        if frames:
            self.screen.line(f"(the conversation so far: {len(frames)} frames)", style=self.s.dim)
        for frame in frames:
            self._present(frame)
        self._flush_turn_end()

    def _present(self, frame: F.Frame) -> None:
        """Print one frame and move the runner's and the asker's state along."""
        p = payload_of(frame)
        if self._turn_end is not None and not isinstance(p, F.Usage):
            self._flush_turn_end()
        if present(self.printer, frame):
            return
        s = self.s
        sub = (frame.metadata or {}).get("subagent_context") or {}

        if isinstance(p, F.InteractionRequest):
            self.printer.stream_to(None)
            self._asks.put_nowait(frame)
        elif isinstance(p, F.InteractionResponse | F.InteractionTimeout):
            self._withdraw_stale_question()
            who = (frame.metadata or {}).get("rawp_user")
            if who:  # relayed from another master: who decided (docs/identities.md)
                text = f"({answered_text(p)} by {who})"
                if self.view.changed_nothing(frame):  # relayed all the same, refused
                    text = f"({answered_text(p)} by {who}: too late, it changed nothing)"
                self.screen.line(text, style=s.dim, indent=depth_indent(frame))
        elif isinstance(p, F.SessionError):
            fatal = " (fatal)" if p.fatal else ""
            self.screen.line(f"✗ {p.error_code}: {p.message}{fatal}", style=s.red)
            if p.fatal:
                self.status = 1
            self._awaiting_error(frame)
        elif isinstance(p, F.TurnStart):
            self.printer.new_turn()
            awaiting = self._awaiting
            if (
                awaiting is not None
                and awaiting.kind == "turn"
                and awaiting.turn_id is None
                and (frame.parent_id is None or frame.parent_id == awaiting.sent_id)
            ):
                awaiting.turn_id = p.turn_id
        elif isinstance(p, F.TurnEnd):
            self.printer.stream_to(None)
            # Printed with the session.usage that follows it (DPS-7.5.2-usage), or alone.
            handle = asyncio.get_running_loop().call_later(
                self.turn_end_grace_sec, self._flush_turn_end
            )
            self._turn_end = (frame, handle)
            self._withdraw_stale_question()
        elif isinstance(p, F.Usage):
            if not sub:
                self.usage.add(p)
            if self._turn_end is not None and not sub:
                self._flush_turn_end(p)
        elif isinstance(p, F.StateChanged):
            awaiting = self._awaiting
            if p.reason == "mode_switch" and awaiting is not None and awaiting.kind == "mode":
                awaiting.finish(frame)
        elif isinstance(p, F.Compacted):
            fill = self.usage.compacted(p) if not sub else None
            self.screen.line(compacted_text(p, fill), style=s.cyan)
            awaiting = self._awaiting
            if awaiting is not None and awaiting.kind == "turn" and awaiting.turn_id is None:
                awaiting.finish(frame)  # a compaction that ran outside a turn
        elif isinstance(p, F.Deleted):
            self._session_deleted()
        elif isinstance(p, F.CommandsPublish):
            self.commands = list(p.commands)
        # Capabilities, state changes and the gateway's own events: nothing to print.

    def _awaiting_error(self, frame: F.Frame) -> None:
        awaiting = self._awaiting
        # An error before our command produced anything is its answer (PROMPT_IN_PROGRESS,
        # MODE_SWITCH_DURING_TURN, COMPACTION_NOT_SUPPORTED, ...).
        if awaiting is not None and awaiting.turn_id is None:
            awaiting.finish(frame)

    def _flush_turn_end(self, usage: F.Usage | None = None) -> None:
        if self._turn_end is None:
            return
        frame, handle = self._turn_end
        self._turn_end = None
        handle.cancel()
        end = payload_of(frame)
        assert isinstance(end, F.TurnEnd)
        style = self.s.red if end.stop_reason in ("error", "disconnected") else self.s.dim
        self.screen.line(turn_end_text(end, usage, lost=is_synthetic(frame)), style=style)
        if usage is not None:
            self.screen.line(format_totals(self.usage), style=self.s.dim, indent="  ")
        awaiting = self._awaiting
        # A turn lost with the connection is not over yet: a reattach may bring it back.
        if awaiting is not None and awaiting.turn_id == end.turn_id and not is_synthetic(frame):
            awaiting.finish(frame)
        if self._idle and self.interactive:
            self._show_prompt()  # another master's turn ended while we sat at the prompt


def completions(chat: Chat) -> list[tuple[str, str]]:
    """What Tab completes after ``/``: this client's commands, then the agent's."""
    return [*OWN_COMMANDS, *((c.name, c.description or "") for c in chat.commands)]
