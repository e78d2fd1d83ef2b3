"""Where the tests' own files are, named once for every test folder."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
# Recorded agent output (tests/fixtures/<agent>/*.jsonl and their .meta.json)
FIXTURES = TESTS / "fixtures"
# Small hostile agents the tests run as real processes
HOSTILE = TESTS / "support" / "hostile"
# The real-agent rig: scenarios, scripted model servers, checks (tests/support/rig/README.md)
RIG = TESTS / "support" / "rig"
