"""``rawp-gateway serve``: the gateway server, configured from ``--config``, the environment and
the flags."""

from __future__ import annotations

import argparse
import sys


def serve_command(args: argparse.Namespace) -> int:
    """``rawp-gateway serve``: the configuration from the file, environment and flags, then the
    server until a signal stops it; 2 when the configuration or the start fails."""
    from gateway.config import ConfigError, ServerSettings, load_config
    from gateway.config.settings import declared
    from gateway.server import StartError, serve
    from gateway.storage.state_dir import StateDirError

    keys = declared(ServerSettings).values()
    flags = {key.name: getattr(args, key.name) for key in keys if key.flag is not None}
    try:
        config = load_config(args.config, flags)
    except ConfigError as err:
        print(f"rawp-gateway: {err}", file=sys.stderr)
        return 2
    _setup_logging(config.server.log_format)
    try:
        serve(config)
    except (StateDirError, StartError) as err:
        print(f"rawp-gateway: {err}", file=sys.stderr)
        return 2
    return 0


def _setup_logging(fmt: str) -> None:
    from gateway.logs import configure

    configure(fmt)
