"""A deployment as the sandbox is meant for, for tests/agent/test_sandbox.py: ``rawp-gateway serve``
running as an unprivileged account (uid 65534 when the tests run as root, as in the container),
with an admin token file, a users file of two users (alice, bob), a webhook secret, an audit log, a
state dir and its configuration file under a read-only ``/etc`` (as the image has it), and
``[isolation] mode = "sandbox"``. Everything the gateway reads a secret from holds a marker string
a test looks for in what an agent got."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.gateway_peer import SUBPROTOCOL, Master
from tests.support.paths import REPO
from tests.support.servers import free_port, stop, wait_http

ESCAPES = REPO / "tests" / "support" / "hostile" / "escapes.py"
NOBODY = 65534
SECRET = "s3cret-never-for-agents"  # in every file the gateway reads a secret from


def python_for(uid: int) -> tuple[list[str], dict[str, str], list[str]]:
    """How the account ``uid`` runs the gateway: the interpreter's argv, the environment it needs
    and what the sandbox must show of it. This one when ``uid`` may run it; else (a Python under
    root's 0700 HOME, as pyenv puts it) the system's Python of the same version with this
    repository and the virtual environment's packages on its path."""
    if uid == os.geteuid() or _runs(sys.executable, uid):
        return [sys.executable], {}, [str(REPO), sys.base_prefix]
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    paths = f"{REPO}{os.pathsep}{site / 'site-packages'}"
    return [system], {"PYTHONPATH": paths}, [str(REPO), sys.prefix]


def _runs(python: str, uid: int) -> bool:
    try:
        subprocess.run(
            [python, "-c", ""], user=uid, group=uid, extra_groups=[], check=True, timeout=30
        )
    except (OSError, subprocess.CalledProcessError):
        return False
    return True


@dataclass
class Deployment:
    proc: subprocess.Popen
    url: str
    base: Path
    config: Path
    tokens: dict[str, str]
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def state(self) -> Path:
        return self.base / "state"

    def workspace(self, user: str) -> Path:
        return self.base / "work" / user

    def headers(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[user]}"}

    async def create(
        self, http: aiohttp.ClientSession, user: str, agent: str, **body: Any
    ) -> dict[str, Any]:
        async with http.post(
            self.url + "/v1/session",
            json={"agent": agent, "workspace_path": user, **body},
            headers=self.headers(user),
        ) as resp:
            assert resp.status == 201, await resp.text()
            return await resp.json()

    async def attach(self, http: aiohttp.ClientSession, user: str, session: dict) -> Master:
        ws = await http.ws_connect(
            self.url + session["ws_path"], protocols=(SUBPROTOCOL,), headers=self.headers(user)
        )
        master = Master(ws, session["session_id"])
        await master.send(
            "session.capabilities",
            {
                "protocol_version": "rawp-dps-1.0",
                "supported_namespaces": ["agent", "tool", "control", "session"],
                "features": {},
            },
        )
        return master


def _own(path: Path, uid: int) -> None:
    if os.geteuid() == 0:
        os.chown(path, uid, uid)


def _write(path: Path, text: str, uid: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    _own(path, uid)
    return path


@contextlib.asynccontextmanager
async def deployment(**isolation: Any) -> AsyncIterator[Deployment]:
    """The gateway as described above, ``isolation`` over the test's ``[isolation]`` keys; its
    files are removed afterwards."""
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    base = Path(tempfile.mkdtemp(prefix="rawp-sandbox-"))
    base.chmod(0o755)
    # The image keeps its configuration under /etc, which the sandbox shows read-only: the case
    # the masks are for. Without root, it goes beside the rest.
    etc = Path(f"/etc/rawp-sandbox-test-{uuid.uuid4().hex[:8]}") if os.geteuid() == 0 else base
    try:
        for d in ("work/alice", "work/bob", "state", "secrets", "audit"):
            (base / d).mkdir(parents=True, exist_ok=True)
            _own(base / d, uid)
        _own(base / "work", uid)
        tokens = {"admin": f"admin-{SECRET}", "alice": "alice-token", "bob": "bob-token"}
        users = "".join(
            f'[[users]]\nname = "{name}"\nrole = "operator"\n'
            f'token_sha256 = "{hashlib.sha256(tokens[name].encode()).hexdigest()}"\n'
            f"# {SECRET}\n"
            for name in ("alice", "bob")
        )
        files = {
            "token": _write(base / "secrets" / "token", tokens["admin"] + "\n", uid),
            "users": _write(base / "secrets" / "users.toml", users, uid),
            "hook": _write(base / "secrets" / "hook", SECRET + "\n", uid),
            "bob_secret": _write(base / "work" / "bob" / "notes.txt", f"bob's {SECRET}\n", uid),
        }
        python, python_env, shown = python_for(uid)
        settings = {
            "mode": "sandbox",
            # The agents' code (this repository) and the Python they run on.
            "bind_ro": sorted(set(shown)),
            "max_processes": 100,
            "max_memory_mb": 512,
            **isolation,
        }
        text = (
            f'# {SECRET}\n[server]\nworkspace_root = "{base}/work"\nstate_dir = "{base}/state"\n'
            f'token_file = "{files["token"]}"\n'
            f'[auth]\nusers_file = "{files["users"]}"\naudit_log = "{base}/audit/audit.jsonl"\n'
            f'[[notify.webhooks]]\nurl = "http://127.0.0.1:9/hook"\nevents = ["session.ended"]\n'
            f'secret_file = "{files["hook"]}"\n'
            f"[isolation]\n"
            + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())
            + '[agents.hostile]\nparser = "plain"\nsingle_turn_process = true\n'
            f'command = ["/usr/bin/python3", "{ESCAPES}", "{{prompt}}"]\n'
        )
        etc.mkdir(exist_ok=True)
        etc.chmod(0o755)
        config = _write(etc / "config.toml", text, uid)
        files["config"] = config
        files["audit"] = base / "audit" / "audit.jsonl"
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAWP_GATEWAY_")}
        proc = subprocess.Popen(
            [*python, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)],
            stderr=subprocess.PIPE,
            cwd=base,
            # The admin token in serve's environment too, as a deployment may give it: the
            # variable an agent must never see.
            env={**env, **python_env, "HOME": str(base), "RAWP_GATEWAY_TOKEN": tokens["admin"]},
            **({"user": uid, "group": uid, "extra_groups": []} if os.geteuid() == 0 else {}),
        )
        url = f"http://127.0.0.1:{port}"
        try:
            await wait_http(url, proc)
            yield Deployment(proc, url, base, config, tokens, files)
        finally:
            stop(proc, 15)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if etc != base:
            shutil.rmtree(etc, ignore_errors=True)


@dataclass
class Tokenless:
    """A sandboxed gateway started with no credential at all, and what its user finds of it."""

    url: str
    workspace: Path  # the hostile session's workspace
    token_file: Path
    headers: dict[str, str]


@contextlib.asynccontextmanager
async def tokenless(agents_toml: str, **isolation: Any) -> AsyncIterator[Tokenless]:
    """``serve`` as an unprivileged account with ``[isolation] mode = "sandbox"`` (``isolation``
    over its keys) and no token: it makes its own and keeps it under the account's state home,
    which its ``listening`` log line names; the person reads it there, as its user does."""
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    base = Path(tempfile.mkdtemp(prefix="rawp-tokenless-"))
    base.chmod(0o755)
    try:
        for d in ("work/hostile", "state-home"):
            (base / d).mkdir(parents=True, exist_ok=True)
            _own(base / d, uid)
        _own(base / "work", uid)
        python, python_env, shown = python_for(uid)
        settings = {"mode": "sandbox", "bind_ro": sorted(set(shown)), **isolation}
        text = (
            f'[server]\nworkspace_root = "{base}/work"\n[isolation]\n'
            + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())
            + agents_toml
        )
        config = _write(base / "config.toml", text, uid)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAWP_GATEWAY_", "XDG_"))}
        proc = subprocess.Popen(
            [
                *python,
                "-m",
                "gateway",
                "serve",
                "--config",
                str(config),
                "--port",
                str(port),
                "--log-format",
                "json",
            ],
            stderr=subprocess.PIPE,
            cwd=base,
            env={**env, **python_env, "HOME": str(base), "XDG_STATE_HOME": f"{base}/state-home"},
            **({"user": uid, "group": uid, "extra_groups": []} if os.geteuid() == 0 else {}),
        )
        url = f"http://127.0.0.1:{port}"
        try:
            await wait_http(url, proc)
            token_file = base / "state-home" / "rawp-gateway" / f"token-{port}"
            token = token_file.read_text().strip()
            headers = {"Authorization": f"Bearer {token}"}
            yield Tokenless(url, base / "work" / "hostile", token_file, headers)
        finally:
            stop(proc, 15)
            assert proc.stderr is not None
            logged = [json.loads(line) for line in proc.stderr.read().splitlines()
                      if line.startswith(b"{")]  # fmt: skip
            assert [r.get("token_file") for r in logged if r["msg"] == "listening"] == [
                str(token_file)
            ]
    finally:
        shutil.rmtree(base, ignore_errors=True)
