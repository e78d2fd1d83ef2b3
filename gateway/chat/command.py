"""`rawp-gateway chat`: the command, its options, and the session it runs the chat on.

    rawp-gateway chat --url URL --agent NAME [--token-file F] [--workspace DIR] [--session ID]
        [--resume [ID]] [--yes | --no] [--keep]

``run_chat`` creates a session (or attaches to ``--session``; with ``--resume`` the new session
continues a conversation the agent saved, chosen from a numbered list when no id is given, and
shows its earlier turns), attaches the WebSocket, says who the chat is signed in as, and runs a
``Chat`` (``app.py``) on it until the user leaves; on the way out it deletes the session it
created unless ``--keep``.

Exit status: 0; 1 when the session could not be created or attached, or ended under us (deleted
elsewhere, a fatal error, or a connection that could not be reattached).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import threading
import urllib.parse
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final, TextIO

import aiohttp

from gateway.chat.app import REATTACH_DELAYS_SEC, Chat, completions
from gateway.chat.lines import LineSource
from gateway.chat.render import ANSI, PLAIN, Screen, one_line
from gateway.client import GatewayClient, GatewayError, read_token

if TYPE_CHECKING:
    from gateway.chat.editor import EditedLines

CONVERSATIONS_SHOWN: Final = 20  # --resume without an id: the newest saved conversations listed


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
    reattach_delays: tuple[float, ...] = REATTACH_DELAYS_SEC,
    resume: str | None = None,
    on_session: Callable[[str], None] | None = None,
    line_editor: bool | None = None,
) -> int:
    """Run the terminal chat against the gateway at ``url``; returns the exit status.

    ``on_session`` is called with the session id once it is attached (the demo prints the
    console's URL for it). ``line_editor``: read with the line editor of ``editor.py`` (history,
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
        title = one_line(str(conv.get("title") or "(untitled)"), 60)
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


def url_problem(url: str) -> str | None:
    """What is wrong with a gateway URL the user gave (``localhost:8765`` lacks its scheme)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("http", "https") and parts.netloc:
        return None
    if "://" not in url:
        return f"the gateway URL {url!r} has no scheme: try http://{url}"
    return f"the gateway URL {url!r} is not http://host:port (or https://)"


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
    ``with_url=False`` (``demo``, which runs its own server, hands it its token, and ends with it): only
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
            help="file holding the bearer token (default: $RAWP_GATEWAY_TOKEN, else for a "
            "loopback URL the token the gateway made on that port)",
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
        token = read_token(getattr(args, "token_file", None), target)
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
    return run_until_interrupted(run_chat_from_args(args))


def run_until_interrupted(main: Coroutine[Any, Any, int]) -> int:
    # Without a terminal the chat leaves SIGINT to asyncio.run, which cancels the chat (so it
    # still deletes its session on the way out) and then raises KeyboardInterrupt.
    try:
        return asyncio.run(main)
    except KeyboardInterrupt:
        return 130
