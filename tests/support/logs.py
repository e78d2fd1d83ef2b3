"""What the gateway logged, read back from pytest's ``caplog``."""

from __future__ import annotations

import logging

import pytest

SESSION_LOGGER = "rawp_gateway.session"


def watch_sessions(caplog: pytest.LogCaptureFixture) -> None:
    """Capture the session log's info records (where a session's end is said)."""
    caplog.set_level(logging.INFO, logger=SESSION_LOGGER)


def deletions(caplog: pytest.LogCaptureFixture, session_id: str) -> list[tuple[str, str]]:
    """(reason, deleted_by) of every "session deleted" record of ``session_id``."""
    return [
        (r.reason, r.deleted_by)
        for r in caplog.records
        if r.name == SESSION_LOGGER
        and r.getMessage() == "session deleted"
        and getattr(r, "session", None) == session_id
    ]
