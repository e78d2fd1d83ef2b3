"""``rawp-gateway serve``: the gateway server, configured from ``--config``, the environment and
the flags."""

from __future__ import annotations

import argparse
import sys


def serve_command(args: argparse.Namespace) -> int:
    """``rawp-gateway serve``: the configuration from the file, environment and flags, then the
    server until a signal stops it; 2 when the configuration or the start fails."""
    from gateway.config import ConfigError, load_config
    from gateway.server import StartError, serve
    from gateway.storage.state_dir import StateDirError

    flags = {
        "host": args.host,
        "port": args.port,
        "token_file": args.token_file,
        "workspace_root": args.workspace_root,
        "log_format": args.log_format,
        "state_dir": args.state_dir,
    }
    try:
        config = load_config(args.config, flags)
    except ConfigError as err:
        print(f"rawp-gateway: {err}", file=sys.stderr)
        return 2
    _setup_logging(config.log_format)
    try:
        serve(config)
    except (StateDirError, StartError) as err:
        print(f"rawp-gateway: {err}", file=sys.stderr)
        return 2
    return 0


def _setup_logging(fmt: str) -> None:
    from gateway.logs import configure

    configure(fmt)
