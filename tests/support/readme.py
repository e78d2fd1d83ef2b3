"""deploy/README.md's shell blocks run as a person types them (tests/image/test_readme_podman.py,
tests/image/test_toolchain.py): the ```sh blocks of one section, exactly as written and in order,
in one login shell that carries none of the project's podman settings (no ``CONTAINERS_CONF``:
only the project's own scripts read .engine/), in a copy of the repository (the blocks write
``deploy/secrets/rawp-token``, which must not replace the checkout's own)."""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.engine import Engine
from tests.support.paths import REPO

README = REPO / "deploy" / "README.md"
# What a checkout needs and git does not carry: left out of the copy, as a fresh clone has none.
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv", ".engine", "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache",
    ".mypy_cache", ".hypothesis", ".agents", "rawp-token",
)  # fmt: skip
MARK = "@@rawp-block"


def blocks(section: str) -> list[str]:
    """The ```sh blocks of ``section`` (a heading line of README), in order."""
    text = README.read_text()
    start = text.index(section + "\n") + len(section) + 1
    end = re.search(r"^#{1,3} ", text[start:], re.MULTILINE)
    body = text[start : start + end.start()] if end else text[start:]
    return re.findall(r"^```sh\n(.*?)^```$", body, re.MULTILINE | re.DOTALL)


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


@dataclass(frozen=True)
class Names:
    """What a section's blocks make under fixed names, as a person's commands do: containers,
    volumes, a compose network, images, and the loopback port they publish. A test refuses to run
    the blocks where any of them is taken (a deployment on the machine is never touched), checks
    that the blocks' own teardown left no container or network and freed the port, and removes
    what the blocks keep on purpose (volumes, images) afterwards."""

    containers: tuple[str, ...]
    volumes: tuple[str, ...]
    network: str
    port: int
    images: tuple[str, ...] = ()

    def refuse_taken(self, engine: Engine) -> None:
        taken = [n for n in self.containers if exists(engine, "container", n)]
        taken += [n for n in self.volumes if exists(engine, "volume", n)]
        taken += [self.network] if exists(engine, "network", self.network) else []
        taken += [f"image {n}" for n in self.images if exists(engine, "image", n)]
        taken += [] if port_free(self.port) else [f"127.0.0.1:{self.port}"]
        assert not taken, f"not running the README's commands over what is already here: {taken}"

    def left(self, engine: Engine) -> list[str]:
        """What of the blocks' still runs or holds the port after their own teardown."""
        left = [n for n in self.containers if exists(engine, "container", n)]
        left += [self.network] if exists(engine, "network", self.network) else []
        return left + ([] if port_free(self.port) else [f"127.0.0.1:{self.port}"])

    def remove(self, engine: Engine) -> None:
        for name in self.containers:
            engine.run("rm", "-f", "-t", "0", name, check=False)
        engine.run("network", "rm", "-f", self.network, check=False)
        for name in self.volumes:
            engine.run("volume", "rm", "-f", name, check=False)
        for name in self.images:
            engine.run("rmi", "-f", name, check=False)


@dataclass
class Typed:
    """What the blocks did: the shell's exit code, each block's stdout by its index (``env``:
    the podman settings the shell carried), and a report for a failed assertion."""

    returncode: int
    out: dict[str, str]
    report: str


def type_blocks(steps: list[str], tmp_path: Path, timeout: float = 900) -> Typed:
    """``steps`` in a login shell in a copy of the repository under ``tmp_path``, stopping at
    the first command that fails (a person would see it and stop too), which fails the test."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo, ignore=NOT_COPIED, symlinks=True)
    # The test's own lines: markers to tell the blocks' output apart, stop at the first failure,
    # and show what podman settings the shell carries.
    script = [f"cd {shlex.quote(str(repo))}", "set -eo pipefail"]
    script += [f"echo; echo {MARK}-env", "env | grep '^CONTAINERS_' || true"]
    for i, step in enumerate(steps):
        script += [f"echo; echo {MARK}-{i}", step]
    proc = subprocess.run(
        ["bash", "--login", "-c", "\n".join(script)],
        env=login_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    parts = re.split(rf"^{MARK}-(\w+)$", proc.stdout, flags=re.MULTILINE)
    out = dict(zip(parts[1::2], parts[2::2], strict=True))
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    # Every block ran, and the shell carried none of the project's podman settings.
    assert proc.returncode == 0, report
    assert out["env"].strip() == "", report
    return Typed(proc.returncode, out, report)
