"""The ``rawp-gateway`` command: ``serve``, ``translate``, ``demo``, ``chat`` and ``acp``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gateway import __version__

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rawp-gateway",
        description="Make command-line coding agents speak RAWP-DPS 1.0.1 over WebSocket.",
    )
    parser.add_argument("--version", action="version", version=f"rawp-gateway {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        # The summary is both the line in the top-level list and the subcommand's own --help.
        return sub.add_parser(
            name, help=summary, description=summary[0].upper() + summary[1:] + "."
        )

    serve = command("serve", "run the gateway server")
    serve.add_argument("--config", type=Path, help="TOML configuration file (default: none)")
    _serve_flags(serve)

    tr = command("translate", "turn an agent's recorded stdout into DPS frames (one JSON per line)")
    tr.add_argument(
        "--agent",
        default="claude-code",
        help="agent profile or parser name (default claude-code)",
    )
    tr.add_argument("--session-id", help="session_id for the frames (default: a new UUID v4)")
    tr.add_argument(
        "--exit-code",
        type=int,
        default=0,
        help="the agent's exit code at the end of the input (default 0)",
    )
    tr.add_argument(
        "--forward-unknown",
        action="store_true",
        help="forward unknown agent lines as x-rawp-gateway.agent.raw frames (default: dropped)",
    )
    tr.add_argument("file", nargs="?", default="-", help="agent stdout (default: standard input)")

    demo = command("demo", "run the gateway with the embedded demo agent and a terminal client")
    demo.add_argument("--workspace-root", help="workspace for the demo (default: a temp dir)")
    demo.add_argument(
        "--ui",
        action="store_true",
        help="no terminal client: serve the browser console only, until Ctrl-C",
    )
    _chat_arguments(demo, with_url=False)

    chat = command("chat", "a terminal client for any rawp-gateway server")
    chat.add_argument(
        "--url", required=True, help="the gateway's base URL, http://host:port (required)"
    )
    _chat_arguments(chat, with_url=True)

    from gateway.cli.acp import add_acp_arguments

    acp = command("acp", "an ACP agent on stdio for editors, relayed to a gateway's /acp")
    add_acp_arguments(acp)
    parser.set_defaults(subparsers=sub.choices)
    return parser


def _serve_flags(serve: argparse.ArgumentParser) -> None:
    """``serve``'s flags: the ``[server]`` keys declared with one (gateway/config/server.py)."""
    from gateway.config.server import ServerSettings
    from gateway.config.settings import declared, shown_default

    for key in declared(ServerSettings).values():
        if key.flag is not None:
            default = shown_default(key).replace("`", "")
            typed: dict[str, Any] = {"type": int} if key.kind == "int" else {}
            serve.add_argument(
                key.flag,
                choices=key.setting.choices,
                help=f"{key.setting.doc} (default: {default})",
                **typed,
            )


def _chat_arguments(parser: argparse.ArgumentParser, *, with_url: bool) -> None:
    try:
        from gateway.chat import add_chat_arguments
    except ImportError:  # the client is optional at import time for serve/translate
        return
    add_chat_arguments(parser, with_url=with_url)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # Said by the subcommand's parser, so the usage shown is the subcommand's (exit 2).
        args.subparsers[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "serve":
        from gateway.cli.serve import serve_command

        return serve_command(args)
    if args.command == "translate":
        from gateway.cli.translate import translate_command

        return translate_command(args)
    if args.command == "demo":
        from gateway.cli.demo import run_demo

        return run_demo(args)
    if args.command == "acp":
        from gateway.cli.acp import acp_command

        return acp_command(args)
    if args.command == "chat":
        from gateway.chat import run_chat_command

        return run_chat_command(args)
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
