"""`rawp-gateway chat`: a terminal master for one Agent Session.

    rawp-gateway chat --url URL --agent NAME [--token-file F] [--workspace DIR] [--session ID]
        [--resume [ID]] [--yes | --no] [--keep]

Theory of operation
-------------------
The chat is a thin UI on ``gateway.client``: it creates a session (or attaches to ``--session``;
with ``--resume`` the new session continues a conversation the agent saved, chosen from a numbered
list when no id is given, and shows its earlier turns), attaches the WebSocket, and then four parts share one ``MasterView``:

* the *receiver* takes frames off the WebSocket, applies them to the view and prints them: streamed
  ``agent.text.delta`` text as it arrives, thinking labelled and dimmed, a tool call as ``→ Bash: ls`` and its
  result as ``← ok (12 lines)`` with a short preview (a diff as ``← ok (+3 -1)`` and its changed
  lines, coloured, the middle of a long one elided), subagents, errors, and the turn's end with its
  stop reason and the token usage of the ``session.usage`` that follows it (DPS-7.5.2-usage), with
  the session's running totals and context fill (``format_totals``, docs/usage.md). When
  the socket drops it finalises the view (DPS-7.8-finalize), reattaches with ``last_message_id``
  and replays the ``session.history`` (DPS-7.8-unfinalize);
* the *line reader* turns stdin into lines without blocking the loop (a reader callback on a
  terminal or pipe, a thread for files and in-memory streams);
* the *dispatcher* hands each line to whoever waits for it: a pending question first, else the
  command queue (so lines typed during a turn are type-ahead, not lost);
* the *runner* (the calling task) takes commands one at a time: a prompt is sent and the runner
  waits until the turn it started has ended; ``/plan``, ``/default``, ``/review`` switch mode,
  ``/compact [instruction]`` compacts, ``/attach PATH`` uploads a file (a screenshot) that goes
  with the next prompt as a ``context_files`` entry, ``/help`` lists commands, ``/quit`` exits,
  and any other ``/x`` goes to the agent as a prompt with ``input_type: "slash_command"``. A file
  the agent produced (``agent.file.transfer``) is shown with the URL to fetch it from.

Questions (``agent.interaction.request``) are asked one at a time by a task of their own, so
frames keep printing while a question waits; one that is answered elsewhere, or whose turn ends, is
withdrawn. A PERMISSION reads "Allow Bash: rm x? [y/N]" and is answered with ``selected_value``
``"allow"`` or ``"deny"`` (no answer in ``timeout_sec``: ``control.interaction.timeout``). With
``--yes``/``--no`` (``auto_answer``) questions are answered at once; without them, a stdin that is
not a terminal declines (a script cannot be asked).

Signed in with a user of its own (docs/identities.md), the chat says who and under which role, and
with the role ``viewer`` on the session it only watches: a prompt or a command that would change
something is refused here with a line saying why, and questions are shown, not asked. Another
master's prompt and answer are shown with who sent them (``metadata.rawp_user``).

Ctrl-C during a turn sends ``control.prompt.cancel`` for the running turn (a second Ctrl-C quits);
Ctrl-C at the prompt, ``/quit`` or end of input exits, deleting the session this chat created
unless ``--keep``. Piped stdin is the non-interactive mode tests use: each line is echoed, run to
the end of its turn, and the chat exits after the last one. ANSI styling only when stdout is a
terminal (and ``NO_COLOR`` is unset).

Exit status: 0; 1 when the session could not be created or attached, or ended under us (deleted
elsewhere, a fatal error, or a connection that could not be reattached).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import mimetypes
import os
import signal
import sys
import tempfile
import threading
import urllib.parse
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO, cast

import aiohttp

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

__all__ = [
    "add_chat_arguments",
    "answer_value",
    "run_chat",
    "run_chat_command",
    "run_chat_from_args",
    "run_demo",
    "run_demo_async",
]

MODES: Final = ("default", "plan", "review")
PREVIEW_LINES: Final = 3
DIFF_PREVIEW_LINES: Final = 12  # changed lines of a diff shown; a longer one keeps its ends
PREVIEW_WIDTH: Final = 100
CALL_WIDTH: Final = 80
ACK_TIMEOUT_S: Final = 10.0  # mode switch: the gateway answers at once or not at all
TURN_END_GRACE_S: Final = 0.5  # how long a turn end waits for its session.usage
# About 2 minutes of tries: long enough for a gateway that restarts (state_dir) to come back; it
# keeps a detached session for reattach_window_sec (300 s by default).
REATTACH_DELAYS_S: Final = (0.2, 0.5, 1.0, 2.0, 4.0, *(8.0,) * 13)
CONVERSATIONS_SHOWN: Final = 20  # --resume without an id: the newest saved conversations listed
EOF: Final = None

_CLIENT_COMMANDS: Final = frozenset({*MODES, "compact", "help", "quit", "exit"})
HELP: Final = """\
commands:
  /plan /default /review    switch the agent's mode (between turns)
  /compact [instruction]    compact the agent's context
  /attach PATH              upload a file (a screenshot) to go with the next prompt
  /quit                     leave (the session is deleted unless --keep)
  /<name> [args]            any other slash command goes to the agent
Ctrl-C cancels the running turn; at the prompt it quits."""
# The commands HELP lists, with what each does: what Tab completes besides the agent's.
OWN_COMMANDS: Final = (
    *((mode, "switch the agent's mode") for mode in MODES),
    ("compact", "compact the agent's context"),
    ("attach", "upload a file to go with the next prompt"),
    ("help", "list the commands"),
    ("quit", "leave"),
)


# --------------------------------------------------------------------------- output


@dataclass(frozen=True)
class Style:
    dim: str = ""
    bold: str = ""
    red: str = ""
    green: str = ""
    yellow: str = ""
    cyan: str = ""
    reset: str = ""


PLAIN: Final = Style()
ANSI: Final = Style(
    dim="\x1b[2m",
    bold="\x1b[1m",
    red="\x1b[31m",
    green="\x1b[32m",
    yellow="\x1b[33m",
    cyan="\x1b[36m",
    reset="\x1b[0m",
)


class Screen:
    """Writes to stdout, remembering whether the cursor is at the start of a line.

    Streamed text and whole lines interleave: a line always starts on a fresh line, and text
    streamed from a subagent is indented on every line it starts.
    """

    def __init__(self, out: TextIO, style: Style) -> None:
        self.out = out
        self.s = style
        self.at_line_start = True
        # Below a line editor's prompt (chat_input): only whole lines are shown, as text without
        # its newline would be drawn over by the prompt; a question takes a line of its own.
        self.whole_lines = False

    def _write(self, text: str) -> None:
        if not text:
            return
        try:
            self.out.write(text)
            if not self.whole_lines:
                self.out.flush()
        except (BrokenPipeError, ValueError):
            pass  # stdout went away (`| head`, a closed terminal): the session still ends cleanly
        self.at_line_start = text.endswith("\n")

    def stream(self, text: str, *, style: str = "", indent: str = "") -> None:
        if indent:
            lead = indent if self.at_line_start else ""
            text = lead + text.replace("\n", "\n" + indent)
            if text.endswith("\n" + indent):
                text = text[: -len(indent)]
        if style:
            self._write(f"{style}{text}{self.s.reset}")
            self.at_line_start = text.endswith("\n")
        else:
            self._write(text)

    def end_line(self) -> None:
        if not self.at_line_start:
            self._write("\n")

    def line(self, text: str, *, style: str = "", indent: str = "") -> None:
        self.end_line()
        body = f"{style}{text}{self.s.reset}" if style else text
        self._write(f"{indent}{body}\n")

    def ask(self, text: str) -> None:
        """A question or the prompt: no newline, the answer is typed after it (at the line
        editor's prompt, below it)."""
        self.end_line()
        if self.whole_lines:
            self._write(text.rstrip() + "\n")
            return
        self._write(text)
        self.at_line_start = False

    def answer(self, text: str) -> None:
        """The answer to the question just asked, on its line (when no terminal echoes one)."""
        self._write(("  → " if self.whole_lines else "") + text + "\n")


def _one_line(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# The input field that best says what a call does, per tool (Claude Code's names and others').
_CALL_FIELDS: Final = (
    "command",
    "cmd",
    "file_path",
    "path",
    "notebook_path",
    "pattern",
    "query",
    "url",
    "description",
    "prompt",
)


def describe_call(tool_name: str, tool_input: dict[str, Any] | None) -> str:
    """``Bash: ls -la``: the tool and its most telling input, on one short line."""
    tool_input = tool_input or {}
    for key in _CALL_FIELDS:
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            return f"{tool_name}: {_one_line(value, CALL_WIDTH)}"
    if tool_input:
        return f"{tool_name}: {_one_line(json.dumps(tool_input, ensure_ascii=False), CALL_WIDTH)}"
    return tool_name


def output_text(output: Any) -> str:
    """A tool's output as text: strings as they are, lists one item a line, the rest as JSON."""
    if output is None:
        return ""
    if isinstance(output, str):
        return output
    if isinstance(output, list) and all(isinstance(x, str) for x in output):
        return "\n".join(output)
    return json.dumps(output, ensure_ascii=False, indent=None)


def summarize_result(result: F.InvokeResult) -> tuple[str, list[str]]:
    """``("ok (12 lines)", first lines)`` for a ``tool.invoke.result``; for a diff
    ``("ok (+3 -1)", the changed lines)`` (``diff_preview``)."""
    status = "ok" if result.status == "success" else result.status
    if result.output_type == "binary_ref":
        # The file itself was announced by its agent.file.transfer line, with its URL.
        refs = result.output if isinstance(result.output, list) else [result.output]
        sizes = [r.get("size_bytes", 0) for r in refs if isinstance(r, dict)]
        files = f"{len(sizes)} file{'s' if len(sizes) != 1 else ''}"
        return f"{status} ({files}, {sum(sizes):,} bytes)", []
    text = output_text(result.output).rstrip("\n")
    lines = text.split("\n") if text else []
    if result.status == "cancelled" and lines:
        return f"{status}: {_one_line(lines[0], PREVIEW_WIDTH)}", []
    if result.output_type == "diff" and result.status == "success":
        changes = diff_preview(lines)
        if changes is not None:
            added, removed, preview = changes
            head = f"{status} (+{added} -{removed}" + (", truncated)" if result.truncated else ")")
            if result.duration_ms is not None:
                head += f" {result.duration_ms} ms"
            return head, preview
    head = status
    if lines:
        head += f" ({len(lines)} line{'s' if len(lines) != 1 else ''}"
        head += ", truncated)" if result.truncated else ")"
    if result.duration_ms is not None:
        head += f" {result.duration_ms} ms"
    # "… 1 more" would take the line the last one needs: show it instead.
    shown = lines if len(lines) <= PREVIEW_LINES + 1 else lines[:PREVIEW_LINES]
    preview = [_one_line(line, PREVIEW_WIDTH) for line in shown]
    if len(lines) > len(shown):
        preview.append(f"… {len(lines) - len(shown)} more")
    return head, preview


def diff_preview(lines: list[str]) -> tuple[int, int, list[str]] | None:
    """The changed lines of a unified diff (``+``/``-``, not its ``---``/``+++``/``@@`` headers;
    the file names only when it changes more than one file), with how many were added and
    removed. Past ``DIFF_PREVIEW_LINES`` the middle is elided, never the changes at its start
    and end. None when ``lines`` hold no change (not a diff, or an empty one)."""
    headers = {
        i
        for i in range(len(lines) - 1)
        if lines[i].startswith("--- ") and lines[i + 1].startswith("+++ ")
    }
    headers |= {i + 1 for i in headers}
    files = [lines[i][4:] for i in sorted(headers) if lines[i].startswith("+++ ")]
    shown: list[str] = []
    added = removed = 0
    for i, line in enumerate(lines):
        if i in headers:
            if len(files) > 1 and line.startswith("+++ "):
                shown.append(line[4:].removeprefix("b/") + ":")
        elif line.startswith("+"):
            added += 1
            shown.append(line)
        elif line.startswith("-"):
            removed += 1
            shown.append(line)
    if not added and not removed:
        return None
    if len(shown) > DIFF_PREVIEW_LINES + 1:  # "… 1 more" would take the line it hides
        head = DIFF_PREVIEW_LINES * 2 // 3
        tail = DIFF_PREVIEW_LINES - head
        shown = [*shown[:head], f"… {len(shown) - head - tail} more", *shown[-tail:]]
    # Cut, not squeezed: a diff's indentation is part of what changed.
    return added, removed, [_cut(line.expandtabs(4), PREVIEW_WIDTH) for line in shown]


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def format_usage(usage: F.Usage | None) -> str:
    if usage is None:
        return ""
    t = usage.token_usage
    parts = [f"{t.input_tokens:,} in / {t.output_tokens:,} out tokens"]
    if t.cache_read_tokens:
        parts.append(f"{t.cache_read_tokens:,} cached")
    if t.thinking_tokens:
        parts.append(f"{t.thinking_tokens:,} thinking")
    if usage.cost_usage.used:
        parts.append(f"{usage.cost_usage.used:.4f} {usage.cost_usage.unit}")
    return " · ".join(parts)


def format_totals(tally: UsageTally) -> str:
    """The session's running totals (docs/usage.md): tokens, the cost when the agent reports
    one, and how full the context window is."""
    text = f"session {tally.input_tokens:,} in / {tally.output_tokens:,} out"
    if tally.cache_read_tokens:
        text += f" / {tally.cache_read_tokens:,} cached"
    if tally.cost_usd > 0:
        text += f", ${tally.cost_usd:.4f}"
    if tally.fill is not None:
        text += f" · context {tally.fill:.0%}"
    return text


STDERR_LINES: Final = 5  # the end of an agent's stderr shown under its error

# Why a session ended, by session.deleted's reason; its deleted_by follows in brackets. "client"
# is the gateway (the spec's client node), never the person at this terminal.
_DELETED_WHY: Final = {
    "user_request": "a user deleted it",
    "master_request": "a master deleted it (DELETE /v1/session)",
    "timeout": "no master reattached within its reattach window",
    "error": "the gateway ended it after a fatal error, or as it shut down",
}


def deleted_text(p: F.Deleted) -> str:
    """``session ended: the gateway ended it after a fatal error, ... (error, deleted_by: client)``."""
    why = _DELETED_WHY.get(p.reason, p.reason)
    return f"session ended: {why} ({p.reason}, deleted_by: {p.deleted_by})"


def error_details(details: F.ErrorDetails | None, message: str) -> tuple[list[str], str | None]:
    """What an error's details add to its message: the exit code or signal and the end of the
    agent's stderr (each unless the message says it already), and the hint, if any."""
    if details is None:
        return [], None
    lines: list[str] = []
    facts = []
    if details.exit_code is not None and f"exit code {details.exit_code}" not in message:
        facts.append(f"exit code {details.exit_code}")
    if details.signal is not None and f"signal {details.signal}" not in message:
        facts.append(f"signal {details.signal}")
    if details.http_status is not None and str(details.http_status) not in message:
        facts.append(f"HTTP {details.http_status}")
    if facts:
        lines.append(" · ".join(facts))
    stderr = (details.stderr or "").strip()
    if stderr and stderr not in message:
        tail = stderr.splitlines()[-STDERR_LINES:]
        lines += [f"stderr │ {_cut(line, PREVIEW_WIDTH)}" for line in tail]
    return lines, details.hint


def permission_question(req: F.InteractionRequest) -> str:
    """``Allow Bash: rm x?`` from the request's context, else its own question text."""
    ctx = req.context
    if ctx is not None and ctx.tool_name:
        return f"Allow {describe_call(ctx.tool_name, ctx.tool_input)}?"
    return req.question_text


def _option_value(req: F.InteractionRequest, allow: bool) -> str:
    """The option that allows (or denies), preferring the values "allow" and "deny"."""
    wanted = "allow" if allow else "deny"
    values = [o.value for o in req.options]
    if wanted in values:
        return wanted
    for value in values:
        if value.lower().startswith(wanted[:4] if allow else ("deny", "reject", "no")):
            return value
    return wanted


def answer_value(
    req: F.InteractionRequest, answer: str | None, *, auto: str | None
) -> tuple[str | list[str] | None, str | None]:
    """The ``selected_value`` and ``text_input`` for an answer; ``(None, None)`` declines.

    ``answer`` is the line typed, or ``None`` when nobody was asked; then ``auto`` (``"allow"``
    for --yes, ``"deny"`` for --no, ``None``) decides: yes/no questions follow it, a selection
    takes its default (or, with --yes, the first option), free text takes its default.
    """
    if req.interaction_type in ("PERMISSION", "YN"):
        yes = auto == "allow" if answer is None else answer.strip().lower() in ("y", "yes")
        if req.interaction_type == "PERMISSION":
            return _option_value(req, yes), None
        if not req.options:
            return ("yes" if yes else "no"), None
        return req.options[0 if yes else -1].value, None
    if req.interaction_type == "TEXT_INPUT":
        if answer is None:
            return req.default_value, None
        return answer, answer
    # SELECT / MULTI_SELECT: option numbers or values, separated by spaces or commas.
    if answer is None or not answer.strip():
        if req.default_value is not None:
            return req.default_value, None
        if answer is None and auto == "allow" and req.options:
            return req.options[0].value, None
        return None, None
    chosen: list[str] = []
    for token in answer.replace(",", " ").split():
        if token.isdigit() and 1 <= int(token) <= len(req.options):
            chosen.append(req.options[int(token) - 1].value)
        else:
            chosen.append(token)
    if req.interaction_type == "MULTI_SELECT":
        return chosen, None
    return chosen[0], None


def _shown(req: F.InteractionRequest, value: str | list[str] | None) -> str:
    """How an answer given on the user's behalf reads after the question."""
    if value is None:
        return "no answer"
    if req.interaction_type == "PERMISSION":
        return "y" if value == _option_value(req, True) else "n"
    if req.interaction_type == "YN":
        yes = req.options[0].value if req.options else "yes"
        return "y" if value == yes else "n"
    return ", ".join(value) if isinstance(value, list) else value


def _interaction_id(frame: F.Frame) -> str:
    req = payload_of(frame)
    assert isinstance(req, F.InteractionRequest)
    return req.interaction_id


def _depth_indent(frame: F.Frame) -> str:
    ctx = (frame.metadata or {}).get("subagent_context")
    depth = ctx.get("depth", 0) if isinstance(ctx, dict) else 0
    return "  " * int(depth or 0)


# --------------------------------------------------------------------------- input


class LineSource:
    """stdin as an async stream of lines (``None`` at end of input), never blocking the loop.

    The chat reads piped stdin with it; a terminal gets the line editor of ``chat_input`` instead,
    which has the same ``get()`` and ``close()`` and draws its own prompt.

    A terminal or a pipe is watched with ``add_reader`` and read with ``os.read``; anything else (a
    regular file, a ``StringIO``) is read on a daemon thread, where a read never blocks for long.
    Reading the file descriptor directly keeps Python's buffered ``sys.stdin`` (and its lock) out of
    it, so nothing holds that lock when the interpreter exits.
    """

    draws_prompt: Final = False  # the chat writes its "> " itself

    def set_prompt(self, text: str | None) -> None:
        """Only the line editor draws a prompt (``chat_input.EditedLines.set_prompt``)."""

    def __init__(self, stdin: TextIO, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._fd: int | None = None
        self._partial = b""
        fd = self._fileno(stdin)
        if fd is not None:
            try:
                loop.add_reader(fd, self._readable)
                self._fd = fd
            except (OSError, ValueError, NotImplementedError, RuntimeError):
                self._fd = None  # e.g. a regular file, which epoll refuses
        if self._fd is None:
            threading.Thread(target=self._read_thread, args=(stdin,), daemon=True).start()

    @staticmethod
    def _fileno(stdin: TextIO) -> int | None:
        try:
            return stdin.fileno()
        except (AttributeError, OSError, ValueError):
            return None

    def _readable(self) -> None:
        assert self._fd is not None
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            if self._partial:
                self.queue.put_nowait(self._partial.decode(errors="replace"))
                self._partial = b""
            self.close()
            self.queue.put_nowait(EOF)
            return
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            self.queue.put_nowait(line.rstrip(b"\r").decode(errors="replace"))

    def _read_thread(self, stdin: TextIO) -> None:
        def put(item: str | None) -> bool:
            try:
                self._loop.call_soon_threadsafe(self.queue.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                return False
            return True

        try:
            for line in iter(stdin.readline, ""):
                if not put(line.rstrip("\r\n")):
                    return
        except (OSError, ValueError):
            pass
        put(EOF)

    async def get(self) -> str | None:
        return await self.queue.get()

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._fd)
            self._fd = None


# --------------------------------------------------------------------------- the chat


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
        reattach_delays: tuple[float, ...] = REATTACH_DELAYS_S,
        turn_end_grace_s: float = TURN_END_GRACE_S,
        role: str | None = None,
    ) -> None:
        self.client = client
        self.role = role  # on this session; "viewer": only watches
        self.conn = conn
        self.session_id = conn.session_id
        self.session: dict[str, Any] = session or {"session_id": conn.session_id}
        self.view = MasterView(conn.session_id)
        self.screen = screen
        self.s = screen.s
        self.lines = lines
        self.interactive = interactive
        self.auto_answer = auto_answer
        self.reattach_delays = reattach_delays
        self.turn_end_grace_s = turn_end_grace_s
        self.status = 0
        self.commands: list[F.Command] = []
        self._plan_labelled = False  # "plan:" shown in this turn (once: its blocks are one plan)
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._asks: asyncio.Queue[F.Frame] = asyncio.Queue()
        self._answer: asyncio.Future[str | None] | None = None
        self._asking: tuple[str, asyncio.Task[None]] | None = None
        self._awaiting: _Awaiting | None = None
        self._ended = asyncio.Event()  # the session is gone for good
        self._quit = asyncio.Event()
        self._cancelled_turn: str | None = None
        self._stream_key: tuple[Any, ...] | None = None
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
        if self.role == "viewer" and name not in ("quit", "exit", "help"):
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
        awaiting = await self._send_and_wait("mode", F.ModeSwitch(mode=mode), ACK_TIMEOUT_S)
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
                indent=_depth_indent(request),
            )
            return
        if req.interaction_type == "PERMISSION":
            question = f"{permission_question(req)} [y/N] "
        elif req.interaction_type == "YN":
            question = f"{req.question_text} [y/N] "
        else:
            question = req.question_text
            for i, option in enumerate(req.options, 1):
                question += f"\n  {i}. {option.label}"
                if option.description:
                    question += f" ({option.description})"
            question += "\n? "
        indent = _depth_indent(request)

        prompt = f"{indent}{self.s.yellow}{question}{self.s.reset}"
        if self.auto_answer is not None or not self.interactive:
            # Nobody to ask: --yes/--no decide, and without them a script declines.
            value, text = answer_value(req, None, auto=self.auto_answer)
            self.screen.ask(prompt)
            if self.auto_answer is None:
                note = "stdin is not a terminal; --yes to allow"
            else:
                note = "--yes" if self.auto_answer == "allow" else "--no"
            self.screen.answer(f"{_shown(req, value)} ({note})")
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
            lost = outcome.lost_frame_count
            # §7.1.1: the user must be told the data is incomplete. Without a count the gateway
            # cannot tell how many: it crashed and came back, or the id is one it never had.
            why = (
                f"the gateway's buffer overflowed: {lost} frames lost"
                if lost is not None
                else "some frames are missing (the gateway cannot tell how many, as after a crash)"
            )
            self.screen.line(
                f"(reattached, but {why}; what is shown is incomplete)", style=self.s.yellow
            )
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
        s = self.s
        indent = _depth_indent(frame)
        sub = (frame.metadata or {}).get("subagent_context") or {}
        parent = sub.get("parent_invocation_id") if isinstance(sub, dict) else None

        if isinstance(p, F.TextDelta):
            key = ("text", parent, p.content_index)
            if (
                self._stream_key != key
                and not self._plan_labelled
                and (frame.metadata or {}).get("content_role") == "plan"
            ):
                self._plan_labelled = True
                self._stream_to(key)
                self.screen.line("plan:", style=s.cyan, indent=indent)
            self._stream_to(key)
            self.screen.stream(p.text, indent=indent)
        elif isinstance(p, F.ThinkingDelta):
            key = ("thinking", parent, p.content_index)
            if self._stream_key != key:
                # Labelled as a plan is: dimmed alone, thinking would read like the answer.
                self._stream_to(key)
                self.screen.line("thinking:", style=s.cyan, indent=indent)
            self._stream_to(key)
            text = "[redacted]" if p.redacted and not p.text else p.text
            self.screen.stream(text, style=s.dim, indent=indent)
        elif isinstance(p, F.TextDone | F.ThinkingDone):
            kind = "text" if isinstance(p, F.TextDone) else "thinking"
            if self._stream_key == (kind, parent, p.content_index):
                self.screen.end_line()
                self._stream_key = None
            if p.is_cancelled:
                self.screen.line("(cancelled)", style=s.dim, indent=indent)
        elif isinstance(p, F.InvokeRequest):
            self._stream_to(None)
            line = f"→ {describe_call(p.tool_name, p.input)}"
            self.screen.line(line, style=s.cyan, indent=indent)
        elif isinstance(p, F.InvokeStream):
            self._stream_to(("tool", p.invocation_id))
            self.screen.stream(p.chunk, style=s.dim, indent=indent + "  ")
        elif isinstance(p, F.InvokeResult):
            self._stream_to(None)
            head, preview = summarize_result(p)
            color = s.green if p.status == "success" else s.red
            self.screen.line(f"← {head}", style=color, indent=indent)
            diff = p.output_type == "diff"
            for line in preview:
                style = s.dim
                if diff and line.startswith("+"):
                    style = s.green
                elif diff and line.startswith("-"):
                    style = s.red
                self.screen.line(line, style=style, indent=indent + "  ")
        elif isinstance(p, F.SubagentStarted):
            what = " ".join(x for x in (p.agent_type, p.description) if x) or "subagent"
            self.screen.line(f"⇢ subagent: {what}", style=s.cyan, indent=indent)
        elif isinstance(p, F.SubagentEnded):
            took = f" in {p.duration_ms / 1000:.1f} s" if p.duration_ms is not None else ""
            self.screen.line(f"⇠ subagent {p.status}{took}", style=s.cyan, indent=indent)
        elif isinstance(p, F.InteractionRequest):
            self._stream_to(None)
            self._asks.put_nowait(frame)
        elif isinstance(p, F.InteractionResponse | F.InteractionTimeout):
            self._withdraw_stale_question()
            who = (frame.metadata or {}).get("rawp_user")
            if who:  # relayed from another master: who decided (docs/identities.md)
                answer = (
                    "timed out"
                    if isinstance(p, F.InteractionTimeout)
                    else ", ".join(str(v) for v in _as_list(p.selected_value))
                )
                self.screen.line(f"({answer} by {who})", style=s.dim, indent=indent)
        elif isinstance(p, F.AgentError):
            self.screen.line(
                f"✗ {p.severity} {p.error_code}: {p.message}", style=s.red, indent=indent
            )
            lines, hint = error_details(p.details, p.message)
            for line in lines:
                self.screen.line(line, style=s.dim, indent=indent + "  ")
            if hint:
                self.screen.line(f"hint: {hint}", style=s.yellow, indent=indent + "  ")
        elif isinstance(p, F.SessionError):
            fatal = " (fatal)" if p.fatal else ""
            self.screen.line(f"✗ {p.error_code}: {p.message}{fatal}", style=s.red)
            if p.fatal:
                self.status = 1
            self._awaiting_error(frame)
        elif isinstance(p, F.TurnStart):
            self._stream_key = None
            self._plan_labelled = False
            awaiting = self._awaiting
            if (
                awaiting is not None
                and awaiting.kind == "turn"
                and awaiting.turn_id is None
                and (frame.parent_id is None or frame.parent_id == awaiting.sent_id)
            ):
                awaiting.turn_id = p.turn_id
        elif isinstance(p, F.TurnEnd):
            self._stream_to(None)
            # Printed with the session.usage that follows it (DPS-7.5.2-usage), or alone.
            handle = asyncio.get_running_loop().call_later(
                self.turn_end_grace_s, self._flush_turn_end
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
            self.screen.line(
                f"⟲ compacted ({p.trigger}): {p.previous_token_count:,} → "
                f"{p.current_token_count:,} tokens"
                + (f" · context {fill:.0%}" if fill is not None else ""),
                style=s.cyan,
            )
            awaiting = self._awaiting
            if awaiting is not None and awaiting.kind == "turn" and awaiting.turn_id is None:
                awaiting.finish(frame)  # a compaction that ran outside a turn
        elif isinstance(p, F.PromptRequest):
            # Another master's prompt, relayed (DPS-2.4-relay): show it like ours, with who sent it.
            who = (frame.metadata or {}).get("rawp_user")
            by = f"{who}: " if who and who != "local" else ""
            self.screen.line(f"» {by}{p.prompt_text}", style=s.bold)
        elif isinstance(p, F.Renamed):
            self.screen.line(f"session renamed to {p.name!r}", style=s.dim)
        elif isinstance(p, F.Deleted):
            self._session_deleted()
        elif isinstance(p, F.CommandsPublish):
            self.commands = list(p.commands)
        elif isinstance(p, F.CatalogPublish):
            # §5.4.1: a master should warn about error diagnostics; fatal ones block the tool.
            for d in p.diagnostics or ():
                if d.severity in ("error", "fatal"):
                    where = f"{d.tool_name}: " if d.tool_name else ""
                    self.screen.line(f"⚠ {where}{d.message} ({d.code})", style=s.yellow)
        elif isinstance(p, F.FileTransfer):
            # A file arrived (docs/files.md): where to GET it, with the token.
            self._stream_to(None)
            url = self.client.file_location(p.file_url)
            arrow = "⇩" if p.direction == "download" else "⇧"
            self.screen.line(
                f"{arrow} file {p.file_name} ({p.mime_type}, {p.size_bytes:,} bytes): {url}",
                style=s.cyan,
                indent=indent,
            )
        # Capabilities, state changes and the gateway's own events: nothing to print.

    def _stream_to(self, key: tuple[Any, ...] | None) -> None:
        """Start a new line when the stream being printed changes (text → thinking → tool)."""
        if key != self._stream_key:
            self.screen.end_line()
            self._stream_key = key

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
        parts = [f"— {end.stop_reason}"]
        if usage is not None:
            parts.append(format_usage(usage))
        if end.tool_invocation_count:
            n = end.tool_invocation_count
            parts.append(f"{n} tool call{'s' if n != 1 else ''}")
        if is_synthetic(frame):
            parts.append("(connection lost)")
        style = self.s.red if end.stop_reason in ("error", "disconnected") else self.s.dim
        self.screen.line(" · ".join(parts), style=style)
        if usage is not None:
            self.screen.line(format_totals(self.usage), style=self.s.dim, indent="  ")
        awaiting = self._awaiting
        # A turn lost with the connection is not over yet: a reattach may bring it back.
        if awaiting is not None and awaiting.turn_id == end.turn_id and not is_synthetic(frame):
            awaiting.finish(frame)
        if self._idle and self.interactive:
            self._show_prompt()  # another master's turn ended while we sat at the prompt


# --------------------------------------------------------------------------- entry points


async def run_chat(
    url: str,
    *,
    agent: str | None,
    token: str | None = None,
    workspace: str | None = None,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    auto_answer: str | None = None,
    session_id: str | None = None,
    keep: bool = False,
    name: str | None = None,
    color: bool | None = None,
    interactive: bool | None = None,
    handle_sigint: bool | None = None,
    reattach_delays: tuple[float, ...] = REATTACH_DELAYS_S,
    resume: str | None = None,
    on_session: Callable[[str], None] | None = None,
    line_editor: bool | None = None,
) -> int:
    """Run the terminal chat against the gateway at ``url``; returns the exit status.

    ``on_session`` is called with the session id once it is attached (the demo prints the
    console's URL for it). ``line_editor``: read with ``chat_input``'s line editor (history,
    completion); by default when stdin and stdout are terminals.

    Creates a session of ``agent`` in ``workspace`` (or attaches to ``session_id``), then reads
    prompts from ``stdin`` until end of input, ``/quit`` or Ctrl-C. ``resume``: the new session
    continues that conversation the agent saved (``""``: list the workspace's conversations and
    read which one from ``stdin``; see ``choose_conversation``). ``auto_answer`` is ``"allow"``
    (``--yes``), ``"deny"`` (``--no``) or ``None`` (ask when interactive, else deny). The session
    this call created is deleted on the way out unless ``keep``. ``interactive``, ``color`` and
    ``handle_sigint`` default from whether stdin/stdout are terminals.
    """
    stdin = stdin if stdin is not None else sys.stdin
    stdout = stdout if stdout is not None else sys.stdout
    if auto_answer not in (None, "allow", "deny"):
        raise ValueError(f"auto_answer must be 'allow', 'deny' or None, not {auto_answer!r}")
    if interactive is None:
        interactive = _isatty(stdin)
    if color is None:
        color = _isatty(stdout) and not os.environ.get("NO_COLOR")
    if handle_sigint is None:
        handle_sigint = interactive and threading.current_thread() is threading.main_thread()
    screen = Screen(stdout, ANSI if color else PLAIN)
    problem = url_problem(url)
    if problem is not None:
        screen.line(f"✗ {problem}", style=screen.s.red)
        return 1
    if session_id is None and not agent:
        screen.line("✗ give --agent NAME (or --session ID to attach)", style=screen.s.red)
        return 1

    loop = asyncio.get_running_loop()
    async with GatewayClient(url, token=token) as client:
        created = False
        # Made early when --resume asks which conversation; else below.
        lines: LineSource | EditedLines | None = None
        try:
            if session_id is not None:
                session = await client.get_session(session_id)
            else:
                assert agent is not None
                if resume == "":
                    lines = LineSource(stdin, loop)
                    resume = await choose_conversation(client, agent, workspace, lines, screen)
                    if resume is None:
                        lines.close()
                        return 1
                session = await client.create_session(
                    agent, workspace_path=workspace, name=name, resume_conversation=resume
                )
                created = True
            # An existing session already ran, or a resumed one holds the conversation so far:
            # ask for its history to show it.
            conn = await client.attach(
                session, full_history=session_id is not None or resume is not None
            )
        except (GatewayError, aiohttp.ClientError, OSError) as err:
            if lines is not None:
                lines.close()
            if isinstance(err, GatewayError):
                screen.line(f"✗ {err}", style=screen.s.red)
            else:
                screen.line(f"✗ cannot reach the gateway at {url}: {err}", style=screen.s.red)
            if created and not keep:  # do not leave behind a session nobody can see
                with contextlib.suppress(GatewayError, aiohttp.ClientError, OSError):
                    await client.delete_session(str(session["session_id"]))
            return 1

        sid = str(session["session_id"])
        role = await _signed_in(client, session, screen)
        if on_session is not None:
            on_session(sid)
        where = f" · {workspace}" if workspace else ""
        screen.line(
            f"session {sid} · agent {session.get('agent', agent)}{where}", style=screen.s.dim
        )
        editor = line_editor if line_editor is not None else _isatty(stdin) and _isatty(stdout)
        if lines is None and editor:  # (--resume's question read stdin already: it keeps it)
            from gateway.chat.editor import EditedLines

            lines = EditedLines(
                commands=lambda: completions(chat),
                on_interrupt=lambda: chat.on_sigint(),
                prompt=f"{screen.s.bold}>{screen.s.reset} ",
            )
            screen.out, screen.whole_lines = lines.output(), True
        elif lines is None:
            lines = LineSource(stdin, loop)
        if interactive:
            keys = "/help for commands · Ctrl-C cancels a turn · Ctrl-D quits"
            if lines.draws_prompt:
                keys += " · Tab completes · Esc Enter starts a new line"
            screen.line(keys, style=screen.s.dim)
        chat = Chat(
            client,
            conn,
            session=session,
            screen=screen,
            lines=lines,
            interactive=interactive,
            auto_answer=auto_answer,
            reattach_delays=reattach_delays,
            role=role,
        )
        if handle_sigint:
            try:
                loop.add_signal_handler(signal.SIGINT, chat.on_sigint)
            except (NotImplementedError, RuntimeError, ValueError):
                handle_sigint = False  # no signal handlers here (Windows): Ctrl-C just quits
        try:
            status = await chat.run()
        finally:
            if handle_sigint:
                loop.remove_signal_handler(signal.SIGINT)
            lines.close()
            if created and not keep and chat.view.deleted is None:
                with contextlib.suppress(GatewayError, aiohttp.ClientError, OSError):
                    await client.delete_session(sid)
            elif created and keep:
                screen.line(f"session {sid} kept", style=screen.s.dim)
            with contextlib.suppress(Exception):
                await chat.conn.close()
        return status


async def choose_conversation(
    client: GatewayClient, agent: str, workspace: str | None, lines: LineSource, screen: Screen
) -> str | None:
    """``--resume`` without an id: the conversations ``agent`` saved for the workspace, newest
    first and numbered, then one line of input: a number or an id (nothing: none, None)."""
    listing = await client.conversations(agent, workspace_path=workspace, limit=CONVERSATIONS_SHOWN)
    found = listing.get("conversations") or []
    if not found:
        screen.line(f"no saved conversations of {agent} in this workspace", style=screen.s.yellow)
        return None
    for n, conv in enumerate(found, 1):
        turns = conv.get("turns")
        facts = [conv.get("updated_at") or "?", f"{turns} turns" if turns is not None else ""]
        title = _one_line(str(conv.get("title") or "(untitled)"), 60)
        screen.line(f"{n:>3}  {title}  ", style=screen.s.bold)
        screen.line(f"     {conv['id']} · {' · '.join(f for f in facts if f)}", style=screen.s.dim)
    if not listing.get("complete", True):
        screen.line(f"(only the newest {len(found)} are shown)", style=screen.s.dim)
    screen.ask("continue which? (number or id) ")
    choice = (await lines.get() or "").strip()
    screen.answer(choice)
    if not choice:
        return None
    if choice.isdigit() and 1 <= int(choice) <= len(found):
        return str(found[int(choice) - 1]["id"])
    return choice


ROLES = ("viewer", "operator", "admin")


async def _signed_in(client: GatewayClient, session: dict[str, Any], screen: Screen) -> str | None:
    """Who this chat is on the gateway, said once; returns its role on the session (None: the
    gateway does not say, or has no identities: then nothing is refused here)."""
    try:
        me = await client.whoami()
    except (GatewayError, aiohttp.ClientError, OSError):
        return None  # a gateway without identities
    user, role = me.get("user"), me.get("role")
    if user == "local" or role not in ROLES:
        return None  # no credentials configured: everyone is the local admin
    given = (session.get("members") or {}).get(user)
    if role != "admin" and session.get("owner") not in (None, user) and given in ROLES:
        role = min(role, given, key=ROLES.index)
    note = " (watching: prompts, answers and modes are an operator's)" if role == "viewer" else ""
    screen.line(f"signed in as {user} · {role}{note}", style=screen.s.dim)
    return role


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def url_problem(url: str) -> str | None:
    """What is wrong with a gateway URL the user gave (``localhost:8765`` lacks its scheme)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("http", "https") and parts.netloc:
        return None
    if "://" not in url:
        return f"the gateway URL {url!r} has no scheme: try http://{url}"
    return f"the gateway URL {url!r} is not http://host:port (or https://)"


def completions(chat: Chat) -> list[tuple[str, str]]:
    """What Tab completes after ``/``: this client's commands, then the agent's."""
    return [*OWN_COMMANDS, *((c.name, c.description or "") for c in chat.commands)]


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def add_chat_arguments(
    parser: argparse.ArgumentParser, *, with_url: bool = True, default_agent: str | None = None
) -> None:
    """The chat's options on ``parser``.

    ``with_url=True`` (``chat``): ``--url`` (required; kept if the caller added its own),
    ``--agent``, ``--token-file``, ``--workspace``, ``--session``, ``--yes``/``--no``, ``--keep``.
    ``with_url=False`` (``demo``, which runs its own tokenless server and ends with it): only
    ``--agent`` (default ``demo``), ``--workspace`` and ``--yes``/``--no``.
    """
    if with_url:
        with contextlib.suppress(argparse.ArgumentError):  # the caller added its own --url
            parser.add_argument(
                "--url", required=True, help="the gateway's base URL, http://host:port (required)"
            )
    else:
        default_agent = default_agent or "demo"
    agent_help = "agent profile for a new session"
    parser.add_argument(
        "--agent",
        default=default_agent,
        help=agent_help
        + (f" (default {default_agent})" if default_agent else " (required without --session)"),
    )
    if with_url:
        parser.add_argument(
            "--token-file",
            help="file holding the bearer token (default: $RAWP_GATEWAY_TOKEN, else none)",
        )
    parser.add_argument(
        "--workspace",
        help="the session's workspace_path, inside the gateway's workspace root "
        "(default: the root itself)",
    )
    if with_url:
        parser.add_argument(
            "--session",
            dest="session_id",
            help="attach to this existing session (default: create a new one)",
        )
        parser.add_argument(
            "--resume",
            nargs="?",
            const="",
            metavar="ID",
            help="continue a conversation the agent saved for the workspace (begun in a terminal, "
            "or a session gone from the gateway); without ID, list them and ask which "
            "(default: none, a new conversation)",
        )
    answers = parser.add_mutually_exclusive_group()
    answers.add_argument(
        "--yes",
        dest="auto_answer",
        action="store_const",
        const="allow",
        help="allow every permission question without asking (default: ask on a terminal, "
        "deny when stdin is not one)",
    )
    answers.add_argument(
        "--no",
        dest="auto_answer",
        action="store_const",
        const="deny",
        help="deny every permission question without asking",
    )
    if with_url:
        parser.add_argument(
            "--keep",
            action="store_true",
            help="do not delete the session on exit (default: the session this chat created "
            "is deleted)",
        )


def read_token(token_file: str | None) -> str | None:
    """The bearer token from ``--token-file``, else ``$RAWP_GATEWAY_TOKEN``, else none."""
    if token_file:
        with open(token_file, encoding="utf-8") as f:
            return f.read().strip() or None
    return os.environ.get("RAWP_GATEWAY_TOKEN") or None


async def run_chat_from_args(
    args: argparse.Namespace,
    *,
    url: str | None = None,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
) -> int:
    """``run_chat`` with the options of ``add_chat_arguments``; ``url`` overrides ``args.url``."""
    target = url or getattr(args, "url", None)
    if not target:
        raise ValueError("no gateway URL")
    try:
        token = read_token(getattr(args, "token_file", None))
    except OSError as err:
        (stdout or sys.stdout).write(f"✗ cannot read the token file: {err}\n")
        return 1
    return await run_chat(
        target,
        agent=args.agent,
        token=token,
        workspace=args.workspace,
        stdin=stdin,
        stdout=stdout,
        auto_answer=args.auto_answer,
        session_id=args.session_id,
        keep=args.keep,
        resume=getattr(args, "resume", None),
    )


def run_chat_command(args: argparse.Namespace) -> int:
    """``rawp-gateway chat``: the chat on a fresh event loop."""
    return _run_until_interrupted(run_chat_from_args(args))


def _run_until_interrupted(main: Coroutine[Any, Any, int]) -> int:
    # Without a terminal the chat leaves SIGINT to asyncio.run, which cancels the chat (so it
    # still deletes its session on the way out) and then raises KeyboardInterrupt.
    try:
        return asyncio.run(main)
    except KeyboardInterrupt:
        return 130


async def run_demo_async(
    args: argparse.Namespace, *, stdin: TextIO | None = None, stdout: TextIO | None = None
) -> int:
    """``rawp-gateway demo``: a gateway with the ``demo`` agent on a loopback port, and the chat
    (or, with ``--ui``, only the browser console, whose URL is printed either way).

    The server runs in this process and loop (``gateway.server.create_app``) on 127.0.0.1 with an
    ephemeral port and no token; its workspace root is ``args.workspace_root`` or a temporary
    directory removed on exit. Environment and config files are not read: the demo is the same
    everywhere.
    """
    # Imported here: the chat alone needs none of the server side.
    from aiohttp import web

    from gateway.config import Config, builtin_profiles
    from gateway.server import create_app
    from gateway.server.refusals import JsonErrorRunner

    out = stdout if stdout is not None else sys.stdout
    root_arg = getattr(args, "workspace_root", None)
    with contextlib.ExitStack() as stack:
        if root_arg:
            root = Path(root_arg).resolve()
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rawp-demo-")))
        config = Config(host="127.0.0.1", port=0, workspace_root=root, agents=builtin_profiles())
        runner = JsonErrorRunner(create_app(config), handle_signals=False, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, config.host, 0)
            await site.start()
            port = runner.addresses[0][1]
            url = f"http://127.0.0.1:{port}"
            note = "" if root_arg else " (a temporary directory, removed on exit)"
            out.write(f"rawp-gateway demo: server {url} · workspace {root}{note}\n")
            if getattr(args, "ui", False):
                # The page creates and attaches its own sessions; the server runs until Ctrl-C,
                # which is how this mode ends: exit 0.
                stop = asyncio.Event()
                with _on_stop_signals(stop.set):  # set before the line that invites Ctrl-C
                    out.write(f"browser console: {url}/ui (Ctrl-C stops the server)\n")
                    out.flush()
                    await stop.wait()
                return 0
            out.write(
                "try: list files · write hello.txt · read hello.txt · think about it · /plan · "
                "/compact · /attach PATH\n"
            )
            out.flush()

            def console_url(session_id: str) -> None:
                # Opens on this terminal's session: both are masters of it.
                out.write(f"browser console: {url}/ui#session={session_id}\n")
                out.flush()

            return await run_chat(
                url,
                agent=getattr(args, "agent", None) or "demo",
                workspace=getattr(args, "workspace", None),
                stdin=stdin,
                stdout=stdout,
                auto_answer=getattr(args, "auto_answer", None),
                on_session=console_url,
            )
        finally:
            await runner.cleanup()


@contextlib.contextmanager
def _on_stop_signals(callback: Callable[[], None]) -> Iterator[None]:
    """``callback`` on SIGINT or SIGTERM while inside (where this loop can have signal handlers;
    elsewhere nothing is installed, and only a cancellation ends the wait)."""
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, callback)
                handled.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread, or no signal handlers here
        yield
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)


def run_demo(args: argparse.Namespace) -> int:
    """``rawp-gateway demo`` on a fresh event loop."""
    return _run_until_interrupted(run_demo_async(args))
