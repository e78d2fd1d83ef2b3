"""The recorded Claude Code fixtures are complete and come from the pinned CLI and the scenario as
it is now (no CLI needed; tests/test_rig_cli.py runs the CLI against the scenarios)."""

from __future__ import annotations

import json
from typing import Any

from tests.rig import env as rigenv
from tests.rig.record import scenario_digest
from tests.rig.scenario import all_scenarios, scenario_path

AGENT = "claude-code"
FIXTURES = rigenv.FIXTURE_ROOT / AGENT
SCENARIOS = all_scenarios(AGENT)


# -- fixtures (no CLI needed) ------------------------------------------------------------------


def metas() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.meta.json"))]


def test_every_fixture_comes_from_the_pinned_cli_and_a_scenario() -> None:
    ms = metas()
    assert ms, "no fixtures recorded"
    for m in ms:
        assert m["agent"] == AGENT
        assert m["cli_version"] == rigenv.AGENTS[AGENT].version, m["fixture"]
        assert scenario_path(AGENT, m["scenario"]).is_file(), m["fixture"]
        sc = next(s for s in SCENARIOS if s.name == m["scenario"])
        assert m["scenario_sha256"] == scenario_digest(sc), (
            f"{sc.path} changed after {m['fixture']} was recorded: "
            f"python -m tests.rig.record --agent {AGENT} {sc.name}"
        )
        assert (FIXTURES / f"{m['fixture']}.jsonl").is_file(), m["fixture"]
        assert m["argv"][0] == "claude"
        assert isinstance(m["exit_code"], int) or m["signal"], m["fixture"]


def test_every_scenario_and_variant_has_a_fixture_with_the_expected_exit() -> None:
    by_fixture = {m["fixture"]: m for m in metas()}
    for sc in SCENARIOS:
        for fixture, variant in sc.fixture_names():
            m = by_fixture.get(fixture)
            assert m, (
                f"{fixture} not recorded: python -m tests.rig.record --agent {AGENT} {fixture}"
            )
            assert m["variant"] == variant
            assert m["exit_code"] == sc.expect["exit_code"], fixture
            lines = (FIXTURES / f"{fixture}.jsonl").read_text().splitlines()
            assert len(lines) == m["stdout_lines"]
            for line in lines:
                json.loads(line)  # every stdout line is one JSON object
