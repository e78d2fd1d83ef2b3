"""stdin as lines for the chat, read without blocking its event loop (piped input; a terminal
gets the line editor of ``editor.py`` instead)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from typing import Final, TextIO

EOF: Final = None  # end of input


class LineSource:
    """stdin as an async stream of lines (``None`` at end of input), never blocking the loop.

    The chat reads piped stdin with it; a terminal gets the line editor of ``editor.py`` instead,
    which has the same ``get()`` and ``close()`` and draws its own prompt.

    A terminal or a pipe is watched with ``add_reader`` and read with ``os.read``; anything else (a
    regular file, a ``StringIO``) is read on a daemon thread, where a read never blocks for long.
    Reading the file descriptor directly keeps Python's buffered ``sys.stdin`` (and its lock) out of
    it, so nothing holds that lock when the interpreter exits.
    """

    draws_prompt: Final = False  # the chat writes its "> " itself

    def set_prompt(self, text: str | None) -> None:
        """Only the line editor draws a prompt (``editor.EditedLines.set_prompt``)."""

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
