"""The budgets' ledger on disk: ``<state_dir>/budgets.json``, what each session and each owner
spent of the cost the agents reported (gateway/protocol/budget.py holds the rules).

It is written whole, through a temporary file renamed over it (``nofollow.replace_file``), after
every report that changed it and before anything acts on that report, so a gateway killed at any
point (SIGKILL included) leaves the ledger as it was before the report or as it is after it, never
half of it. It is not fsynced (nor is a session's record): a crash of the machine may lose the
last reports, and the agent's next running total counts them then. It is small: an entry per live
session and per owner who spent that day.

The state directory is input (the agents run as the gateway's user): the file is read without
following a link, only when a regular file of at most ``MAX_LEDGER_BYTES``, and checked whole; one
that cannot be used is set aside as ``budgets.json.bad`` with a log line, and counting starts
again from nothing rather than the gateway not starting.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Final

from gateway.protocol.budget import Ledger, LedgerError, Limits
from gateway.storage import nofollow

__all__ = ["LEDGER", "MAX_LEDGER_BYTES", "LedgerFile"]

log = logging.getLogger("rawp_gateway.budgets")

LEDGER: Final = "budgets.json"
MAX_LEDGER_BYTES: Final = 32 * 1024 * 1024


class LedgerFile:
    """``budgets.json`` in the directory ``dir_fd`` (the state dir's, not owned)."""

    def __init__(self, dir_fd: int) -> None:
        self.dir_fd = dir_fd

    def read(self, limits: Limits) -> Ledger:
        """The ledger saved, or a new one (none saved, or one that cannot be used: set aside)."""
        try:
            data = nofollow.read_file(self.dir_fd, LEDGER, MAX_LEDGER_BYTES)
        except FileNotFoundError:
            return Ledger(limits)
        except OSError as err:
            return self._set_aside(limits, f"cannot be read: {err.strerror or err}")
        try:
            return Ledger.from_json(json.loads(data), limits)
        except (ValueError, LedgerError) as err:  # json's errors are ValueErrors
            return self._set_aside(limits, str(err)[:200])

    def write(self, ledger: Ledger) -> None:
        data = json.dumps(ledger.to_json(), separators=(",", ":")).encode()
        nofollow.replace_file(self.dir_fd, LEDGER, data, fsync=False)

    def _set_aside(self, limits: Limits, why: str) -> Ledger:
        log.error(
            "the budgets ledger %s cannot be used (%s); set aside, counting anew", LEDGER, why
        )
        with contextlib.suppress(OSError):
            os.replace(LEDGER, LEDGER + ".bad", src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        return Ledger(limits)
