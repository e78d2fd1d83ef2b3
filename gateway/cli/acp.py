"""``rawp-gateway acp``: the stdio side of ``/acp`` that an editor launches as a custom ACP agent
(``docs/acp-masters.md``). Arguments and the token here; the relay is ``gateway.client``'s."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import sys
from collections.abc import Callable


def add_acp_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        required=True,
        help="the gateway's (or the fleet router's) base URL, http://host:port (required)",
    )
    parser.add_argument(
        "--agent",
        help="agent profile for sessions this editor creates (default: the gateway's "
        "[acp] default_agent)",
    )
    parser.add_argument(
        "--token-file",
        help="file holding the bearer token (default: $RAWP_GATEWAY_TOKEN, else for a "
        "loopback URL the token the gateway made on that port)",
    )


def acp_command(args: argparse.Namespace) -> int:
    """Relay stdin and stdout to the gateway's ``/acp`` until the editor closes stdin; 2 when the
    URL or the token file is unusable (said on stderr: stdout belongs to the protocol)."""
    from gateway.client import read_token
    from gateway.client.acp_link import acp_url, run_relay
    from gateway.local_token import local_token

    token: str | Callable[[], str | None] | None
    try:
        token = read_token(args.token_file, args.url)
        if not args.token_file and not os.environ.get("RAWP_GATEWAY_TOKEN"):
            # Found in the port's file (or not yet there): read again before every connect, so
            # the relay follows a gateway started again on the port with a new made token.
            token = functools.partial(local_token, args.url)
        acp_url(args.url, args.agent)
    except (OSError, ValueError) as err:
        print(f"rawp-gateway acp: {err}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(run_relay(args.url, token=token, agent=args.agent))
    return 130
