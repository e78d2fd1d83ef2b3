"""Permission rules (gateway/protocol/policy.py) and the session machine that applies them: tool
calls, events and frames in, decisions and actions out. Nothing runs."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from gateway.protocol import actions as act
from gateway.protocol import machine as sm
from gateway.protocol.policy import MAX_MATCH_CHARS, Glob, Rule, decide
from gateway.protocol.states import ProcessState
from parsers import events as ev
from parsers.claude_code import ClaudeCodeInput, ClaudeCodeParser
from tests.support.acp_rig import Rig, permission

WS = "/srv/ws-1"


def rule(name: str, decision: str, tools=(), match=None, roles=None, agents=None, message=""):
    return Rule(
        name,
        decision,
        tuple(Glob(t) for t in tools),
        tuple((k, Glob(v)) for k, v in (match or {}).items()),
        frozenset(roles) if roles is not None else None,
        frozenset(agents) if agents is not None else None,
        message,
    )


def ask(rules, tool="Bash", agent="claude-code", role="operator", workspace=WS, **tool_input):
    found = decide(
        rules, tool=tool, tool_input=tool_input, agent=agent, role=role, workspace=workspace
    )
    return None if found is None else (found.decision, found.name)


STARTER = (
    rule("reads", "allow", tools=["Read", "Glob", "Grep", "read", "search"]),
    rule(
        "no-force-push",
        "deny",
        tools=["Bash"],
        match={"command": "git push*--force*"},
        message="force pushes need a person",
    ),
    rule("push", "ask", tools=["Bash"], match={"command": "git push*"}),
    rule("rm-outside", "deny", tools=["Bash"], match={"command": "rm *"}),
    rule("writes-outside", "deny", tools=["Write", "Edit"], match={"file_path": "!{workspace}/*"}),
    rule("writes-inside", "allow", tools=["Write", "Edit"]),
)


def test_first_match_wins_and_none_matches():
    assert ask(STARTER, command="git push --force origin main") == ("deny", "no-force-push")
    assert ask(STARTER, command="git push origin main") == ("ask", "push")
    assert ask(STARTER, tool="Read", file_path="/etc/passwd") == ("allow", "reads")
    assert ask(STARTER, command="ls -l") is None  # then auto_allow, then a master
    assert ask((), command="ls") is None
    swapped = (STARTER[2], STARTER[1])
    assert ask(swapped, command="git push --force") == ("ask", "push")


def test_tool_globs():
    rules = (rule("mcp", "deny", tools=["mcp__*"]), rule("any", "ask"))
    assert ask(rules, tool="mcp__github__push") == ("deny", "mcp")
    assert ask(rules, tool="Bash") == ("ask", "any")  # no tools: every tool


def test_workspace_and_negation():
    assert ask(STARTER, tool="Write", file_path=f"{WS}/src/a.py") == ("allow", "writes-inside")
    assert ask(STARTER, tool="Write", file_path="/etc/cron.d/x") == ("deny", "writes-outside")
    # Another session's workspace is another glob; its glob characters are literal.
    odd = "/srv/ws[1]*"
    assert ask(STARTER, tool="Edit", workspace=odd, file_path=f"{odd}/a") == (
        "allow",
        "writes-inside",
    )
    assert ask(STARTER, tool="Edit", workspace=odd, file_path="/srv/ws1x/a") == (
        "deny",
        "writes-outside",
    )
    # A missing field matches neither a glob nor its negation.
    assert ask(STARTER, tool="Write") == ("allow", "writes-inside")


def test_every_match_field_must_hold_and_lists_match_any_value():
    r = (rule("both", "deny", match={"command": "curl *", "description": "*upload*"}),)
    assert ask(r, command="curl x", description="upload it") == ("deny", "both")
    assert ask(r, command="curl x", description="fetch") is None
    paths = (rule("outside", "ask", match={"paths": "!{workspace}/*"}),)
    assert ask(paths, paths=[f"{WS}/a", f"{WS}/b"]) is None
    assert ask(paths, paths=[f"{WS}/a", "/tmp/b"]) == ("ask", "outside")


def test_roles_and_agents():
    r = (
        rule("ops-only", "allow", tools=["Bash"], roles=["admin"]),
        rule("gemini", "deny", agents=["gemini"]),
    )
    assert ask(r, role="admin") == ("allow", "ops-only")
    assert ask(r, role="operator") is None
    assert ask(r, role=None) is None
    assert ask(r, role="operator", agent="gemini") == ("deny", "gemini")


def test_an_acp_call_matches_on_title_kind_and_locations():
    r = (
        rule("edits-outside", "deny", tools=["edit"], match={"locations": "!{workspace}/*"}),
        rule("titled", "allow", tools=["Write *"]),
    )

    def acp(**kw):
        found = decide(r, tool="tool", tool_input={}, agent="gemini", role=None, workspace=WS, **kw)
        return None if found is None else found.name

    assert acp(kind="edit", locations=["/etc/hosts"]) == "edits-outside"
    assert acp(kind="edit", locations=[f"{WS}/a"]) is None
    assert acp(title="Write a.txt") == "titled"
    by_title = (rule("t", "ask", match={"title": "*secret*"}),)
    found = decide(
        by_title,
        tool="x",
        tool_input={},
        agent="a",
        role=None,
        workspace=WS,
        title="read the secret file",
    )
    assert found is not None and found.name == "t"


def test_a_field_too_long_to_judge_never_allows_and_always_denies():
    """A padded command cannot slip past a deny, nor earn an allow."""
    padded = "git push --force " + " " * MAX_MATCH_CHARS
    assert ask(STARTER, command=padded) == ("deny", "no-force-push")
    allow = (rule("ls", "allow", match={"command": "ls*"}),)
    assert ask(allow, command="ls " + "x" * MAX_MATCH_CHARS) is None
    assert ask(allow, command={"not": "text"}) is None


def test_a_backtracking_glob_on_a_long_value_is_bounded():
    """fnmatch's translation makes each * an atomic group: no exponential backtracking. The bound
    here is a generous sanity bound, not a timing target."""
    bad = (rule(f"b{i}", "deny", match={"command": "*a" * 40 + "b"}) for i in range(50))
    rules = tuple(bad)
    started = time.perf_counter()
    assert ask(rules, command="a" * MAX_MATCH_CHARS) is None
    assert time.perf_counter() - started < 10


# --- in the session machine ---------------------------------------------------------------------


def machine(rules, **config) -> sm.SessionMachine:
    m = sm.SessionMachine(
        "s1",
        ClaudeCodeParser(),
        ClaudeCodeInput(),
        sm.SessionConfig(policy=rules, workspace=WS, **config),
    )
    m.owner_role = "operator"
    m.agent_events([ev.ToolCall(call_id="t1", name="Bash", input={"command": "git push -f"})])
    return m


def bash(command: str, tool: str = "Bash") -> ev.PermissionRequest:
    return ev.PermissionRequest(
        request_id="r1", tool_name=tool, input={"command": command}, call_id="t1"
    )


def answers(actions: list[act.Action]) -> list[dict]:
    return [json.loads(a.data) for a in actions if isinstance(a, act.WriteStdin)]


def test_a_deny_answers_the_agent_with_the_rules_message_and_asks_nobody():
    m = machine(STARTER)
    m.process = ProcessState.ALIVE
    actions = m.agent_events([bash("git push --force origin")])
    assert not [a for a in actions if isinstance(a, act.Emit)]
    (answer,) = answers(actions)
    assert answer["response"]["response"] == {
        "behavior": "deny",
        "message": "force pushes need a person",
    }
    assert [a for a in actions if isinstance(a, act.PolicyDecided)] == [
        act.PolicyDecided("no-force-push", "deny", "Bash", {"command": "git push --force origin"})
    ]
    assert m.interactions == {}
    # The call's result records which rule answered.
    frames = [
        a.frame
        for a in m.agent_events([ev.ToolResult(call_id="t1", is_error=True, output="denied")])
        if isinstance(a, act.Emit)
    ]
    (result,) = [f for f in frames if f.TYPE == "tool.invoke.result"]
    assert result.metadata[sm.POLICY_KEY] == "no-force-push"


def test_a_deny_without_a_message_says_which_rule():
    m = machine((rule("no-bash", "deny", tools=["Bash"]),))
    m.process = ProcessState.ALIVE
    (answer,) = answers(m.agent_events([bash("ls")]))
    assert "no-bash" in answer["response"]["response"]["message"]


def test_an_allow_beats_no_auto_allow_and_an_ask_beats_auto_allow():
    m = machine((rule("ls", "allow", match={"command": "ls*"}),))
    m.process = ProcessState.ALIVE
    (answer,) = answers(m.agent_events([bash("ls -l")]))
    assert answer["response"]["response"]["behavior"] == "allow"

    m = machine((rule("careful", "ask", tools=["Bash"]),), auto_allow=frozenset({"Bash"}))
    m.process = ProcessState.ALIVE
    actions = m.agent_events([bash("ls")])
    assert answers(actions) == []
    (asked,) = [
        a.frame
        for a in actions
        if isinstance(a, act.Emit) and a.frame.TYPE == "agent.interaction.request"
    ]
    assert asked.metadata[sm.POLICY_KEY] == "careful"


def test_no_rule_leaves_auto_allow_and_the_masters_as_before():
    m = machine((rule("other", "deny", tools=["Write"]),), auto_allow=frozenset({"Bash"}))
    m.process = ProcessState.ALIVE
    (answer,) = answers(m.agent_events([bash("ls")]))
    assert answer["response"]["response"]["behavior"] == "allow"
    m = machine(())
    frames = [a.frame for a in m.agent_events([bash("ls")]) if isinstance(a, act.Emit)]
    assert next(f.TYPE for f in frames) == "agent.interaction.request"


def test_the_owners_role_and_set_policy():
    rules = (rule("admins-push", "allow", tools=["Bash"], roles=["admin"]),)
    m = machine(rules)
    m.process = ProcessState.ALIVE
    assert answers(m.agent_events([bash("git push")])) == []  # an operator: asked
    m = machine(())
    m.process = ProcessState.ALIVE
    m.set_policy(rules, "admin")
    (answer,) = answers(m.agent_events([bash("git push")]))
    assert answer["response"]["response"]["behavior"] == "allow"


@pytest.mark.parametrize(("decision", "option"), [("allow", "proceed_once"), ("deny", "cancel")])
def test_an_acp_agent_gets_its_own_allow_once_or_reject_once(decision, option):
    rig = Rig()
    rig.machine.config = replace(rig.machine.config, workspace="/srv/project")
    rig.machine.set_policy(
        (rule("edits", decision, tools=["edit"], match={"locations": "{workspace}/*"}),), None
    )
    rig.start()
    rig.prompt()
    rig.agent(permission())
    assert rig.of("agent.interaction.request") == []
    assert rig.last_write() == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {"outcome": {"outcome": "selected", "optionId": option}},
    }
    decided = [a for a in rig.actions if isinstance(a, act.PolicyDecided)]
    assert [(d.rule, d.decision) for d in decided] == [("edits", decision)]


def test_a_question_with_no_process_to_answer_is_not_audited():
    """A transcript read back asks again, and no process runs: nobody is answered, or audited."""
    m = machine(STARTER)
    actions = m.agent_events([bash("git push --force origin")])
    assert not [a for a in actions if isinstance(a, (act.PolicyDecided, act.WriteStdin))]
