"""`rawp-gateway demo`: a gateway with the demo agent and the terminal chat in one process.

The one place where the server and the chat client meet: the chat itself needs none of the
server side, so it is brought together here, in the command.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from aiohttp import web

from gateway.chat.command import run_chat, run_until_interrupted
from gateway.config import Config, ServerSettings, builtin_profiles, with_made_token
from gateway.server import create_app
from gateway.server.refusals import JsonErrorRunner


async def run_demo_async(
    args: argparse.Namespace, *, stdin: TextIO | None = None, stdout: TextIO | None = None
) -> int:
    """``rawp-gateway demo``: a gateway with the ``demo`` agent on a loopback port, and the chat
    (or, with ``--ui``, only the browser console, whose URL is printed either way).

    The server runs in this process and loop (``gateway.server.create_app``) on 127.0.0.1 with an
    ephemeral port and a token made for it, which the chat gets handed and the printed console URL
    carries (never a file: nothing outside this process needs it, so no agent can find it); its
    workspace root is ``args.workspace_root`` or a temporary
    directory removed on exit. Environment and config files are not read: the demo is the same
    everywhere.
    """
    out = stdout if stdout is not None else sys.stdout
    root_arg = getattr(args, "workspace_root", None)
    with contextlib.ExitStack() as stack:
        if root_arg:
            root = Path(root_arg).resolve()
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rawp-demo-")))
        server = ServerSettings(host="127.0.0.1", port=0, workspace_root=root)
        config = with_made_token(Config(server=server, agents=builtin_profiles()))
        token = config.token
        runner = JsonErrorRunner(create_app(config), handle_signals=False, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, config.server.host, 0)
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
                    out.write(
                        f"browser console: {url}/ui#token={token} (Ctrl-C stops the server)\n"
                    )
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
                out.write(f"browser console: {url}/ui#session={session_id}&token={token}\n")
                out.flush()

            return await run_chat(
                url,
                agent=getattr(args, "agent", None) or "demo",
                token=token,
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
    return run_until_interrupted(run_demo_async(args))
