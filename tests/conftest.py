"""Skips the tests whose tools this machine lacks, with the reason scripts/test found.

scripts/test runs scripts/missing-test-parts and passes what it printed in ``RAWP_TEST_MISSING``:
one line per missing part, ``<marker>: <reason>`` (``realcli: Node.js 20+ with npm not found``).
Every test carrying that marker is skipped with that reason, so pytest's summary says what was left
out and why. Under CI (``CI=true``) nothing may be missing: a non-empty list is a usage error.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from tests.support.console import open_page

MISSING_VAR = "RAWP_TEST_MISSING"

# Every Python the tests start (gateways, demo agents) prints its threads' stacks on a fatal signal,
# so a process that hangs can be asked where it is (tests/support/servers.py wait_http).
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

# Property tests check what comes out, never how fast: hypothesis's default 200 ms deadline per
# example is a timed assertion, and it failed on this 2-core machine while the suite's workers ran.
settings.register_profile("rawp", deadline=None)
settings.load_profile("rawp")


def missing_parts(value: str) -> dict[str, str]:
    """``{marker: reason}`` from the variable's lines; blank lines are ignored."""
    parts = {}
    for line in value.splitlines():
        marker, sep, reason = line.partition(":")
        if line.strip():
            if not sep or not marker.strip() or not reason.strip():
                raise pytest.UsageError(
                    f"{MISSING_VAR}: expected '<marker>: <reason>', got {line!r}"
                )
            parts[marker.strip()] = reason.strip()
    return parts


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = missing_parts(os.environ.get(MISSING_VAR, ""))
    if not missing:
        return
    if os.environ.get("CI", "").lower() == "true":
        raise pytest.UsageError(
            f"CI=true, but {MISSING_VAR} says parts are missing: {'; '.join(missing.values())}"
        )
    known = {line.split(":")[0].strip() for line in config.getini("markers")}
    for marker, reason in missing.items():
        if marker not in known:
            raise pytest.UsageError(f"{MISSING_VAR}: {marker!r} is not a registered marker")
        skip = pytest.mark.skip(reason=f"{reason} (scripts/test)")
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)


@pytest.fixture
async def gw(tmp_path):
    """The real gateway in-process (``tests.support.gateway_peer.start_gateway``) with the demo agent
    answering at once, workspace root ``tmp_path``. A module may define its own ``gw``."""
    from tests.support.gateway_peer import demo_config, start_gateway

    client = await start_gateway(demo_config(tmp_path))
    yield client
    await client.close()


@pytest.fixture
async def page():
    """A tab of a new headless Chromium (the ``browser`` tests; closed after the test)."""
    async with open_page() as tab:
        yield tab
