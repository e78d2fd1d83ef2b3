"""An agent whose output its parser (``tests/support/raising_parser.py``) cannot take: prompts on
stdin, one a line. It says each prompt back with its pid; a prompt containing "break" then gets
the line ``BOOM`` the parser raises on, and another; every answer ends with ``DONE``. It keeps running until its stdin closes or it is stopped."""

from __future__ import annotations

import os
import sys


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    for raw in sys.stdin:
        prompt = raw.strip()
        say(f"said: {prompt} (pid {os.getpid()})")
        if "break" in prompt:
            say("BOOM")
            say("after the boom")
        say("DONE")


if __name__ == "__main__":
    main()
