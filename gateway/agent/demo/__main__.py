"""The demo agent's command line (``python -m gateway.agent.demo``, and ``python -m
gateway.demo_agent`` through its shim): the claude flags that matter, the signals as the CLI takes
them, and the exit."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

from gateway.agent import demo
from gateway.agent.demo import DEFAULT_DELAY_MS, DEFAULT_MODEL, PERMISSION_MODES
from gateway.agent.demo.agent import DemoAgent, warn


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The claude flags that matter; unknown flags are reported on stderr and ignored."""
    ap = argparse.ArgumentParser(prog="python -m gateway.demo_agent", description=demo.__doc__)
    ap.add_argument("prompt", nargs="?", help="text input: answer this one prompt and exit")
    ap.add_argument("-p", "--print", action="store_true", help="accepted; always non-interactive")
    ap.add_argument("--input-format", choices=("text", "stream-json"), default=None)
    ap.add_argument("--output-format", choices=("stream-json",), default="stream-json")
    ap.add_argument("--verbose", action="store_true", help="accepted; output is always verbose")
    ap.add_argument("--include-partial-messages", action="store_true")
    ap.add_argument("--permission-prompt-tool", choices=("stdio",), default=None)
    ap.add_argument("--permission-mode", dest="mode", choices=PERMISSION_MODES, default="default")
    ap.add_argument("--dangerously-skip-permissions", action="store_true")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--tools", "--allowedTools", dest="tools", default=None)
    ap.add_argument("--resume", "-r", default=None, metavar="SESSION_ID")
    ap.add_argument("--session-id", default=None)
    return ap.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts, unknown = parse_args(argv)
    if unknown:
        warn(f"ignoring unsupported arguments: {' '.join(unknown)}")
    prompt: str | None = None
    if opts.input_format == "text" or (opts.input_format is None and opts.prompt is not None):
        prompt = opts.prompt if opts.prompt is not None else sys.stdin.read()
    try:
        delay_ms = float(os.environ.get("RAWP_DEMO_DELAY_MS", DEFAULT_DELAY_MS))
    except ValueError:
        delay_ms = DEFAULT_DELAY_MS
    agent = DemoAgent(opts, workspace=os.getcwd(), delay_sec=max(0.0, delay_ms) / 1000)

    async def amain() -> int:
        loop = asyncio.get_running_loop()
        # Like the CLI: SIGTERM ends at once with 143 and no result; SIGINT interrupts and exits 0.
        loop.add_signal_handler(signal.SIGTERM, _exit_now, 143)

        def on_sigint() -> None:
            agent.exit_after_turn = True
            agent.interrupt(None)
            if agent.turn is None:
                agent.prompts.put_nowait(None)

        loop.add_signal_handler(signal.SIGINT, on_sigint)
        return await agent.run(prompt)

    try:
        return asyncio.run(amain())
    except BrokenPipeError:
        # The reader went away; nobody is left to tell.
        _exit_now(0)
        return 0


def _exit_now(code: int) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
