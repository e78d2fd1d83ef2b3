"""The real CLIs (Claude Code, Codex, Gemini; pinned) against the rig's scripted model servers
(marked ``realcli``).

Every scenario of an agent runs once: it must still run as scripted (expected exit, every scripted
call used, nothing unscripted), print the same kinds of events as its recorded fixture, and pass
the checks specific to it (``tests/support/rig/checks/<agent>.py``). So a CLI update that prints something
else, or a fixture that no longer matches the CLI, fails here, not in a user's session. A realcli
test fails instead of skipping when CI=true (env.require_cli). And, without a CLI, every recorded
fixture is checked against its scenario as it is now.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from types import ModuleType

import pytest

from tests.support.rig import env as rigenv
from tests.support.rig.record import problems, scenario_digest
from tests.support.rig.run import scripted_cli
from tests.support.rig.scenario import Scenario, all_scenarios

AGENTS = ["claude-code", "codex", "gemini"]


def checks_of(agent: str) -> ModuleType:
    return importlib.import_module(f"tests.support.rig.checks.{agent.replace('-', '_')}")


def runs_of(agent: str) -> list[tuple[Scenario, str, str | None]]:
    """(scenario, fixture, variant): every scenario's plain run, and each variant that has checks
    of its own."""
    checks = checks_of(agent).CHECKS
    return [
        (sc, fixture, variant)
        for sc in all_scenarios(agent)
        for fixture, variant in sc.fixture_names()
        if variant is None or fixture in checks
    ]


@pytest.mark.realcli
@pytest.mark.parametrize("agent", AGENTS)
def test_installed_cli_is_the_pinned_version(agent: str) -> None:
    rigenv.require_cli(agent)
    assert rigenv.installed_version(agent) == rigenv.AGENTS[agent].version
    assert rigenv.cli_version(agent) == rigenv.AGENTS[agent].version


@pytest.mark.realcli
@pytest.mark.parametrize("agent", AGENTS)
async def test_every_scenario_runs_as_scripted_and_as_recorded(agent: str) -> None:
    """The runs are independent (own server, HOME and workspace), so they run side by side (the
    agent's PARALLEL at a time) to keep this fast; one report lists every run that drifted."""
    rigenv.require_cli(agent)
    checks = checks_of(agent)
    gate = asyncio.Semaphore(checks.PARALLEL)
    fixtures = rigenv.FIXTURE_ROOT / agent

    async def check(sc: Scenario, fixture: str, variant: str | None) -> str | None:
        async with gate, scripted_cli(sc, variant=variant) as cli:
            r = await cli.run()
            try:
                assert not problems(cli.scenario, r), problems(cli.scenario, r)
                lines = (fixtures / f"{fixture}.jsonl").read_text().splitlines()
                recorded = checks.shape(fixture, [json.loads(x) for x in lines])
                assert checks.shape(fixture, r.events) == recorded, "event kinds"
                if fixture in checks.CHECKS:
                    checks.CHECKS[fixture](r, cli)  # while the workspace still exists
            except (AssertionError, LookupError, ValueError) as e:  # a check that did not hold
                return f"{e!r}\n{r.describe()}"
        return None

    runs = runs_of(agent)
    reports = await asyncio.gather(*(check(*run) for run in runs))
    failed = {fixture: rep for (_, fixture, _), rep in zip(runs, reports, strict=True) if rep}
    assert not failed, "\n\n".join(f"{k}: {v}" for k, v in failed.items())


@pytest.mark.parametrize("agent", ["codex", "gemini"])
def test_every_scenario_has_specific_checks(agent: str) -> None:
    assert set(checks_of(agent).CHECKS) == {sc.name for sc in all_scenarios(agent)}


@pytest.mark.parametrize("agent", AGENTS)
def test_every_check_is_of_a_recorded_run(agent: str) -> None:
    fixtures = {f for sc in all_scenarios(agent) for f, _ in sc.fixture_names()}
    assert set(checks_of(agent).CHECKS) <= fixtures


@pytest.mark.parametrize("agent", AGENTS)
def test_every_fixture_comes_from_the_pinned_cli_and_its_scenario_as_it_is_now(agent: str) -> None:
    """Fixtures are never edited by hand: each run of each scenario (and variant) has one, from the
    pinned CLI, from its scenario as it is now (sha256), ended the way the scenario expects, every
    stdout line one JSON object, and a timed scenario's with the time of each line and prompt (no
    CLI needed)."""
    root = rigenv.FIXTURE_ROOT / agent
    expected = {
        fixture: (sc, variant)
        for sc in all_scenarios(agent)
        for fixture, variant in sc.fixture_names()
    }
    assert {p.stem for p in root.glob("*.jsonl")} == set(expected)
    assert {p.name.removesuffix(".meta.json") for p in root.glob("*.meta.json")} == set(expected)
    for fixture, (sc, variant) in expected.items():
        meta = json.loads((root / f"{fixture}.meta.json").read_text())
        assert (meta["agent"], meta["scenario"], meta["variant"]) == (agent, sc.name, variant)
        assert meta["cli_version"] == rigenv.spec(agent).version, fixture
        assert meta["argv"][0] == rigenv.spec(agent).bin_name, fixture
        assert meta["scenario_sha256"] == scenario_digest(sc), (
            f"{sc.path} changed after {fixture} was recorded: "
            f"python -m tests.support.rig.record --agent {agent} {fixture}"
        )
        assert meta["exit_code"] == sc.expect.get("exit_code"), fixture
        assert meta["signal"] == sc.expect.get("signal"), fixture
        lines = (root / f"{fixture}.jsonl").read_text().splitlines()
        assert len(lines) == meta["stdout_lines"], fixture
        assert all(isinstance(json.loads(line), dict) for line in lines), fixture
        # A timed scenario's meta says when each of those lines came and each prompt went.
        times = meta.get("stdout_times")
        assert (times is not None) == sc.run.timed, fixture
        if sc.run.timed:
            assert len(times) == len(lines) and times == sorted(times), fixture
            assert len(meta["stdin_times"]) == len(meta["stdin"]), fixture
