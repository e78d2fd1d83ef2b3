"""deploy/README.md's podman commands as a person types them: the shell blocks of its section
"Podman on one Debian host", exactly as written and in order, in one login shell that carries none
of the project's podman settings (no ``CONTAINERS_CONF``: only the project's own scripts read
.engine/), in a copy of the repository (the blocks write ``deploy/secrets/rawp-token``, which must
not replace the checkout's own). The image is the one the ``engine`` fixture built from these
sources, so the blocks' ``scripts/build-image`` finds it and builds nothing.

The blocks publish the documented loopback port 8765 and use fixed names (the container
``rawp-gateway``, the compose project ``rawp-gateway``, their volumes): the test refuses to run
where any of them is already taken, so a deployment on the machine is never touched, and removes
what the blocks keep on purpose (the volumes) afterwards.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.engine import Engine
from tests.support.paths import REPO

pytestmark = pytest.mark.image

README = REPO / "deploy" / "README.md"
SECTION = "### Podman on one Debian host"
PORT = 8765  # the documented one: the blocks publish it as written
CONTAINERS = ("rawp-gateway", "rawp-gateway_gateway_1")  # podman run's; podman-compose 1.0's
VOLUMES = (
    "rawp-workspace",
    "rawp-gateway-state",
    "rawp-gateway_workspace",
    "rawp-gateway_gateway-state",
)
NETWORK = "rawp-gateway_default"
# What a checkout needs and git does not carry: left out of the copy, as a fresh clone has none.
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv", ".engine", "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache",
    ".mypy_cache", ".hypothesis", ".agents", "rawp-token",
)  # fmt: skip
MARK = "@@rawp-block"


def blocks() -> list[str]:
    """The ```sh blocks of SECTION, in order."""
    text = README.read_text()
    start = text.index(SECTION + "\n") + len(SECTION) + 1
    end = re.search(r"^#{1,3} ", text[start:], re.MULTILINE)
    section = text[start : start + end.start()] if end else text[start:]
    return re.findall(r"^```sh\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def exists(engine: Engine, kind: str, name: str) -> bool:
    return engine.run(kind, "exists", name, check=False).returncode == 0


def login_env() -> dict[str, str]:
    """What a fresh login starts with; the login shell's profile files add the rest."""
    user = pwd.getpwuid(os.getuid())
    return {
        "HOME": user.pw_dir,
        "USER": user.pw_name,
        "LOGNAME": user.pw_name,
        "SHELL": "/bin/bash",
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
    }


def test_the_readme_podman_blocks_carry_the_containers_security_settings(engine: Engine) -> None:
    """The documented ``podman run`` runs the gateway as the manifests and the compose file do
    (tests.support.engine.SECURITY), its user aside: the image's USER is that uid already."""
    (run,) = [b for b in blocks() if "podman run" in b]
    tokens = shlex.split(run.replace("\\\n", " "))
    wanted = engine.security_args()
    assert wanted[0] == "--user"
    wanted = wanted[2:]
    while wanted:
        if wanted[0] == "--read-only":
            assert "--read-only" in tokens
            wanted = wanted[1:]
            continue
        pair = wanted[:2]
        assert any(tokens[i : i + 2] == pair for i in range(len(tokens))), (pair, tokens)
        wanted = wanted[2:]


def test_the_readme_podman_commands_work_as_written(engine: Engine, tmp_path: Path) -> None:
    """Each block as written; each ``curl`` of /healthz gets ``{"status": "ok"}``, from the
    ``podman run`` container and from podman-compose's; afterwards neither container nor the
    compose network is left and the port is free again."""
    if engine.name != "podman":
        pytest.skip("the blocks are podman's: scripts/build-image picked Docker here")
    steps = blocks()
    assert sum("podman run " in b for b in steps) == 1
    assert sum("podman-compose" in b and " up " in b for b in steps) == 1
    taken = [n for n in CONTAINERS if exists(engine, "container", n)]
    taken += [n for n in VOLUMES if exists(engine, "volume", n)]
    taken += [NETWORK] if exists(engine, "network", NETWORK) else []
    taken += [] if port_free(PORT) else [f"127.0.0.1:{PORT}"]
    assert not taken, f"not running the README's commands over what is already here: {taken}"

    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo, ignore=NOT_COPIED, symlinks=True)
    # The test's own lines: markers to tell the blocks' output apart, stop at the first failure
    # (a person would see it and stop too), and show what podman settings the shell carries.
    script = [f"cd {shlex.quote(str(repo))}", "set -eo pipefail"]
    script += [f"echo; echo {MARK}-env", "env | grep '^CONTAINERS_' || true"]
    for i, step in enumerate(steps):
        script += [f"echo; echo {MARK}-{i}", step]
    try:
        proc = subprocess.run(
            ["bash", "--login", "-c", "\n".join(script)],
            env=login_env(),
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        parts = re.split(rf"^{MARK}-(\w+)$", proc.stdout, flags=re.MULTILINE)
        out = dict(zip(parts[1::2], parts[2::2], strict=True))
        report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
        assert proc.returncode == 0, report
        assert out["env"].strip() == "", report
        healthy = [i for i, step in enumerate(steps) if "/healthz" in step]
        assert len(healthy) == 2, steps
        for i in healthy:
            assert json.loads(out[str(i)].strip().splitlines()[-1]) == {"status": "ok"}, report
        # The README's own teardown left nothing running and freed the port.
        left = [n for n in CONTAINERS if exists(engine, "container", n)]
        left += [NETWORK] if exists(engine, "network", NETWORK) else []
        assert left == [], report
        assert port_free(PORT), report
    finally:
        for name in CONTAINERS:
            engine.run("rm", "-f", "-t", "0", name, check=False)
        engine.run("network", "rm", "-f", NETWORK, check=False)
        for name in VOLUMES:
            engine.run("volume", "rm", "-f", name, check=False)
