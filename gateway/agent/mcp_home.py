"""Gemini's MCP servers on the disk: its settings file in the session's HOME, mode 0600.

Theory of operation
-------------------
Gemini CLI 0.61.0 reads MCP servers only from settings files: the system's (which it skips unless
root owns it and every directory above it), the workspace's ``.gemini/`` (the user's repository,
not the gateway's to write) and the user's, ``<home>/.gemini/settings.json``, where ``<home>`` is
``GEMINI_CLI_HOME`` when set, else ``HOME``. So a session that has servers gets a home of its own:

- in the sandbox, the session's HOME (docs/isolation.md), first filled from the profile's HOME
  as every sandboxed agent's is;
- outside it, the same per-session directory (in the session's state-dir directory), given to
  Gemini as ``GEMINI_CLI_HOME``; on first use its ``.gemini/`` gets the top-level files of the
  user's ``~/.gemini/`` (settings, login), so the agent runs as the user set it up.

Each start writes ``settings.json`` there again (``mcp_delivery.gemini_settings``: the file's other
settings kept, ``mcpServers`` the session's), never through a link the agent may have left: the
directories are opened without following links and the file is replaced by a rename. It holds no
secret: values are ``${variable}``s of the agent's environment (gateway/protocol/mcp_delivery.py).
Gemini keeps its conversations under that home too, so a resume finds them there.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any, Final

from gateway.protocol.mcp_delivery import gemini_settings
from gateway.storage import nofollow

__all__ = ["GEMINI_DIR", "MAX_SEED_FILE_BYTES", "MAX_SETTINGS_BYTES", "write_gemini_settings"]

log = logging.getLogger("rawp_gateway.agent")

GEMINI_DIR: Final = ".gemini"
SETTINGS: Final = "settings.json"
MAX_SETTINGS_BYTES: Final = 1024 * 1024  # the settings file read back; real ones are a few KiB
MAX_SEED_FILE_BYTES: Final = 1024 * 1024  # one file of the user's ~/.gemini/ copied
MAX_SEED_FILES: Final = 64


def write_gemini_settings(home: str, servers: Mapping[str, Any], seed: str | None) -> None:
    """``<home>/.gemini/settings.json`` with the session's ``servers`` (blocking: run it in a
    worker thread). ``seed``: a HOME whose ``.gemini/`` top-level files fill a new one first."""
    home_fd = nofollow.open_dir(home)
    try:
        fresh = not _exists(home_fd, GEMINI_DIR)
        dir_fd = nofollow.open_dir(GEMINI_DIR, dir_fd=home_fd, create=True)
    finally:
        os.close(home_fd)
    try:
        if fresh and seed is not None:
            _seed(dir_fd, os.path.join(seed, GEMINI_DIR))
        existing: Any = {}
        try:
            existing = json.loads(nofollow.read_file(dir_fd, SETTINGS, MAX_SETTINGS_BYTES))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as err:
            # A link, a FIFO, a huge file (the agent's doing), or JSON with comments (which
            # Gemini takes and this does not): the session's servers win over the rest.
            log.warning("Gemini's settings file is not usable; written anew: %s", err)
        data = json.dumps(gemini_settings(existing, servers), indent=2).encode()
        nofollow.replace_file(dir_fd, SETTINGS, data, fsync=False, mode=0o600)
    finally:
        os.close(dir_fd)


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _seed(dir_fd: int, source: str) -> None:
    """The regular files directly in ``source`` (the user's ``~/.gemini``), never through a link
    and each bounded; its directories (conversations, history) stay the user's."""
    try:
        src = nofollow.open_dir(source)
    except OSError:
        return  # no ~/.gemini: Gemini starts as on a new machine
    try:
        copied = 0
        for entry in os.scandir(src):
            if copied >= MAX_SEED_FILES:
                break
            if not entry.is_file(follow_symlinks=False):
                continue
            try:
                data = nofollow.read_file(src, entry.name, MAX_SEED_FILE_BYTES)
            except OSError:
                continue
            nofollow.replace_file(dir_fd, entry.name, data, fsync=False, mode=0o600)
            copied += 1
    finally:
        os.close(src)
