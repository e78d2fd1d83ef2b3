"""The image of the current sources, built once per test run (scripts/build-image: an image of the
same sources is reused, and its file lock lets one pytest-xdist worker build while the others
wait), and a token file for the containers to read."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from tests.support.engine import Engine, built


@pytest.fixture(scope="session")
def engine() -> Engine:
    return built()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    """A bearer token in a file the container's user can read (mounted read-only)."""
    path = tmp_path / "rawp-token"
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o644)
    return path
