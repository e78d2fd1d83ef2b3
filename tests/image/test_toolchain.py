"""The team's tools (deploy/README.md, "The team's tools"): the gateway image run with a team's image
mounted at /toolchain and ``[isolation] system_root = "/toolchain"``, the team's image being the one
scripts/build-toolchain makes (Debian trixie, a glibc the gateway's bookworm does not have, with
Go, gcc, make and Claude Code at /opt/team/bin/claude, a path only it has).

Two tests, which the suite's workers run side by side: the README's blocks as a person types them
(tests/support/readme.py), after the first block of its podman section, with the podman image
mount (``podman run`` and podman-compose) and with the derived image; and the real Claude Code in
a container with the same mount and config (on the host's network, to reach the scripted model
server on the host's loopback) building and running a Go and a C program in its workspace with a
Bash call, and saying what it runs on.

The blocks use fixed names (the container ``rawp-gateway-team``, the compose project
``rawp-gateway-team``, their volumes, the image tag ``rawp-gateway-team``) and the loopback port
8766: the test refuses to run where any is taken, and removes what the blocks keep (the volumes,
the derived image) afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from tests.image.test_image import allowed_bash_turn, attach, bash_then_text, claude_env, create
from tests.support import toolchain
from tests.support.engine import WORKSPACE, Engine
from tests.support.paths import REPO
from tests.support.readme import README, Names, blocks, type_blocks
from tests.support.rig.run import make_server

pytestmark = [pytest.mark.image, pytest.mark.toolchain]

SECTION = "### The team's tools"
SETUP = "### Podman on one Debian host"  # its first block: the image, the token
PORT = 8766
DERIVED = "rawp-gateway-team"
NAMES = Names(
    containers=("rawp-gateway-team", "rawp-gateway-team_gateway_1"),  # podman run's, compose's
    volumes=(
        "rawp-team-workspace",
        "rawp-team-state",
        "rawp-gateway-team_workspace",
        "rawp-gateway-team_gateway-state",
    ),
    network="rawp-gateway-team_default",
    port=PORT,
    images=(DERIVED,),
)
SYSTEM_ROOT = "/toolchain"
CONFIG = REPO / "deploy" / "config-toolchain.toml"
TOKEN_PATH = "/run/secrets/rawp-token"

# The Bash call: the team's Go and C compilers on programs written in the workspace, its make; then
# what the agent runs on (its loader, its /etc/os-release, the executables of the shell's
# ancestors up to the sandbox's init) and what it must not see: the gateway's token, the state
# dir's files (only its own HOME there), a neighbour's workspace. One `key: value` a line.
BUILD = """\
printf 'package main\\n\\nimport "fmt"\\n\\nfunc main() { fmt.Println("go built here") }\\n' > hello.go
printf '#include <stdio.h>\\nint main(void) { puts("c built here"); return 0; }\\n' > hello.c
go build -o hello-go hello.go && echo "go: $(./hello-go)"
gcc -o hello-c hello.c && echo "c: $(./hello-c)"
echo "make: $(make --version | head -n 1)"
echo "loader: $(/lib64/ld-linux-x86-64.so.2 --version | head -n 1)"
. /etc/os-release && echo "os: $VERSION_CODENAME"
p=$$; while [ "$p" -gt 1 ]; do echo "exe: $(readlink /proc/$p/exe)"; p=$(cut -d' ' -f4 /proc/$p/stat); done
echo "token: $(cat /run/secrets/rawp-token 2>&1)"
echo "state: $(ls -A /var/lib/rawp-gateway/state/sessions/* 2>&1 | tr '\\n' ' ')"
echo "neighbour: $(ls -A /workspace/team-b 2>&1)"
echo "image claude: $(/usr/local/bin/claude --version 2>&1)"
"""
# deploy/README.md's line for a team's image without Claude Code: the gateway image's own binary,
# shown read-only at its path. The team's is first on the agent's PATH here, so this one is only run
# by the Bash call, to show that it runs in the team's system too.
IMAGE_CLAUDE = 'bind_ro = ["/usr/local/bin/claude"]'
IMAGE_CLAUDE_VERSION = "2.1.328 (Claude Code)"  # deploy/Dockerfile's CLAUDE_CODE_VERSION


def said(output: str) -> dict[str, list[str]]:
    """``key: value`` lines of the Bash call's output, each key's values in order."""
    lines: dict[str, list[str]] = {}
    for line in output.splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            lines.setdefault(key, []).append(value.strip())
    return lines


def type_the_readme(engine: Engine, tmp_path: Path) -> None:
    """The section's blocks as written, after the setup block: each /v1/agents answer says
    every profile's agents see /toolchain, from the mounted image (``podman run``,
    podman-compose) and from the derived one, which kept the gateway image's healthcheck."""
    steps = [blocks(SETUP)[0], *blocks(SECTION)]
    assert "scripts/build-toolchain" in steps[1]
    assert sum(f'type=image,source="$team",destination={SYSTEM_ROOT}' in s for s in steps) == 1
    assert sum(f"type=image,source=$team,destination={SYSTEM_ROOT}" in s for s in steps) == 1
    assert sum("-f deploy/Dockerfile.toolchain" in s for s in steps) == 1
    NAMES.refuse_taken(engine)
    try:
        typed = type_blocks(steps, tmp_path)
        asked = [i for i, step in enumerate(steps) if "/v1/agents" in step]
        assert len(asked) == 3, steps
        for i in asked:
            agents = json.loads(typed.out[str(i)].strip().splitlines()[-1])["agents"]
            assert agents and {a["system"] for a in agents} == {SYSTEM_ROOT}, typed.report
        check = engine.inspect("image", DERIVED).get("Healthcheck") or {}
        assert "/healthz" in " ".join(check.get("Test", [])), typed.report
        assert NAMES.left(engine) == [], typed.report
    finally:
        NAMES.remove(engine)


def podman_team(engine: Engine) -> toolchain.Toolchain:
    """The team's image, in the engine's own storage; skipped where the engine is not podman."""
    if engine.name != "podman":
        pytest.skip("the blocks are podman's: scripts/build-image picked Docker here")
    team = toolchain.built()
    assert team.image and team.env.get("CONTAINERS_STORAGE_CONF") == engine.env.get(
        "CONTAINERS_STORAGE_CONF"
    )
    return team


def test_the_readme_team_tools_commands_work_as_written(engine, tmp_path):
    podman_team(engine)
    type_the_readme(engine, tmp_path)


async def test_claude_code_builds_with_the_teams_tools_from_its_image(engine, token_file, tmp_path):
    team = podman_team(engine)
    calls = bash_then_text(BUILD, "Build with the team's tools", "Built both.")
    server = make_server("claude-code", calls)
    base_url = await server.start()
    mount = ("--mount", f"type=image,source={team.image},destination={SYSTEM_ROOT}")
    assert f"\n{IMAGE_CLAUDE}\n" in README.read_text()
    # The documented config, and the README's line for the image's own Claude Code in
    # [isolation], the file's last table.
    config_file = tmp_path / "config.toml"
    config_file.write_text(CONFIG.read_text() + IMAGE_CLAUDE + "\n")
    config_file.chmod(0o644)
    config = ("-v", f"{config_file}:/etc/rawp-gateway/config.toml:ro")
    try:
        env = claude_env(base_url)
        with (
            engine.volumes() as volumes,
            engine.gateway(volumes, token_file, env=env, extra=(*mount, *config)) as box,
        ):
            # The session's workspace and a neighbour's, with something to find.
            box.exec("mkdir", "-p", f"{WORKSPACE}/team-a", f"{WORKSPACE}/team-b")
            box.exec("sh", "-c", f"echo not yours > {WORKSPACE}/team-b/notes.txt")
            gateway_loader = box.exec("/lib64/ld-linux-x86-64.so.2", "--version").stdout
            async with aiohttp.ClientSession() as http:
                session = await create(http, box, agent="claude-code", workspace_path="team-a")
                assert (session["isolation"], session["system"]) == ("sandbox", SYSTEM_ROOT)
                master = await attach(http, box, session)
                result, end, text = await allowed_bash_turn(master, "Build both.", timeout=180)
                await master.ws.close()
            output = result["payload"]["output"]
            assert result["payload"]["status"] == "success", (output, box.logs())
            assert end["payload"]["stop_reason"] == "end_turn"
            assert text == "Built both."
            lines = said(output)
            assert lines["go"] == ["go built here"], output
            assert lines["c"] == ["c built here"], output
            assert lines["make"][0].startswith("GNU Make "), output
            assert lines["os"] == [toolchain.SUITE], output
            # The team's loader and libc, not the gateway's (bookworm's).
            assert lines["loader"][0] != gateway_loader.splitlines()[0], output
            assert toolchain.TEAM_CLAUDE in lines["exe"], output
            assert box.token not in output and lines["token"][0] != box.token, output
            assert "session.json" not in lines["state"][0], output
            assert "frames.log" not in lines["state"][0], output
            assert "No such file" in lines["neighbour"][0] and "notes" not in output, output
            assert lines["image claude"] == [IMAGE_CLAUDE_VERSION], output
            # What it built is in the session's workspace, as the gateway's container sees it.
            built = box.exec("ls", f"{WORKSPACE}/team-a").stdout.split()
            assert {"hello-go", "hello-c"} <= set(built), built
        paths = [r.path for r in server.requests]
        assert sum(p.startswith("/v1/messages") for p in paths) == 2, paths
    finally:
        await server.close()
