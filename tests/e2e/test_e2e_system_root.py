"""The host path of ``[isolation] system_root`` (docs/isolation.md#a-teams-system): ``rawp-gateway
serve`` on this machine (Debian bookworm's glibc) with ``system_root`` pointing at a team's
unpacked system (scripts/build-toolchain: Debian trixie with Go, gcc, make and the pinned Claude
Code at /opt/team/bin/claude, a path only it has). The real Claude Code, against the scripted
Messages API, runs a Bash call that builds and runs a Go and a C program in its workspace and
prints ``make --version``: the ``claude`` the profile names is the team's, found on the agent's
PATH there, it and what it runs see the team's /etc/os-release and run on the team's glibc, and
the sandbox's isolation holds (no token, no state dir, no configuration, no other workspace)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import aiohttp
import pytest

from tests.support import toolchain
from tests.support.gateway_peer import SUBPROTOCOL, Master, of, prompt_and_wait
from tests.support.rig.env import require_cli
from tests.support.rig.run import scripted_cli
from tests.support.rig.scenario import parse_scenario
from tests.support.serve_process import serve

pytestmark = [pytest.mark.realcli, pytest.mark.sandbox, pytest.mark.toolchain]

TEAM_PATH = f"{toolchain.TEAM_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GO = 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("hello from go") }\n'
C = '#include <stdio.h>\n\nint main(void) { puts("hello from c"); return 0; }\n'


def build_and_look(token: Path, state: Path, config: Path, other: Path) -> str:
    """The Bash call: the team's tools build and run both programs in the workspace; what the
    agent's system is (its os-release, its C library, the programs running in the sandbox);
    then each of the gateway's files it must not read, each failing."""
    return " ; ".join(
        [
            "go build -o hello-go hello.go && ./hello-go",
            "gcc -o hello-c hello.c && ./hello-c",
            "make --version | head -n 1",
            "grep ^VERSION_CODENAME= /etc/os-release",
            "ldd --version | head -n 1",
            "for p in /proc/[0-9]*; do readlink $p/exe; done | sort -u",
            "id -un",
            f"cat {token} || echo no-token",
            # Of the state dir only the way to its own HOME shows (empty directories).
            f"find {state} -type f -not -path '*/home/*' | grep -q . || echo no-state-files",
            f"cat {config} || echo no-config",
            f"ls {other} || echo no-other-workspace",
        ]
    )


async def test_claude_code_builds_go_and_c_with_the_teams_tools_in_its_system(tmp_path):
    team = toolchain.built(dir_only=True)
    assert (team.root / toolchain.TEAM_CLAUDE.lstrip("/")).is_file()
    require_cli("claude-code")  # the rig's scripted server speaks the pinned version's API
    state, token = tmp_path / "state", tmp_path / "token"
    secret = "t0k3n-the-agent-must-not-read"
    token.write_text(secret + "\n")
    token.chmod(0o600)
    root = tmp_path / "work"
    config = tmp_path / "gateway.toml"
    other = root / "other"
    other.mkdir(parents=True)
    (other / "secret.txt").write_text("another session's file\n")
    scenario = parse_scenario(
        {
            "run": {"files": {"hello.go": GO, "hello.c": C}},
            "calls": [
                {
                    "content": [
                        {
                            "type": "tool_use",
                            "name": "Bash",
                            "input": {
                                "command": build_and_look(token, state, config, other),
                                "description": "Build and look around",
                                "timeout": 600000,
                            },
                        }
                    ]
                },
                {"match": {"tool_result": True}, "content": [{"type": "text", "text": "Built."}]},
            ],
        },
        name="e2e-system-root",
        agent="claude-code",
    )
    async with scripted_cli(scenario, agent="claude-code") as cli:
        workspace = root / "alice"
        os.rename(cli.cwd, workspace)
        env = {k: v for k, v in cli.env.items() if k != "PATH"}  # the team's PATH is `path`
        config.write_text(
            "[server]\n"
            f"workspace_root = {json.dumps(str(root))}\n"
            f"state_dir = {json.dumps(str(state))}\n"
            f"token_file = {json.dumps(str(token))}\n"
            "[isolation]\n"
            'mode = "sandbox"\n'
            f"system_root = {json.dumps(str(team.root))}\n"
            f"path = {json.dumps(TEAM_PATH)}\n"
            # The built-in profile's command, `claude`: looked up on `path` in the team's system.
            "[agents.claude-code]\n"
            'auto_allow = ["Bash"]\n'
            f"env = {{ {', '.join(f'{k} = {json.dumps(v)}' for k, v in env.items())} }}\n"
        )
        async with (
            serve("--config", str(config)) as (_, url),
            aiohttp.ClientSession(headers={"Authorization": f"Bearer {secret}"}) as http,
        ):
            async with http.get(url + "/v1/agents") as resp:
                agents = {a["name"]: a for a in (await resp.json())["agents"]}
            assert agents["claude-code"]["system"] == str(team.root)
            assert agents["claude-code"]["isolation"] == "sandbox"
            async with http.post(
                url + "/v1/session",
                json={"agent": "claude-code", "workspace_path": str(workspace)},
            ) as resp:
                assert resp.status == 201, await resp.text()
                session = await resp.json()
            assert session["system"] == str(team.root)
            ws = await http.ws_connect(url + session["ws_path"], protocols=(SUBPROTOCOL,))
            master = Master(ws, session["session_id"])
            frames = await prompt_and_wait(master, "Build it.", timeout=600)
            await master.ws.close()
        (result,) = of(frames, "tool.invoke.result")
        out = result["payload"]["output"]
        out = out if isinstance(out, str) else json.dumps(out)
        assert result["payload"]["status"] == "success", out
        assert "hello from go" in out and "hello from c" in out, out
        assert "GNU Make" in out, out
        assert "VERSION_CODENAME=trixie" in out, out  # the team's, not this machine's bookworm
        # The team's glibc (trixie's 2.41), not the gateway's: its loader ran every program.
        assert "GLIBC 2.41" in out and "GLIBC 2.36" not in out, out
        assert toolchain.TEAM_CLAUDE in out.split(), out  # the agent is the team's binary
        assert str(require_cli("claude-code")) not in out, out
        for refused in ("no-token", "no-state-files", "no-config", "no-other-workspace"):
            assert refused in out, out
        assert secret not in out and "another session's file" not in out, out
        assert (workspace / "hello-go").is_file() and (workspace / "hello-c").is_file()
        # ... which does hold the gateway's files of the session.
        kept = [p for p in state.rglob("*") if p.is_file() and "home" not in p.parts]
        assert kept
