"""Regenerate the fixtures from the real CLIs.

    python -m tests.support.rig.record [--agent claude-code|codex|gemini] [--jobs N] [SCENARIO ...]

Theory of operation
-------------------
For every scenario file of the agent (or only those named; ``name--variant`` picks one variant)
and every variant of it, run the real CLI against its scripted server (run.py) and write

* ``tests/fixtures/<agent>/<fixture>.jsonl``: the CLI's stdout, byte for byte as printed;
* ``tests/fixtures/<agent>/<fixture>.meta.json``: how it was made - scenario, variant, CLI
  version, argv and stdin lines (the port and temporary paths replaced by ``{base_url}``,
  ``{workspace}``, ``{home}``), exit code or signal, the workspace path the CLI saw, and which
  scripted call answered each model request; for a ``timed`` scenario also when each stdout line
  arrived and each stdin line was written (``stdout_times``, ``stdin_times``: seconds after the
  spawn, to the millisecond), the pace ``bench/synth_agent.py`` replays it at.

Runs use a fixed directory per fixture (``/tmp/rawp-rig/<agent>/<fixture>``) so that the paths in
the recorded stdout stay the same from one recording to the next. Fixtures are never edited by
hand: change the scenario and record again. A run whose exit status differs from the scenario's
``[expect]``, that left scripted calls unused, made requests nobody scripted, or had an action
whose trigger never came is retried once and then reported; the command then exits 1 (the
fixture is still written, so the difference can be looked at).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import json
import sys
from pathlib import Path

from . import env as rigenv
from .run import RunResult, run_scenario
from .scenario import SCENARIO_ROOT, Scenario, all_scenarios

WORK_ROOT = Path("/tmp/rawp-rig")


def problems(sc: Scenario, r: RunResult) -> list[str]:
    """What makes a recording not the one the scenario describes."""
    out = []
    if r.timed_out:
        out.append("timed out")
    if "exit_code" in sc.expect and r.exit_code != sc.expect["exit_code"]:
        out.append(
            f"exit code {r.exit_code} (signal {r.signal}), expected {sc.expect['exit_code']}"
        )
    if "signal" in sc.expect and r.signal != sc.expect["signal"]:
        out.append(f"signal {r.signal}, expected {sc.expect['signal']}")
    if r.unused_calls and not sc.expect.get("unused_calls_ok"):
        out.append(f"scripted calls never requested: {r.unused_calls}")
    if r.unfired_actions:
        out.append(f"actions never triggered: {r.unfired_actions}")
    if r.unexpected:
        out.append(f"unscripted requests: {[(q.path, q.answer) for q in r.unexpected]}")
    return out


def scenario_digest(sc: Scenario) -> str | None:
    return hashlib.sha256(sc.path.read_bytes()).hexdigest() if sc.path else None


def meta_of(sc: Scenario, fixture: str, r: RunResult) -> dict:
    meta = {
        "agent": sc.agent,
        "scenario": sc.name,
        "variant": r.variant,
        "fixture": fixture,
        "description": sc.description,
        # Lets a test notice a scenario edited after its fixture was recorded.
        "scenario_sha256": scenario_digest(sc),
        "cli_package": rigenv.spec(sc.agent).package,
        "cli_version": rigenv.cli_version(sc.agent),
        "argv": r.argv_normalised,
        "stdin": r.stdin_lines,
        "exit_code": r.exit_code,
        "signal": r.signal,
        "timed_out": r.timed_out,
        "workspace": str(r.workspace),
        "home": str(r.home),
        "model_requests": [
            {"path": q.path, "query": q.query, "answered_by": q.answer} for q in r.requests
        ],
        "runner_log": r.log,
        "stdout_lines": len(r.stdout_lines),
        "recorded_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    if sc.run.timed:
        meta["stdout_times"] = [round(t, 3) for t in r.stdout_times]
        meta["stdin_times"] = [round(t, 3) for t in r.stdin_times]
    return meta


async def record_one(sc: Scenario, fixture: str, variant: str | None, out_dir: Path) -> list[str]:
    for attempt in (1, 2):
        r = await run_scenario(sc, variant=variant, workdir=WORK_ROOT / sc.agent / fixture)
        bad = problems(sc, r)
        if not bad:
            break
        print(f"  {fixture}: attempt {attempt}: {'; '.join(bad)}", file=sys.stderr)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{fixture}.jsonl").write_bytes(r.stdout_bytes)
    meta = meta_of(sc, fixture, r)
    (out_dir / f"{fixture}.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    status = f"exit={r.exit_code}" if r.signal is None else f"signal={r.signal}"
    print(f"{fixture}: {status} lines={len(r.stdout_lines)} {r.duration:.1f}s")
    return [f"{fixture}: {b}" for b in bad]


async def record(agent: str, names: list[str], jobs: int) -> int:
    rigenv.cli_version(agent)  # fails early and clearly when the CLI is missing
    wanted = []
    for sc in all_scenarios(agent):
        for fixture, variant in sc.fixture_names():
            if not names or sc.name in names or fixture in names:
                wanted.append((sc, fixture, variant))
    known = {f for sc in all_scenarios(agent) for f, _ in sc.fixture_names()}
    known |= {p.stem for p in (SCENARIO_ROOT / agent).glob("*.toml")}
    missing = [n for n in names if n not in known]
    if missing:
        print(f"unknown scenarios for {agent}: {missing}", file=sys.stderr)
        return 2
    out_dir = rigenv.FIXTURE_ROOT / agent
    if not names:
        # A full recording also drops fixtures whose scenario (or variant) no longer exists.
        keep = {f for _, f, _ in wanted}
        for old in [*out_dir.glob("*.jsonl"), *out_dir.glob("*.meta.json")]:
            if old.name.split(".")[0] not in keep:
                old.unlink()
    gate = asyncio.Semaphore(jobs)

    async def one(sc: Scenario, fixture: str, variant: str | None) -> list[str]:
        async with gate:
            return await record_one(sc, fixture, variant, out_dir)

    results = await asyncio.gather(*(one(*w) for w in wanted))
    bad = [b for r in results for b in r]
    for b in bad:
        print(f"NOT AS SCRIPTED: {b}", file=sys.stderr)
    print(f"{agent}: {len(wanted)} fixtures written to {out_dir}, {len(bad)} problems")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.support.rig.record", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--agent", choices=sorted(rigenv.AGENTS), help="default: every agent with scenarios"
    )
    ap.add_argument("--jobs", type=int, default=4, help="CLI runs at the same time (default 4)")
    ap.add_argument("scenarios", nargs="*", help="scenario or fixture names (default: all)")
    args = ap.parse_args(argv)
    agents = (
        [args.agent]
        if args.agent
        else [a for a in rigenv.AGENTS if any((SCENARIO_ROOT / a).glob("*.toml"))]
    )
    rc = 0
    for agent in agents:
        rc = max(rc, asyncio.run(record(agent, args.scenarios, args.jobs)))
    return rc


if __name__ == "__main__":
    sys.exit(main())
