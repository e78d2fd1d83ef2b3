"""The real Claude Code CLI against the scripted Messages API (marked ``realcli``), and checks that
the recorded fixtures are complete and come from the pinned CLI (those need no CLI).

A realcli test fails instead of skipping when CI=true (env.require_cli)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.rig import env as rigenv
from tests.rig.record import problems, scenario_digest
from tests.rig.run import RunResult, run_scenario, scripted_cli
from tests.rig.scenario import Scenario, all_scenarios, scenario_path

AGENT = "claude-code"
FIXTURES = rigenv.FIXTURE_ROOT / AGENT
SCENARIOS = all_scenarios(AGENT)


async def run(name: str, variant: str | None = None) -> RunResult:
    rigenv.require_cli(AGENT)
    return await run_scenario(name, agent=AGENT, variant=variant)


def texts(r: RunResult) -> list[str]:
    return [
        b["text"]
        for e in r.of_type("assistant")
        for b in e["message"]["content"]
        if b["type"] == "text"
    ]


@pytest.mark.realcli
def test_installed_cli_is_the_pinned_version() -> None:
    rigenv.require_cli(AGENT)
    assert rigenv.installed_version(AGENT) == rigenv.AGENTS[AGENT].version
    assert rigenv.cli_version(AGENT) == rigenv.AGENTS[AGENT].version


@pytest.mark.realcli
async def test_plain_text() -> None:
    r = await run("text")
    assert r.exit_code == 0, r.describe()
    init, *_ = r.events
    assert init["type"] == "system" and init["subtype"] == "init"
    assert init["claude_code_version"] == rigenv.AGENTS[AGENT].version
    assert texts(r) == ["Hello from the scripted model. Nothing else to do."]
    (result,) = r.of_type("result")
    assert result["subtype"] == "success" and result["is_error"] is False
    assert [(q.method, q.path, q.query) for q in r.requests] == [
        ("POST", "/v1/messages", {"beta": "true"})
    ]
    assert r.requests[0].body["stream"] is True
    assert not r.unexpected and not r.unused_calls


@pytest.mark.realcli
async def test_bash_tool_with_partial_messages() -> None:
    r = await run("tool-bash", "partial")
    assert r.exit_code == 0, r.describe()
    kinds = {e["event"]["type"] for e in r.of_type("stream_event")}
    assert {"message_start", "content_block_delta", "message_stop"} <= kinds
    (tool_use,) = [
        b
        for e in r.of_type("assistant")
        for b in e["message"]["content"]
        if b["type"] == "tool_use"
    ]
    results = [
        b for e in r.of_type("user") for b in e["message"]["content"] if b["type"] == "tool_result"
    ]
    assert [(b["tool_use_id"], b["content"]) for b in results] == [
        (tool_use["id"], "hello from bash")
    ]
    # The second request carries the tool result back to the model.
    last = r.requests[1].body["messages"][-1]["content"]
    assert any(b.get("type") == "tool_result" for b in last)


@pytest.mark.realcli
async def test_interrupt_mid_stream() -> None:
    r = await run("interrupt-stream")
    assert r.exit_code == 1, r.describe()
    (resp,) = r.of_type("control_response")
    assert resp["response"]["request_id"] == "rig-interrupt-1"
    assert resp["response"]["subtype"] == "success"
    (result,) = r.of_type("result")
    assert result["subtype"] == "error_during_execution"
    assert result["terminal_reason"] == "aborted_streaming"
    assert any("[Request interrupted by user]" in json.dumps(e) for e in r.of_type("user"))


@pytest.mark.realcli
async def test_permission_prompt_allow_one_deny_one() -> None:
    rigenv.require_cli(AGENT)
    async with scripted_cli("permission-prompt", agent=AGENT) as cli:
        r = await cli.run()
        assert r.exit_code == 0, r.describe()
        # The allowed Write happened, the denied Bash did not (the workspace lives until the end
        # of the with block).
        assert (cli.cwd / "allowed.txt").read_text() == "allowed\n"
        assert not (cli.cwd / "denied.txt").exists()
    asked = [e["request"]["tool_name"] for e in r.of_type("control_request")]
    assert asked == ["Write", "Bash"]
    (result,) = r.of_type("result")
    assert [d["tool_name"] for d in result["permission_denials"]] == ["Bash"]


@pytest.mark.realcli
async def test_every_scenario_still_runs_as_scripted() -> None:
    """Every scenario against the pinned CLI: the exit status it expects, every scripted call
    used, no unscripted request - so the fixtures can be re-recorded at any time. The runs are
    independent (own server, HOME and workspace), so they run side by side to keep this fast."""
    rigenv.require_cli(AGENT)
    gate = asyncio.Semaphore(6)

    async def check(sc: Scenario) -> str | None:
        async with gate:
            r = await run_scenario(sc)
        bad = problems(sc, r)
        return f"{'; '.join(bad)}\n{r.describe()}" if bad else None

    reports = await asyncio.gather(*(check(sc) for sc in SCENARIOS))
    failed = {sc.name: rep for sc, rep in zip(SCENARIOS, reports, strict=True) if rep}
    assert not failed, "\n\n".join(f"{k}: {v}" for k, v in failed.items())


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
