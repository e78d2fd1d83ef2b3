"""Permission rules and budgets in ``rawp-gateway chat`` against the in-process gateway with the
demo agent: "allowed by policy NAME" and "denied by policy NAME" under the tool's result where a
person would have been asked, "asked by policy NAME" in a question a rule made ask, and a budget
nearly spent, spent and refusing the next prompt (docs/policies.md, docs/budgets.md)."""

from __future__ import annotations

from gateway.protocol.budget import Limits
from gateway.protocol.policy import Glob, Rule
from tests.support.chat import piped_chat
from tests.support.gateway_peer import base_url, demo_config, start_gateway

RULES = (
    Rule("no-secrets", "deny", (Glob("Write"),), (("file_path", Glob("*secret*")),)),
    Rule("ask-notes", "ask", (Glob("Write"),), (("file_path", Glob("*notes*")),)),
    Rule("writes", "allow", (Glob("Write"),)),
)


async def test_chat_says_which_rule_decided_and_when_a_budget_is_spent(tmp_path):
    config = demo_config(tmp_path, policy=RULES, budgets=Limits(session_usd=1.0))
    gw = await start_gateway(config)
    try:
        stdin = "write hello.txt\nwrite secret.txt\nwrite notes.txt\nspend 0.9\nspend 0.2\nhello\n"
        rc, out = await piped_chat(base_url(gw), stdin, auto_answer="deny")
    finally:
        await gw.close()
    assert "  (allowed by policy writes)\n" in out
    assert "  (denied by policy no-secrets)\n" in out
    assert "(asked by policy ask-notes)\nAllow Write: " in out and "? [y/N] n (--no)" in out
    assert (tmp_path / "hello.txt").exists() and not (tmp_path / "secret.txt").exists()
    assert "⚠ budget: $0.90 of this session's budget of $1.00 is spent\n" in out
    assert "✗ budget: this session's budget of $1.00 is spent ($1.10)" in out
    # The refused prompt's own answer.
    assert "✗ BUDGET_EXCEEDED: this session's budget of $1.00 is spent" in out
    assert rc == 0, out
