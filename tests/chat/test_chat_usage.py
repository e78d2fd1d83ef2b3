"""``chat``'s running totals (``format_totals``, docs/usage.md) against the real server and the
embedded demo agent: after every turn the session's totals are the sum of the turns' own usage,
with the context fill, and a compaction says how full the context is after it."""

from __future__ import annotations

import re

from tests.support.chat import piped_chat
from tests.support.gateway_peer import base_url

TURN = re.compile(r"^— end_turn · ([\d,]+) in / ([\d,]+) out tokens", re.M)
TOTALS = re.compile(r"^  session ([\d,]+) in / ([\d,]+) out · context (\d+)%$", re.M)


def number(text: str) -> int:
    return int(text.replace(",", ""))


async def test_chat_prints_running_totals_context_and_compaction(gw):
    rc, out = await piped_chat(base_url(gw), "hello\nhello again, a longer prompt\n/compact\n")
    assert rc == 0, out
    turns = [(number(i), number(o)) for i, o in TURN.findall(out)]
    totals = [(number(i), number(o)) for i, o, _ in TOTALS.findall(out)]
    assert len(turns) == len(totals) == 3, out
    running = (0, 0)
    for (i, o), total in zip(turns, totals, strict=True):
        running = (running[0] + i, running[1] + o)
        assert total == running
    assert turns[0][0] > 0 and turns[-1] == (0, 0)  # the compaction's own result reports none
    assert "$" not in out  # the demo reports no cost: none is shown
    assert re.search(
        r"^⟲ compacted \(requested\): [\d,]+ → [\d,]+ tokens · context \d+%$", out, re.M
    )
