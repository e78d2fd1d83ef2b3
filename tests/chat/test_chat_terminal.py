"""`rawp-gateway chat` on a real terminal: a pseudo-terminal drives the real command against a real
`rawp-gateway serve` with the demo agent, typing as a person does (keys, arrows, Tab, Ctrl-D).

What is checked is what the person sees on the terminal and what the line editor keeps: the
answer printed above the prompt, Tab completing a slash command, Up recalling earlier lines (in the
same run and across runs, from the history file under XDG_STATE_HOME), Esc Enter for a second line,
and Ctrl-D ending the chat with exit status 0.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import FIXTURES
from tests.support.servers import CLI, free_port

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]")
UP = "\x1b[A"


class Terminal:
    """The chat command on a pseudo-terminal of 40x120: ``type`` keys, ``wait_for`` screen text."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = os.forkpty()
        if self.pid == 0:  # the child: the pty is its stdin, stdout and stderr
            try:
                os.execve(sys.executable, [sys.executable, *argv[1:]], env)
            finally:
                os._exit(127)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.raw = b""

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw.decode(errors="replace"))

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # the child has gone (EIO)
            return False
        self.raw += data
        return bool(data)

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.text.count(pattern) < count:
            assert time.monotonic() < deadline, f"{pattern!r} x{count} not seen in:\n{self.text}"
            if not self._read(0.1):
                assert self.text.count(pattern) >= count, self.text
                return

    def wait_for_prompt(self) -> None:
        """Until the line editor has the terminal (it turns bracketed paste on; off while it
        prints above the prompt): keys typed while it does not are the terminal's own line
        discipline's, as in any program that has not started reading yet."""
        deadline = time.monotonic() + 30
        while self.raw.rfind(b"\x1b[?2004h") <= self.raw.rfind(b"\x1b[?2004l"):
            assert time.monotonic() < deadline and self._read(0.1), self.text

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def exit_status(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._read(0.1)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, 9)
        raise AssertionError(f"the chat did not exit:\n{self.text}")


FIXTURE = FIXTURES / "claude-code" / "text.jsonl"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    """A real `rawp-gateway serve`: the demo agent (a built-in profile), and "recorded", which
    prints what the real Claude Code printed for one prompt (its init lists its commands)."""
    port = free_port()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.md").write_text("hi\n")
    config = tmp_path / "gateway.toml"
    config.write_text(
        "[agents.recorded]\nparser = 'claude-code'\nsingle_turn_process = true\n"
        f"command = ['cat', {json.dumps(str(FIXTURE))}]\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAWP_GATEWAY_")}
    # One user's environment for serve and chat (chat(): the same state home), so the chat finds
    # the token serve made as it would on the user's machine.
    env.pop("XDG_RUNTIME_DIR", None)
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    serve = subprocess.Popen(
        [*CLI, "serve", "--port", str(port), "--workspace-root", str(workspace)]
        + ["--config", str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with __import__("urllib.request").request.urlopen(url + "/healthz", timeout=1):
                    break
            except OSError:
                assert serve.poll() is None and time.monotonic() < deadline, "serve did not start"
                time.sleep(0.1)
        yield url
    finally:
        serve.terminate()
        serve.wait(timeout=30)


def chat(url: str, state: Path, agent: str = "demo") -> Terminal:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAWP_GATEWAY_")}
    env.update(
        TERM="xterm-256color",
        XDG_STATE_HOME=str(state),
        # The pty answers no cursor position request (a terminal does): do not ask.
        PROMPT_TOOLKIT_NO_CPR="1",
    )
    env.pop("NO_COLOR", None)
    env.pop("XDG_RUNTIME_DIR", None)
    return Terminal([*CLI, "chat", "--url", url, "--agent", agent], env)


def test_typing_history_completion_and_multiline_on_a_real_terminal(gateway, tmp_path):
    state = tmp_path / "state"
    term = chat(gateway, state)
    term.wait_for_prompt()
    term.type("list files\r")
    term.wait_for("— end_turn")
    term.wait_for_prompt()
    assert "→ Glob: **/*" in term.text and "notes.md" in term.text  # printed above the prompt

    term.type("/hel\t")  # Tab completes the chat's own command...
    term.wait_for("/help", count=2)  # the banner names it once
    term.type("\r")
    term.wait_for("commands:")
    term.wait_for_prompt()
    term.type(UP + UP + "\r")  # ...and Up twice recalls the first line, sent again
    term.wait_for("— end_turn", count=2)
    term.wait_for_prompt()
    assert term.text.count("→ Glob: **/*") == 2

    term.type("first line\x1b\rsecond line\r")  # Esc Enter: one prompt of two lines
    term.wait_for("— end_turn", count=3)
    term.wait_for_prompt()
    term.type("\x04")  # Ctrl-D at an empty prompt
    assert term.exit_status() == 0

    history = state / "rawp-gateway" / "chat-history"
    entries = [json.loads(line) for line in history.read_text().splitlines()]
    assert entries == ["list files", "/help", "list files", "first line\nsecond line"]

    # A second run starts with that history: Up recalls the last line of the first run.
    again = chat(gateway, state)
    again.wait_for_prompt()
    # The two-line prompt (a second Up moves within it, as in a shell), the repeated line, /help.
    again.type(UP * 4 + "\r")
    again.wait_for("commands:")
    again.wait_for_prompt()
    again.type("\x04")
    assert again.exit_status() == 0


def test_the_agents_published_commands_complete_too(gateway, tmp_path):
    """``agent.commands.publish``: once the agent has listed its commands (Claude Code's init,
    recorded), Tab completes them after ``/`` as it does the chat's own."""
    init = json.loads(FIXTURE.read_text().splitlines()[0])
    command = next(c for c in init["slash_commands"] if c.startswith("deep-"))
    term = chat(gateway, tmp_path / "state", agent="recorded")
    term.wait_for_prompt()
    term.type("hi\r")
    term.wait_for("— end_turn")
    term.wait_for_prompt()
    term.type(f"/{command[:6]}\t")
    term.wait_for(f"/{command}")  # completed in the prompt...
    term.type("\r")  # ...then sent
    term.wait_for("— end_turn", count=2)
    term.wait_for_prompt()
    term.type("\x04")
    assert term.exit_status() == 0


def test_a_permission_question_is_answered_at_the_prompt(gateway, tmp_path):
    """The question prints above the prompt, which then asks for the answer; "y" allows."""
    term = chat(gateway, tmp_path / "state")
    term.wait_for_prompt()
    term.type("write hello.txt\r")
    term.wait_for("Allow Write: ")
    term.wait_for("answer>")
    term.wait_for_prompt()
    term.type("y\r")
    term.wait_for("— end_turn")
    assert "← ok" in term.text
    term.wait_for_prompt()
    term.type("\x04")
    assert term.exit_status() == 0
    assert (tmp_path / "ws" / "hello.txt").exists()  # the gateway fixture's workspace
