"""``[[policy.rules]]`` (gateway/config/policy.py): what is accepted, every error naming the file
and the rule, and hostile rule files refused in bounded time and memory."""

from __future__ import annotations

import resource
import time

import pytest

from gateway.config import ConfigError, load_config
from gateway.config.policy import MAX_FILE_BYTES, MAX_GLOB_CHARS, MAX_RULES, read_policy

# Generous sanity bounds for a hostile file (seconds, bytes): not timing targets.
SANE_SECONDS = 30.0
SANE_BYTES = 1 << 30

GOOD = """
[[policy.rules]]
name = "no-force-push"
tools = ["Bash"]
match = { command = "git push*--force*" }
decision = "deny"
roles = ["operator"]
agents = ["claude-code"]
message = "force pushes need a person"

[[policy.rules]]
name = "outside"
tools = ["Write", "Edit"]
match = { file_path = "!{workspace}/*" }
decision = "ask"
"""


def load(tmp_path, text: str):
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return path, load_config(path, {"workspace_root": str(tmp_path)}, environ={})


def refused(tmp_path, text: str) -> str:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text)
    return str(err.value)


def test_rules_are_read_in_order(tmp_path):
    path, config = load(tmp_path, GOOD)
    first, second = config.policy.rules
    assert (first.name, first.decision, first.message) == (
        "no-force-push",
        "deny",
        "force pushes need a person",
    )
    assert [g.text for g in first.tools] == ["Bash"]
    assert [(f, g.text) for f, g in first.match] == [("command", "git push*--force*")]
    assert first.roles == frozenset({"operator"}) and first.agents == frozenset({"claude-code"})
    assert second.roles is None and second.agents is None and second.match[0][1].negate
    assert config.config_file == path
    assert [r.name for r in read_policy(path)] == ["no-force-push", "outside"]


def test_no_rules(tmp_path):
    assert load(tmp_path, "")[1].policy.rules == ()


@pytest.mark.parametrize(
    ("rule", "says"),
    [
        ('name = "a"\ndecision = "maybe"', 'decision must be one of "allow", "deny", "ask"'),
        ('name = "a"', "decision is required"),
        ('decision = "deny"', "name is required"),
        ('name = "a b"\ndecision = "deny"', "name must be"),
        ('name = "a"\ndecision = "deny"\ntools = "Bash"', "tools must be a list"),
        ('name = "a"\ndecision = "deny"\ntools = [1]', "a glob must be non-empty text"),
        ('name = "a"\ndecision = "deny"\ntools = ["!"]', "a glob must be non-empty text"),
        ('name = "a"\ndecision = "deny"\nmatch = { command = 3 }', "match.command"),
        ('name = "a"\ndecision = "deny"\nmatch = "x"', "match must be a table"),
        ('name = "a"\ndecision = "deny"\nroles = "admin"', "roles must be a list"),
        ('name = "a"\ndecision = "deny"\nagents = [""]', "agents must be names"),
        ('name = "a"\ndecision = "deny"\nmessage = 3', "message must be text"),
    ],
)
def test_a_bad_rule_names_the_file_and_the_rule(tmp_path, rule, says):
    message = refused(tmp_path, f"[[policy.rules]]\n{rule}\n")
    assert "gateway.toml" in message and "[[policy.rules]] 1" in message
    assert says in message


def test_an_unknown_field_is_refused_with_its_line(tmp_path):
    message = refused(tmp_path, '[[policy.rules]]\nname = "a"\ndecision = "deny"\ntool = ["x"]\n')
    assert "gateway.toml:4" in message and "[[policy.rules]] 1" in message
    assert "tool" in message and "did you mean tools" in message
    assert "unknown key [policy] x" in refused(tmp_path, "[policy]\nx = 1\n")


def test_a_duplicate_name_is_refused(tmp_path):
    one = '[[policy.rules]]\nname = "same"\ndecision = "allow"\n'
    message = refused(tmp_path, one + one)
    assert "[[policy.rules]] 2 (same)" in message and "earlier rule" in message


def test_bounds(tmp_path):
    long_glob = "*" * (MAX_GLOB_CHARS + 1)
    message = refused(
        tmp_path, f'[[policy.rules]]\nname = "g"\ndecision = "deny"\ntools = ["{long_glob}"]\n'
    )
    assert "(g): tools" in message and f"at most {MAX_GLOB_CHARS} characters" in message
    fields = ", ".join(f"f{i} = '*'" for i in range(17))
    message = refused(
        tmp_path, f'[[policy.rules]]\nname = "m"\ndecision = "deny"\nmatch = {{ {fields} }}\n'
    )
    assert "match may name at most 16 fields" in message


def refused_in_bounds(tmp_path, text: str, says: str) -> None:
    """The rule file ``text`` is refused with an error matching ``says``, read at start and again
    on SIGHUP, in bounded time and memory: the process's peak size grows by less than the bound
    (tracemalloc would make the parse itself ten times slower)."""
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=says):
        read_policy(path)
    with pytest.raises(ConfigError, match=says):
        load_config(path, {"workspace_root": str(tmp_path)}, environ={})
    took = time.perf_counter() - started
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert took < SANE_SECONDS and grew < SANE_BYTES


def test_a_hostile_file_of_100000_rules_is_refused_clearly(tmp_path):
    text = "".join(f'[[policy.rules]]\nname = "r{i}"\ndecision = "deny"\n' for i in range(100_000))
    refused_in_bounds(tmp_path, text, f"more than {MAX_RULES} rules; at most {MAX_RULES}")


def test_a_deeply_nested_file_is_refused_clearly(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    text = f'[[policy.rules]]\nname = "n"\ndecision = "deny"\nroles = {deep}\n'
    refused_in_bounds(tmp_path, text, "nested too deeply")


def test_huge_globs_in_many_rules_are_refused_before_any_is_compiled(tmp_path):
    glob = "[a-" * 20_000
    text = "".join(
        f'[[policy.rules]]\nname = "r{i}"\ndecision = "deny"\ntools = ["{glob}"]\n'
        for i in range(50)
    )
    refused_in_bounds(tmp_path, text, r"\[\[policy.rules\]\] 1 \(r0\): tools")


def test_a_huge_file_is_refused_before_it_is_parsed(tmp_path):
    """A config file over 16 MiB (a rule set padded with comments) is refused from its size."""
    rule = '[[policy.rules]]\nname = "r"\ndecision = "deny"\n'
    text = rule + ("# padding " + "x" * 1000 + "\n") * (17 * 1024)
    refused_in_bounds(tmp_path, text, f"larger than {MAX_FILE_BYTES} bytes")
