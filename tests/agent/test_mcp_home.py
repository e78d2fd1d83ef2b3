"""Gemini's settings file in the session's home (gateway/agent/mcp_home.py): filled first from
the user's ``~/.gemini`` files, its other settings kept, ``mcpServers`` the session's, mode 0600,
never written through a link the agent left."""

from __future__ import annotations

import json
import os
import stat

import pytest

from gateway.agent.mcp_home import MAX_SEED_FILE_BYTES, MAX_SEED_FILES, write_gemini_settings

SERVERS = {"docs": {"command": "docs-mcp", "env": {"TOKEN": "${RAWP_MCP_SECRET_1}"}}}


def settings_of(home) -> dict:
    return json.loads((home / ".gemini" / "settings.json").read_text())


def test_a_new_home_gets_the_users_files_and_the_sessions_servers(tmp_path):
    user, home = tmp_path / "user", tmp_path / "home"
    (user / ".gemini" / "tmp").mkdir(parents=True)
    (user / ".gemini" / "tmp" / "chat.json").write_text("{}")  # conversations stay the user's
    mine = {"security": {"auth": {"selectedType": "gemini-api-key"}}, "mcpServers": {"own": {}}}
    (user / ".gemini" / "settings.json").write_text(json.dumps(mine))
    (user / ".gemini" / "oauth_creds.json").write_text('{"token": "t"}')
    home.mkdir()
    write_gemini_settings(str(home), SERVERS, str(user))
    assert settings_of(home) == {"security": mine["security"], "mcpServers": SERVERS}
    assert (home / ".gemini" / "oauth_creds.json").read_text() == '{"token": "t"}'
    assert not (home / ".gemini" / "tmp").exists()
    assert stat.S_IMODE((home / ".gemini" / "settings.json").stat().st_mode) == 0o600
    # The user's own file is untouched.
    assert json.loads((user / ".gemini" / "settings.json").read_text()) == mine


def test_a_later_start_keeps_what_the_home_has_and_replaces_the_servers(tmp_path):
    home = tmp_path / "home"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text('{"general": {"x": 1}, "mcpServers": {}}')
    write_gemini_settings(str(home), SERVERS, seed=None)
    assert settings_of(home) == {"general": {"x": 1}, "mcpServers": SERVERS}
    write_gemini_settings(str(home), {}, seed=None)
    assert settings_of(home)["mcpServers"] == {}


def test_a_link_the_agent_left_is_never_written_through(tmp_path):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, home / ".gemini")
    with pytest.raises(OSError):
        write_gemini_settings(str(home), SERVERS, seed=None)
    assert list(elsewhere.iterdir()) == []
    # A link in place of the file itself is replaced, not followed.
    os.unlink(home / ".gemini")
    (home / ".gemini").mkdir()
    target = elsewhere / "target.json"
    target.write_text("keep")
    os.symlink(target, home / ".gemini" / "settings.json")
    write_gemini_settings(str(home), SERVERS, seed=None)
    assert target.read_text() == "keep"
    assert settings_of(home)["mcpServers"] == SERVERS


def test_the_users_files_are_copied_within_their_bounds(tmp_path):
    """More files than MAX_SEED_FILES, and one larger than MAX_SEED_FILE_BYTES, in the user's
    ~/.gemini: at most MAX_SEED_FILES are copied, never the oversized one, and the session's
    servers are written all the same."""
    user, home = tmp_path / "user", tmp_path / "home"
    (user / ".gemini").mkdir(parents=True)
    for i in range(MAX_SEED_FILES + 5):
        (user / ".gemini" / f"f{i:03}.json").write_text("{}")
    (user / ".gemini" / "huge.json").write_bytes(b" " * (MAX_SEED_FILE_BYTES + 1))
    home.mkdir()
    write_gemini_settings(str(home), SERVERS, str(user))
    copied = {p.name for p in (home / ".gemini").iterdir()} - {"settings.json"}
    assert len(copied) <= MAX_SEED_FILES and "huge.json" not in copied
    assert settings_of(home) == {"mcpServers": SERVERS}
