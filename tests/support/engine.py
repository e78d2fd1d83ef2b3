"""The sidecar image run by a real container engine, for the image tests and bench/bench_image.py.

``built()`` runs ``scripts/build-image`` (which picks Docker or podman, writes podman's settings for
this machine, and builds only when no image of the same sources exists; its file lock makes
pytest-xdist workers wait for one build) and returns an ``Engine``: its name, the image's tag and
the environment every engine command needs.

``SECURITY`` is the one statement of the security settings the gateway's container runs with:
the tests run the image with them (``Engine.security_args``), and tests/repo/test_deploy.py checks
that the StatefulSet and the compose file say the same.

``Engine.gateway(...)`` runs one gateway container as deploy/ runs it (non-root, read-only root
file system, ``/tmp`` a tmpfs, all capabilities dropped, the two volumes, the token as a read-only
file) but on the host's network, listening on 127.0.0.1 at a free port: the container then reaches
the scripted model server on the host's loopback, and nothing listens beyond loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.paths import REPO
from tests.support.servers import free_port

UID = 10001  # deploy/Dockerfile's USER, the manifests' runAsUser
WORKSPACE = "/workspace"
STATE = "/var/lib/rawp-gateway"  # the state volume: state_dir and the agent's home
TOKEN_PATH = "/run/secrets/rawp-token"  # deploy/config.toml's token_file

# How the gateway's container runs, everywhere: stated here once. The image runs its agents in the
# bubblewrap sandbox ([isolation] mode = "sandbox" in deploy/config.toml), which makes a user
# namespace, mounts a fresh /proc and sets a hostname inside the container; the last three settings
# allow that and are what the engines and Kubernetes take away by default (docs/isolation.md, "In a
# container"): `unmasked_proc` (no paths of /proc covered: the kernel refuses a new proc mount
# otherwise), `seccomp` and `apparmor` "unconfined" (the runtimes' default profiles refuse mount,
# sethostname and namespaces to a process without CAP_SYS_ADMIN).
SECURITY: dict[str, Any] = {
    "run_as_user": UID,
    "run_as_group": UID,
    "read_only_root": True,
    "drop_capabilities": ["ALL"],
    "no_new_privileges": True,
    "unmasked_proc": True,
    "seccomp": "unconfined",
    "apparmor": "unconfined",
}
# What is left of it without the three the sandbox needs: the engines' defaults.
CONFINED: dict[str, Any] = {
    **SECURITY,
    "unmasked_proc": False,
    "seccomp": None,
    "apparmor": None,
}


@dataclass(frozen=True)
class Engine:
    name: str  # "docker" or "podman"
    image: str
    env: dict[str, str] = field(repr=False)

    def cmd(self, *args: str | Path) -> list[str]:
        return [self.name, *(str(a) for a in args)]

    def run(
        self, *args: str | Path, check: bool = True, timeout: float = 120, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.cmd(*args),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **kw,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{self.cmd(*args)} exited {proc.returncode}: {proc.stderr}")
        return proc

    def inspect(self, kind: str, name: str) -> dict[str, Any]:
        out = self.run(kind, "inspect", name).stdout
        (obj,) = json.loads(out)
        return obj

    def security_args(self, security: dict[str, Any] = SECURITY) -> list[str]:
        """``security`` as ``run`` arguments."""
        args = ["--user", f"{security['run_as_user']}:{security['run_as_group']}"]
        if security["read_only_root"]:
            args += ["--read-only", "--tmpfs", "/tmp"]
        for cap in security["drop_capabilities"]:
            args += ["--cap-drop", cap]
        if security["no_new_privileges"]:
            args += ["--security-opt", "no-new-privileges"]
        # Docker's spelling; podman takes it too (its own is unmask=ALL).
        if security["unmasked_proc"]:
            args += ["--security-opt", "systempaths=unconfined"]
        for opt in ("seccomp", "apparmor"):
            if security[opt]:
                args += ["--security-opt", f"{opt}={security[opt]}"]
        return args

    @contextlib.contextmanager
    def volumes(self) -> Iterator[tuple[str, str]]:
        """Two new named volumes, the workspace and the state volume; removed afterwards."""
        names = (f"rawp-test-ws-{uuid.uuid4().hex[:8]}", f"rawp-test-state-{uuid.uuid4().hex[:8]}")
        for name in names:
            self.run("volume", "create", name)
        try:
            yield names
        finally:
            for name in names:
                self.run("volume", "rm", "-f", name, check=False)

    @contextlib.contextmanager
    def gateway(
        self,
        volumes: tuple[str, str],
        token_file: Path,
        *,
        env: dict[str, str] | None = None,
        extra: tuple[str, ...] = (),
        security: dict[str, Any] = SECURITY,
        wait: bool = True,
    ) -> Iterator[Container]:
        """One gateway container on ``volumes`` (see the module docstring), ready unless
        ``wait=False``; removed afterwards."""
        port = free_port()
        name = f"rawp-test-{uuid.uuid4().hex[:10]}"
        environ = {"RAWP_GATEWAY_HOST": "127.0.0.1", "RAWP_GATEWAY_PORT": str(port), **(env or {})}
        args = ["run", "-d", "--name", name, "--network", "host"]
        args += self.security_args(security)
        args += ["-v", f"{volumes[0]}:{WORKSPACE}", "-v", f"{volumes[1]}:{STATE}"]
        args += ["-v", f"{token_file}:{TOKEN_PATH}:ro"]
        for key, value in environ.items():
            args += ["-e", f"{key}={value}"]
        started = time.monotonic()
        self.run(*args, *extra, self.image)
        box = Container(self, name, f"http://127.0.0.1:{port}", token_file.read_text().strip())
        try:
            if wait:
                box.ready_after = box.wait_ready() - started
            yield box
        finally:
            self.run("rm", "-f", "-v", "-t", "0", name, check=False)  # -v: anonymous ones too


@dataclass
class Container:
    engine: Engine
    name: str
    url: str
    token: str
    ready_after: float = 0.0  # seconds from `run` to /readyz answering 200

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def running(self) -> bool:
        return self.engine.inspect("container", self.name)["State"]["Running"]

    def logs(self) -> str:
        proc = self.engine.run("logs", self.name, check=False)
        return proc.stdout + proc.stderr

    def wait_ready(self, timeout: float = 60) -> float:
        """Poll /readyz until it answers 200; the monotonic time it did. A container that exits
        fails with its log."""
        end = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        return time.monotonic()
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > end or not self.running():
                raise AssertionError(f"{self.name} never became ready:\n{self.logs()}")
            time.sleep(0.02)

    def exec(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.engine.run("exec", self.name, *args, check=check)


def run_script(script: Path, *args: str) -> tuple[dict[str, str], dict[str, str]]:
    """One of the scripts that print ``key=value`` lines (scripts/build-image,
    scripts/build-toolchain): those lines, and the environment the engine commands need (this
    one's, with the podman settings files the script wrote for this machine)."""
    proc = subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=3600, check=False
    )
    if proc.returncode != 0:
        raise AssertionError(f"{script.name} failed:\n{proc.stderr[-4000:]}")
    out = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    env = dict(os.environ)
    for key in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF"):
        if key in out:
            env[key] = out[key]
    return out, env


def built() -> Engine:
    """The image of the current sources, built if it is not there yet (``scripts/build-image``)."""
    out, env = run_script(REPO / "scripts" / "build-image")
    return Engine(out["engine"], out["image"], env)
