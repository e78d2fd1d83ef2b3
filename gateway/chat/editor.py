"""The chat's line editor on a terminal: prompt_toolkit's prompt, with output streamed above it.

``EditedLines`` has the interface of ``chat.LineSource`` (``get()`` a line, ``None`` at the end;
``close()``), so the chat reads from either the same way: the plain reader for piped stdin (what
scripts and the tests use, unchanged), this one when stdin and stdout are a terminal. It adds what a
shell has:

* line editing (arrows, Home/End, Ctrl-W, ...), and history across runs in
  ``$XDG_STATE_HOME/rawp-gateway/chat-history`` (``~/.local/state/...``), the last
  ``HISTORY_ENTRIES`` kept, Up/Down and Ctrl-R to recall;
* Tab completion of the chat's own slash commands and of the agent's published ones
  (``agent.commands.publish``);
* multi-line input: Esc then Enter (or Alt-Enter) starts a new line, Enter sends;
* Ctrl-C is a key here, not a signal: it calls ``on_interrupt`` (the chat cancels the running
  turn, or quits at the prompt); Ctrl-D on an empty line is the end of input.

What the chat prints goes through ``output()``, a ``StdoutProxy`` that prints above the prompt.
It prints whole lines only (text without its newline would be drawn over by the prompt), so a
streamed answer appears line by line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final, TextIO

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.formatted_text import ANSI
from prompt_toolkit.history import History
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.patch_stdout import StdoutProxy

__all__ = ["HISTORY_ENTRIES", "EditedLines", "SlashCompleter", "TrimmedFileHistory", "history_path"]

HISTORY_ENTRIES: Final = 1000  # lines kept across runs; older ones are dropped at start
MAX_ENTRY_CHARS: Final = 64 * 1024  # a longer line (a pasted file) is sent but not remembered


def history_path() -> Path:
    """Where the chat keeps its history: the user's state directory (XDG)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(state) / "rawp-gateway" / "chat-history"


class TrimmedFileHistory(History):
    """One JSON string per line (a multi-line entry stays one line), the last ``limit`` kept: the
    file is rewritten at start when it holds more."""

    def __init__(self, path: Path, limit: int = HISTORY_ENTRIES) -> None:
        super().__init__()
        self.path = path
        self.limit = limit

    def load_history_strings(self) -> Iterable[str]:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            return []
        entries = []
        for line in lines:
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, str):
                    entries.append(entry)
        if len(lines) > self.limit:
            entries = entries[-self.limit :]
            with contextlib.suppress(OSError):
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
                tmp.replace(self.path)
        return list(reversed(entries))  # newest first, as prompt_toolkit wants

    def store_string(self, string: str) -> None:
        if len(string) > MAX_ENTRY_CHARS:
            return
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(string) + "\n")


class SlashCompleter(Completer):
    """``/na`` → the slash commands starting with it: ``commands()`` gives (name, description)."""

    def __init__(self, commands: Callable[[], Iterable[tuple[str, str]]]) -> None:
        self.commands = commands

    def get_completions(self, document: Document, complete_event: CompleteEvent):  # type: ignore[no-untyped-def]
        text = document.text_before_cursor
        if not text.startswith("/") or " " in text or "\n" in text:
            return
        seen: set[str] = set()
        for name, description in self.commands():
            if name.startswith(text[1:]) and name not in seen:
                seen.add(name)
                yield Completion(
                    "/" + name, start_position=-len(text), display_meta=description or None
                )


def _key_bindings() -> KeyBindings:
    bindings = KeyBindings()

    @bindings.add("escape", "enter")
    def _newline(event: KeyPressEvent) -> None:
        event.current_buffer.insert_text("\n")

    return bindings


class EditedLines:
    """Lines from prompt_toolkit's prompt, read by a task of its own (see the module docstring)."""

    draws_prompt: Final = True

    def __init__(
        self,
        *,
        commands: Callable[[], Iterable[tuple[str, str]]],
        on_interrupt: Callable[[], None],
        prompt: str = "> ",
        history: History | None = None,
    ) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.on_interrupt = on_interrupt
        self._session: PromptSession[str] = PromptSession(
            history=history if history is not None else TrimmedFileHistory(history_path()),
            completer=SlashCompleter(commands),
            complete_while_typing=False,  # Tab completes; typing is not interrupted by a menu
            key_bindings=_key_bindings(),
            prompt_continuation=lambda width, line, wrap: "… ".rjust(width),
        )
        self._prompt = prompt
        self._asking: str | None = None  # the prompt while a question waits for its answer
        self._proxy = StdoutProxy(raw=True, sleep_between_writes=0.02)
        self._task = asyncio.get_running_loop().create_task(self._read(), name="chat-input")

    def output(self) -> TextIO:
        """Where the chat writes: above the prompt."""
        return self._proxy  # type: ignore[return-value]

    async def _read(self) -> None:
        while True:
            try:
                line = await self._session.prompt_async(lambda: ANSI(self._asking or self._prompt))
            except KeyboardInterrupt:  # Ctrl-C: a key while the prompt owns the terminal
                self.on_interrupt()
                continue
            except EOFError:  # Ctrl-D on an empty line
                self.queue.put_nowait(None)
                return
            self.queue.put_nowait(line)

    def set_prompt(self, text: str | None) -> None:
        """Another prompt while a question waits (``answer> ``); None: the usual one again."""
        self._asking = text
        self._session.app.invalidate()

    async def get(self) -> str | None:
        return await self.queue.get()

    def close(self) -> None:
        self._task.cancel()
        self._proxy.close()
