"""A team's system as the agent's (``[isolation] system_root``, docs/isolation.md#a-teams-system),
made by bubblewrap for real: scripts/build-toolchain's Debian trixie (glibc 2.41) beside this
machine's bookworm (2.36). What the agent sees and runs there, the user it is, the limits, and
``serve`` refusing what cannot work, in one line. The real CLIs in it: tests/e2e/ (the
``team-system`` runs, and test_e2e_system_root.py for ``serve`` on the host)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.agent.sandbox import Isolation, SpawnSandbox
from tests.support import toolchain
from tests.support.gateway_peer import make_config, start_gateway
from tests.support.inside import codename
from tests.support.servers import CLI

pytestmark = [pytest.mark.sandbox, pytest.mark.toolchain]


def team() -> str:
    return str(toolchain.built(dir_only=True).root)


async def run_inside(settings: Isolation, tmp: Path, script: str) -> str:
    """``sh -c script`` as an agent's command in the sandbox: its stdout (it must succeed)."""
    work, home = tmp / "work", tmp / "home"
    work.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    box = SpawnSandbox(settings, workspace=str(work), home=str(home), hidden=())
    argv, env = await box.wrap(["sh", "-c", script], dict(os.environ), str(work))
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_the_agent_sees_the_teams_system_with_the_gateways_network_files(tmp_path):
    root = team()
    out = await run_inside(
        Isolation(mode="sandbox", system_root=root),
        tmp_path,
        "grep VERSION_CODENAME= /etc/os-release; ldd --version | head -n 1; echo $PATH; "
        "cat /etc/hosts; echo ---; grep -E '^Max (processes|data size)' /proc/self/limits; "
        "test -e /etc/rawp-gateway || echo no-gateway-etc; make --version | head -n 1",
    )
    assert out.splitlines()[0] == codename(root) == "VERSION_CODENAME=trixie"
    assert "GLIBC 2.41" in out.splitlines()[1], out
    assert out.splitlines()[2] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    # The image has no /etc/hosts: the gateway container's is shown, as the runtime made it.
    assert out.split("---")[0].split("\n", 3)[3] == Path("/etc/hosts").read_text()
    limits = out.split("---\n")[1].splitlines()
    assert limits[0].split()[-3:-1] == [str(4096 << 20)] * 2, limits
    assert limits[1].split()[-3:-1] == ["512", "512"], limits
    assert "no-gateway-etc" in out and "GNU Make" in out


async def test_the_gateways_node_shown_read_only_runs_on_the_teams_loader_and_libc(tmp_path):
    """The team's system has no Node.js: ``bind_ro`` of this machine's ``node`` shows it at its
    own path in the team's /usr/bin (rebuilt around it), where the agent's PATH finds it, and it
    runs on the team's C library."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node on PATH")
    root = team()
    out = await run_inside(
        Isolation(mode="sandbox", system_root=root, bind_ro=(node,)),
        tmp_path,
        "command -v node; node -e \"process.stdout.write(require('fs').readFileSync("
        "'/proc/self/maps','utf8').split('\\n').find(l => l.includes('/libc.so')))\"",
    )
    where, mapped = out.splitlines()
    assert where == node
    inode, path = mapped.split()[4:6]
    assert int(inode) == os.stat(root + path).st_ino != os.stat(path).st_ino


async def test_a_uid_the_teams_passwd_does_not_know_gets_a_name_and_a_home(tmp_path):
    """The image's gateway runs as uid 10001, which a team's image never heard of: the agent is
    still a named user with its HOME (``id -un``, ``$USER``, passwd). Here the gateway is run as
    uid 4242 (a user namespace of its own), which trixie's passwd does not have."""
    root = team()
    (tmp_path / "home").mkdir()
    code = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from gateway.agent.sandbox import Isolation\n"
        "from tests.agent.test_sandbox_system import run_inside\n"
        f"print(asyncio.run(run_inside(Isolation(mode='sandbox', system_root={root!r}), "
        f"Path({str(tmp_path)!r}), 'id -un; id -gn; echo $USER; getent passwd 4242')))\n"
    )
    proc = subprocess.run(
        ["unshare", "--user", "--map-user=4242", "--map-group=4242", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    name, group, user, entry = proc.stdout.split()
    assert name == group == user == "rawp-agent"
    assert entry == f"rawp-agent:x:4242:4242::{tmp_path / 'home'}:/bin/sh"
    assert "4242" not in (Path(root) / "etc/passwd").read_text()  # the image is unchanged


async def test_a_command_the_teams_system_lacks_fails_the_start_in_one_clear_message(tmp_path):
    """The demo runs the gateway's own Python, which a team's system does not have (and is not
    shown there): 502 AGENT_START_FAILED before anything is made, saying where it was looked for."""
    isolation = Isolation(mode="sandbox", system_root=team())
    client = await start_gateway(make_config(tmp_path, isolation=isolation))
    try:
        resp = await client.post("/v1/session", json={"agent": "demo"})
        body = await resp.json()
        assert resp.status == 502 and body["error_code"] == "AGENT_START_FAILED", body
        assert f"is not in system_root {isolation.system_root}'s system" in body["message"]
        agents = await (await client.get("/v1/agents")).json()
        assert {a["system"] for a in agents["agents"]} == {isolation.system_root}
    finally:
        await client.close()


def serve_refusal(tmp_path: Path, isolation: str) -> str:
    config = tmp_path / "gateway.toml"
    config.write_text("[isolation]\n" + isolation)
    proc = subprocess.run(
        [*CLI, "serve", "--config", str(config), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def _refusal_case(tmp_path: Path, case: str) -> tuple[str, str]:
    """``[isolation]`` lines that ``serve`` refuses, and the words its one line must hold."""
    empty = tmp_path / "empty"
    empty.mkdir()
    if case == "no /usr":
        return (
            f'mode = "sandbox"\nsystem_root = "{empty}"\n',
            f"system_root {empty} has no /usr: it must hold a system (a team's "
            "image mounted there, or an unpacked one)",
        )
    if case == "no prlimit":
        (empty / "usr" / "bin").mkdir(parents=True)
        return (
            f'mode = "sandbox"\nsystem_root = "{empty}"\n',
            f"system_root {empty} has no prlimit (util-linux)",
        )
    if case == "no sandbox":
        return (
            f'system_root = "{team()}"\n',
            'gateway.toml:2: [isolation] system_root needs mode = "sandbox"',
        )
    if case == "path alone":
        return (
            'mode = "sandbox"\npath = "/usr/bin"\n',
            "path is the agent's PATH in system_root's system: set system_root",
        )
    assert case == "shows the config"
    return (
        f'mode = "sandbox"\nsystem_root = "{tmp_path}"\n',
        f"system_root: {tmp_path} would show {tmp_path / 'gateway.toml'}",
    )


# One serve a case, so that the suite's workers start them side by side.
@pytest.mark.parametrize(
    "case", ["no /usr", "no prlimit", "no sandbox", "path alone", "shows the config"]
)
def test_serve_refuses_a_system_root_without_usr_or_prlimit_or_the_sandbox(tmp_path, case):
    isolation, words = _refusal_case(tmp_path, case)
    line = serve_refusal(tmp_path, isolation)
    assert words in line, line
