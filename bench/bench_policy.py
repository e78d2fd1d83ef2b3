"""Benchmark: one permission decision (`gateway.protocol.policy.decide`) over 1,000 rules against
one over a single rule.

Not a test. Run: `.venv/bin/python bench/bench_policy.py [--rules N] [--repeat N]`.

The rules are the worst case for a decision that matches nothing: every rule names the tool asked
for and a glob on its command (with `{workspace}` in half of them), so each is checked to its last
glob and the decision falls through to auto_allow. The command is a list of two simple commands, so
each glob is matched against both (the line is parsed once per decision at most: its reading is
kept). It prints the µs per decision over 1 rule and over N rules (the best and the median of 7
runs), their ratio, and whether the median N-rule decision is under the 1 ms the permission path
may take (policy evaluation is on the permission path only, never the per-line path).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.protocol.policy import Glob, Rule, decide

WORKSPACE = "/srv/workspaces/team-a/project"
COMMAND = {"command": "git status --short && git log --oneline -20 " + "x" * 200}


def rules(n: int) -> tuple[Rule, ...]:
    out = []
    for i in range(n):
        glob = f"{{workspace}}/rule{i}/*" if i % 2 else f"git push*--force-{i}*"
        out.append(
            Rule(f"r{i}", "deny", (Glob("Bash"), Glob(f"Tool{i}")), (("command", Glob(glob)),))
        )
    return tuple(out)


def per_decision_us(rule_set: tuple[Rule, ...], repeat: int) -> tuple[float, float]:
    def once() -> None:
        decide(rule_set, tool="Bash", tool_input=COMMAND, agent="claude-code", role="operator",
               workspace=WORKSPACE)  # fmt: skip

    once()  # compiles the {workspace} globs for this workspace, as a session's first ask does
    runs = []
    for _ in range(7):
        started = time.process_time()
        for _ in range(repeat):
            once()
        runs.append((time.process_time() - started) / repeat * 1e6)
    return min(runs), statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    one, one_median = per_decision_us(rules(1), args.repeat * 100)
    many, median = per_decision_us(rules(args.rules), args.repeat)
    print(f"1 rule:      {one:9.2f} µs per decision (median {one_median:.2f})")
    print(
        f"{args.rules} rules: {many:9.2f} µs per decision (median {median:.2f}, {many / one:.0f}x)"
    )
    print(f"target: median under 1000 µs: {'yes' if median < 1000 else 'NO'}")


if __name__ == "__main__":
    main()
