"""A long prompt never kills a session: on a profile that puts ``{prompt}`` in argv, a prompt over
MAX_ARGV_PROMPT_BYTES goes to the CLI's stdin (``stdin_prompt_arg``) or, where the profile has no
such way, is refused with a non-fatal session.error before anything starts. Real server, real
processes; the real CLIs are in ``tests/e2e/test_e2e_long_prompts.py``."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from gateway.config import (
    MAX_ARGV_PROMPT_BYTES,
    AgentProfile,
    ConfigError,
    builtin_profiles,
    command_for,
    load_config,
)
from tests.support.gateway_peer import (
    Master,
    make_config,
    of,
    prompt_and_wait,
    start_gateway,
)

LONG = "x" * 140_000 + " MARKER-END"
# Prints how many bytes of prompt it got, and from where.
READER = (
    "import sys; a = sys.argv[1]; t = sys.stdin.read() if a == '-' else a;"
    " print('stdin' if a == '-' else 'argv', len(t.encode()), t[-10:])"
)


def reader() -> AgentProfile:
    return AgentProfile(
        name="reader",
        parser="plain",
        command=(sys.executable, "-c", READER, "{prompt}"),
        single_turn_process=True,
        stdin_prompt_arg="-",
    )


async def run_turn(master: Master, text: str) -> tuple[str, str]:
    """The turn's stop reason and the text the reader echoed."""
    frames = await prompt_and_wait(master, text, timeout=20)
    (end,) = of(frames, "session.turn.end")
    got = "".join(f["payload"]["full_text"] for f in of(frames, "agent.text.done"))
    return end["payload"]["stop_reason"], got.strip()


async def test_a_prompt_too_long_for_argv_goes_to_stdin(tmp_path):
    """140 KB (one argument may hold 128 KiB: exec would fail with E2BIG) reaches the agent whole
    on stdin; a short prompt still goes in argv; the session goes on."""
    client = await start_gateway(make_config(tmp_path, agents={"reader": reader()}))
    try:
        master = await Master.open(client, "reader")
        assert await run_turn(master, LONG) == (
            "end_turn",
            f"stdin {len(LONG)} MARKER-END",
        )
        assert await run_turn(master, "short") == ("end_turn", "argv 5 short")
        assert not [f for f in master.frames if f["type"] in ("agent.error", "session.error")]
    finally:
        await client.close()


async def test_a_prompt_too_long_for_a_profile_without_stdin_is_refused_not_fatal(tmp_path):
    """The built-in plain profile (python -c ... {prompt}) cannot read stdin: the long prompt gets
    session.error PROMPT_TOO_LONG (fatal false) to its sender, no turn starts, no process is
    spawned, and the next prompt is answered."""
    client = await start_gateway(make_config(tmp_path))
    try:
        master = await Master.open(client, "plain")
        await master.send("control.prompt.request", {"prompt_text": LONG})
        error = await master.until("session.error")
        assert error["payload"]["error_code"] == "PROMPT_TOO_LONG"
        assert error["payload"]["fatal"] is False
        assert str(MAX_ARGV_PROMPT_BYTES) in error["payload"]["message"]
        assert "session.turn.start" not in master.types()
        info = await (await client.get(f"/v1/session/{master.session_id}")).json()
        assert info["state"] == "IDLE"
        assert await run_turn(master, "still here") == ("end_turn", "still here")
    finally:
        await client.close()


def test_command_for_puts_the_stdin_argument_where_the_prompt_was():
    profiles = builtin_profiles(claude="claude", codex="codex", gemini="gemini")
    codex, gemini, oneshot = profiles["codex"], profiles["gemini"], profiles["claude-code-oneshot"]
    assert command_for(codex, prompt=LONG, workspace="/w", on_stdin=True)[-2:] == ["--", "-"]
    resumed = command_for(codex, prompt=LONG, workspace="/w", resume_id="t-1", on_stdin=True)
    assert resumed[-3:] == ["--", "t-1", "-"]
    assert not any(
        "{prompt}" in a or "--prompt" in a
        for a in command_for(gemini, prompt=LONG, workspace="/w", on_stdin=True)
    )
    assert command_for(oneshot, prompt=LONG, workspace="/w", on_stdin=True)[-1] == "--"
    assert profiles["plain"].stdin_prompt_arg is None


def test_stdin_prompt_arg_is_a_profile_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[agents.plain]\nstdin_prompt_arg = "-"\n')
    assert load_config(path, environ={}).agents["plain"].stdin_prompt_arg == "-"
    path.write_text("[agents.plain]\nstdin_prompt_arg = 1\n")
    with pytest.raises(ConfigError, match="stdin_prompt_arg"):
        load_config(path, environ={})
    assert replace(reader(), stdin_prompt_arg=None).prompt_in_argv
