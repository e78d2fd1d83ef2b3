"""Benchmark: one permission decision (`gateway.protocol.policy.decide`) over 1,000 rules against
one over a single rule.

Not a test. Run: `.venv/bin/python bench/bench_policy.py [--rules N] [--repeat N]`.

The rules are the worst case for a decision that matches nothing: every rule names the tool asked
for and a glob on its command (with `{workspace}` in half of them), so each is checked to its last
glob and the decision falls through to auto_allow. It prints the µs per decision over 1 rule and
over N rules, their ratio, and whether the N-rule decision is under the 1 ms the permission path
may take (policy evaluation is on the permission path only, never the per-line path).
"""

from __future__ import annotations

import argparse
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


def per_decision_us(rule_set: tuple[Rule, ...], repeat: int) -> float:
    def once() -> None:
        decide(rule_set, tool="Bash", tool_input=COMMAND, agent="claude-code", role="operator",
               workspace=WORKSPACE)  # fmt: skip

    once()  # compiles the {workspace} globs for this workspace, as a session's first ask does
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(repeat):
            once()
        best = min(best, (time.process_time() - started) / repeat)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    one = per_decision_us(rules(1), args.repeat * 100)
    many = per_decision_us(rules(args.rules), args.repeat)
    print(f"1 rule:      {one:9.2f} µs per decision")
    print(f"{args.rules} rules: {many:9.2f} µs per decision ({many / one:.0f}x)")
    print(f"target: under 1000 µs: {'yes' if many < 1000 else 'NO'}")


if __name__ == "__main__":
    main()
