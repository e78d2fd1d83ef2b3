"""The built-in Codex profiles' arguments (``gateway/agent/profiles.py``): Codex's own sandbox is
off in both, so they work wherever bubblewrap is installed and inside the gateway's sandbox, and
codex-acp asks before what it runs (docs/codex-mapping.md, "Codex's sandbox")."""

from __future__ import annotations

from gateway.agent.profiles import builtin_profiles, command_for

SANDBOX_OFF = ["-c", "sandbox_mode=danger-full-access"]


def _config_overrides(argv: list[str]) -> list[str]:
    """The ``-c key=value`` overrides of a Codex argv, before ``--``."""
    head = argv[: argv.index("--")] if "--" in argv else argv
    return [head[i + 1] for i, arg in enumerate(head) if arg == "-c"]


def test_codex_exec_runs_with_codex_sandbox_off_first_and_resumed():
    """``codex exec`` and ``codex exec resume`` both get the override (resume has no --sandbox
    option), once, before ``--``; nothing else about sandbox or approvals: exec never asks, so no
    question is lost (no --dangerously-bypass-approvals-and-sandbox, no -s, no approval_policy)."""
    profile = builtin_profiles(codex="/bin/codex")["codex"]
    first = command_for(profile, prompt="hi", workspace="/w")
    again = command_for(profile, prompt="hi", workspace="/w", resume_id="t-1")
    for argv in (first, again):
        assert _config_overrides(argv) == ["sandbox_mode=danger-full-access"]
        head = argv[: argv.index("--")]
        assert {"-s", "--sandbox", "--full-auto", "-a", "--ask-for-approval"}.isdisjoint(head)
        assert not [a for a in argv if "dangerously" in a or "workspace-write" in a]
    assert first == [
        "/bin/codex",
        "exec",
        "--json",
        "--skip-git-repo-check",
        *SANDBOX_OFF,
        "--",
        "hi",
    ]
    assert again[:3] == ["/bin/codex", "exec", "resume"] and again[-2:] == ["t-1", "hi"]


def test_codex_exec_with_a_long_prompt_on_stdin_keeps_the_override():
    profile = builtin_profiles(codex="/bin/codex")["codex"]
    argv = command_for(profile, prompt="x" * 200_000, workspace="/w", on_stdin=True)
    assert argv == [
        "/bin/codex",
        "exec",
        "--json",
        "--skip-git-repo-check",
        *SANDBOX_OFF,
        "--",
        "-",
    ]


def test_codex_acp_runs_with_codex_sandbox_off_and_asks_before_commands():
    """codex-acp: the sandbox off and ``approval_policy=untrusted``, which asks (through
    session/request_permission) before every command that is not known to be safe and before every
    file change; without its sandbox, ``on-request`` would run every command without asking."""
    profile = builtin_profiles(codex_acp="/bin/codex-acp")["codex-acp"]
    assert profile.parser == "acp" and not profile.prompt_in_argv
    assert list(profile.command) == [
        "/bin/codex-acp",
        *SANDBOX_OFF,
        "-c",
        "approval_policy=untrusted",
    ]
    assert _config_overrides(list(profile.command)) == [
        "sandbox_mode=danger-full-access",
        "approval_policy=untrusted",
    ]
