"""The test command on a machine that lacks parts: scripts/missing-test-parts says what is missing
(run here with a PATH that holds only what each case provides), and tests/conftest.py skips exactly
the tests that need it, with that reason in pytest's summary, and refuses to under CI=true. And the
suite in parallel: pytest-xdist workers, each with ports of its own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import servers
from tests.support.paths import REPO

SCRIPT = REPO / "scripts" / "missing-test-parts"


def fake_bin(tmp_path: Path, tools: dict[str, str | None]) -> Path:
    """A PATH directory with bash, id and dirname (what the scripts run on) and small stand-ins:
    each ``name: stdout`` becomes a program that prints that and exits 0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("bash", "id", "dirname"):
        real = shutil.which(name)
        assert real is not None, name
        (bin_dir / name).symlink_to(real)
    for name, out in tools.items():
        if out is None:
            continue
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\necho '{out}'\n" if out else "#!/bin/sh\nexit 0\n")
        path.chmod(0o755)
    return bin_dir


# Stand-ins for the parts each case does not look at: Chromium, nginx, websocketd, bubblewrap and the
# container engine's tools (podman and what goes with it; no docker, so podman's are the ones looked
# for).
GIVEN = dict.fromkeys(
    (
        "chromium",
        "nginx",
        "websocketd",
        "bwrap",
        "podman",
        "buildah",
        "debootstrap",
        "podman-compose",
        "iptables",
    ),
    "",
)


def missing(
    tmp_path: Path,
    chromium: str = "chromium",
    nginx: str = "nginx",
    toolchain: bool = True,
    **tools: str | None,
) -> dict[str, str]:
    """What the script says is missing; ``chromium`` and ``nginx`` are its RAWP_TEST_CHROMIUM and
    RAWP_TEST_NGINX (by default stand-ins on PATH, so that the answer does not depend on this
    machine's /usr/bin/chromium or /usr/sbin/nginx); ``toolchain``: whether scripts/build-toolchain
    has built the team's system (in a cache of the case's own, not this machine's)."""
    cache = tmp_path / "cache"
    if toolchain:
        (cache / "rawp-gateway" / "toolchain-0123456789abcdef" / "usr").mkdir(parents=True)
    proc = subprocess.run(
        ["/usr/bin/env", "bash", str(SCRIPT)],
        env={
            "PATH": str(fake_bin(tmp_path, {**GIVEN, **tools})),  # None: not there
            "RAWP_TEST_CHROMIUM": chromium,
            "RAWP_TEST_NGINX": nginx,
            "XDG_CACHE_HOME": str(cache),
        },
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    parts = dict(line.split(": ", 1) for line in lines)
    assert len(parts) == len(lines), "one line per part"
    return parts


ROOT_WITH_APT = os.geteuid() == 0


def test_nothing_installed_says_both_parts_in_one_line_each(tmp_path):
    parts = missing(tmp_path)
    assert set(parts) == {"realcli", "prometheus"}  # (the others are GIVEN: see below)
    assert "Node.js 20+ with npm (node not found, npm not found)" in parts["realcli"]
    assert "prometheus and promtool are not on PATH" in parts["prometheus"]


def test_no_container_engine_is_missing_and_names_what_is_not_installed(tmp_path):
    parts = missing(tmp_path, podman=None, **{"podman-compose": None})
    assert parts["image"].startswith("docker info fails and podman podman-compose not installed")


def test_a_docker_whose_info_answers_is_enough_for_the_image(tmp_path):
    assert "image" not in missing(tmp_path, docker="", podman=None, buildah=None)


def test_node_older_than_20_is_missing(tmp_path):
    parts = missing(tmp_path, node="18", npm="")
    assert parts["realcli"].endswith("(node 18 found)")


def test_node_without_npm_is_missing(tmp_path):
    assert missing(tmp_path, node="22")["realcli"].endswith("(npm not found)")


def test_node_20_with_npm_is_enough(tmp_path):
    assert "realcli" not in missing(tmp_path, node="20", npm="")


def test_prometheus_needs_both_binaries(tmp_path):
    assert "prometheus" in missing(tmp_path, promtool="")


def test_prometheus_and_promtool_on_path_are_enough(tmp_path):
    assert "prometheus" not in missing(tmp_path, prometheus="", promtool="")


def test_a_chromium_that_is_not_there_is_missing(tmp_path):
    absent = tmp_path / "no-chromium"
    parts = missing(tmp_path, chromium=str(absent))
    assert parts["browser"] == f"RAWP_TEST_CHROMIUM names {absent}, which is not an executable"


def test_a_chromium_on_path_or_at_a_path_is_enough(tmp_path):
    assert "browser" not in missing(tmp_path / "a")  # the stand-in, found on PATH
    assert "browser" not in missing(tmp_path / "b", chromium=shutil.which("bash") or "/bin/bash")


def test_an_nginx_that_is_not_there_is_missing(tmp_path):
    absent = tmp_path / "no-nginx"
    bin_dir = fake_bin(tmp_path / "x", {})  # no nginx on PATH either
    proc = subprocess.run(
        ["/usr/bin/env", "bash", str(SCRIPT)],
        env={"PATH": str(bin_dir), "RAWP_TEST_CHROMIUM": "/bin/sh", "RAWP_TEST_NGINX": str(absent)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert f"nginx: RAWP_TEST_NGINX names {absent}, which is not an executable" in proc.stdout


def test_an_nginx_on_path_or_at_a_path_is_enough(tmp_path):
    assert "nginx" not in missing(tmp_path / "a")  # the stand-in, found on PATH
    assert "nginx" not in missing(tmp_path / "b", nginx=shutil.which("bash") or "/bin/bash")


def test_websocketd_not_on_path_is_missing_unless_root_with_apt_get_can_install_it(tmp_path):
    """The relay benches' smoke test runs Debian's websocketd (scripts/install-websocketd.sh)."""
    parts = missing(tmp_path / "a", websocketd=None)
    assert parts["websocketd"].startswith("websocketd is not on PATH")
    assert "websocketd" not in missing(tmp_path / "b")  # the stand-in, found on PATH
    root = missing(tmp_path / "c", websocketd=None, **{"apt-get": ""})
    assert ("websocketd" in root) is not ROOT_WITH_APT


def test_a_team_system_not_built_is_missing_unless_root_can_debootstrap_it(tmp_path):
    """The system_root tests' team system: built already, or root with debootstrap (or apt-get
    to install it) to build it; else missing, said in one line."""
    parts = missing(tmp_path / "a", toolchain=False, debootstrap=None)
    assert parts["toolchain"].startswith("scripts/build-toolchain has not built the team's system")
    assert "toolchain" not in missing(tmp_path / "b", toolchain=True, debootstrap=None)
    root = missing(tmp_path / "c", toolchain=False)  # the debootstrap stand-in is there
    assert ("toolchain" in root) is not ROOT_WITH_APT


def test_a_bwrap_that_cannot_make_a_sandbox_is_missing(tmp_path):
    """Installed is not enough: a bwrap whose user namespaces are refused makes no sandbox."""
    assert "sandbox" not in missing(tmp_path / "a")  # the stand-in exits 0: it made one
    refusing = tmp_path / "refusing"
    refusing.mkdir()
    bin_dir = fake_bin(refusing, {"chromium": "", "nginx": ""})
    (bin_dir / "bwrap").write_text(
        "#!/bin/sh\necho 'No permissions to create new namespace' >&2\nexit 1\n"
    )
    (bin_dir / "bwrap").chmod(0o755)
    said = said_with_path(bin_dir)
    assert "sandbox: bwrap cannot make a sandbox here (user namespaces refused" in said


def test_no_bwrap_without_root_and_apt_is_missing(tmp_path):
    said = said_with_path(fake_bin(tmp_path, {"chromium": "", "nginx": ""}))
    # No apt-get on this PATH: root or not, the script cannot install it.
    assert (
        "sandbox: bwrap is not on PATH, and installing Debian's bubblewrap needs root and apt-get"
        in said
    )


def said_with_path(bin_dir: Path) -> str:
    """What the script prints with only ``bin_dir`` on PATH (Chromium and nginx stand-ins)."""
    proc = subprocess.run(
        ["/usr/bin/env", "bash", str(SCRIPT)],
        env={"PATH": str(bin_dir), "RAWP_TEST_CHROMIUM": "chromium", "RAWP_TEST_NGINX": "nginx"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return proc.stdout


def test_root_with_apt_get_can_install_prometheus(tmp_path):
    """scripts/test installs Debian's package then; without root it cannot."""
    assert ("prometheus" in missing(tmp_path, **{"apt-get": ""})) is not ROOT_WITH_APT


@pytest.mark.parametrize(
    ("version", "npm", "says"),
    [("v22.1.0", False, "npm is required"), ("v18.19.0", True, "found v18.19.0")],
)
def test_install_agents_refuses_without_npm_or_with_an_old_node(tmp_path, version, npm, says):
    """Under CI nothing is skipped: the installer itself fails, before installing anything."""
    bin_dir = fake_bin(tmp_path, {"npm": ""} if npm else {})
    # A stand-in node of that version: `node --version` prints it, the version check fails.
    node = bin_dir / "node"
    node.write_text(f'#!/bin/sh\n[ "$1" = --version ] && echo {version} && exit 0\nexit 1\n')
    node.chmod(0o755)
    proc = subprocess.run(
        ["/usr/bin/env", "bash", str(REPO / "scripts" / "install-agents.sh")],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 1 and says in proc.stderr, proc.stderr
    assert proc.stdout == ""


# --------------------------------------------------------------------------- tests/conftest.py


def pytest_run(tmp_path: Path, *args: str, missing: str, ci: bool, path: str | None = None):
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "RAWP_TEST_MISSING")}
    env["RAWP_TEST_MISSING"] = missing
    if ci:
        env["CI"] = "true"
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def outcome(out: str) -> dict[str, int]:
    last = [line for line in out.splitlines() if re.search(r"\d+ \w+ in [\d.]+s", line)][-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last)}


def test_conftest_skips_the_marked_tests_with_the_reason(tmp_path):
    files = [
        "tests/metrics/test_dashboard.py",
        "tests/repo/test_deploy.py",
        "tests/metrics/test_prometheus_scrape.py",
    ]
    marked = pytest_run(tmp_path, "--co", "-m", "prometheus", *files, missing="", ci=False)
    count = len([line for line in marked.stdout.splitlines() if "::" in line])
    assert count >= 5, marked.stdout
    proc = pytest_run(
        tmp_path, "-m", "prometheus", *files, missing="prometheus: no Prometheus here", ci=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = outcome(proc.stdout)
    assert result["skipped"] == count and "passed" not in result and "failed" not in result
    assert "no Prometheus here (scripts/test)" in proc.stdout  # the -ra summary's reason


def test_every_test_that_runs_prometheus_or_promtool_is_marked(tmp_path):
    """With neither binary on PATH and the part declared missing, no test meets their absence
    itself: each one that needs them was skipped by its marker first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            target = bin_dir / entry.name
            if entry.name not in ("prometheus", "promtool") and not target.exists():
                target.symlink_to(entry.path)
    proc = pytest_run(
        tmp_path,
        "tests/metrics/test_dashboard.py",
        "tests/metrics/test_prometheus_scrape.py",
        "tests/repo/test_deploy.py",
        missing="prometheus: no Prometheus here",
        ci=False,
        path=str(bin_dir),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not installed" not in proc.stdout, proc.stdout
    assert outcome(proc.stdout)["passed"] > 0


@pytest.mark.parametrize(
    ("args", "missing", "required", "allowed"),
    [
        (
            ("-m", "realcli", "tests/rig/test_rig_cli.py"),
            "realcli: no Node here",
            set(),
            {"skipped", "deselected"},
        ),
        (
            ("tests/console/test_browser_console.py",),
            "browser: no Chromium here",
            {"skipped"},
            {"skipped"},
        ),
    ],
    ids=["realcli", "browser"],
)
def test_conftest_skips_tests_with_the_reason(tmp_path, args, missing, required, allowed):
    """A tool scripts/test found missing skips the tests that need it, saying why."""
    proc = pytest_run(tmp_path, *args, missing=missing, ci=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert required <= set(outcome(proc.stdout)) <= allowed
    assert f"{missing.split(': ', 1)[1]} (scripts/test)" in proc.stdout


def test_under_ci_nothing_may_be_missing(tmp_path):
    proc = pytest_run(
        tmp_path,
        "tests/metrics/test_dashboard.py",
        missing="prometheus: no Prometheus here",
        ci=True,
    )
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR
    assert "CI=true" in proc.stderr and "no Prometheus here" in proc.stderr


def test_an_unknown_marker_is_refused(tmp_path):
    proc = pytest_run(
        tmp_path, "tests/metrics/test_dashboard.py", missing="promethus: typo", ci=False
    )
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR
    assert "'promethus' is not a registered marker" in proc.stderr


def _install_venv(repo: Path) -> list[str]:
    """Run scripts/install-venv.sh test in ``repo`` with stand-in python3 and .venv/bin/python
    that log their arguments instead of reaching a package index; returns the log."""
    log = repo / "calls.log"
    stub = f'#!/bin/sh\necho "$0 $*" >>{log}\n'
    shutil.rmtree(repo / "path", ignore_errors=True)
    bin_dir = fake_bin(repo / "path", {})
    for name in ("cat", "sha256sum", "cut", "grep", "sort", "mv"):
        real = shutil.which(name)
        assert real is not None, name
        (bin_dir / name).symlink_to(real)
    for python in (bin_dir / "python3", repo / ".venv" / "bin" / "python"):
        python.parent.mkdir(parents=True, exist_ok=True)
        python.write_text(stub)
        python.chmod(0o755)
    proc = subprocess.run(
        ["/usr/bin/env", "bash", str(repo / "scripts" / "install-venv.sh"), "test"],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return calls


def test_a_current_venv_is_used_offline_and_a_changed_pin_reinstalls(tmp_path):
    """scripts/demo and scripts/test install through scripts/install-venv.sh: the first run
    installs (pip, which needs the package index); a second with pyproject.toml and
    constraints.txt unchanged runs neither venv nor pip; a changed pin installs again."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("pyproject.toml", "constraints.txt", "scripts/install-venv.sh"):
        shutil.copy(REPO / name, repo / name)
    first = _install_venv(repo)
    assert any("-m venv .venv" in c for c in first)
    assert any("pip install -qq -c constraints.txt -e .[test]" in c for c in first), first
    assert _install_venv(repo) == []  # current: nothing runs, no index needed
    with (repo / "constraints.txt").open("a") as f:
        f.write("example-pin==1.0\n")
    assert any("pip install" in c for c in _install_venv(repo))
    for script in ("demo", "test"):  # both go through it, and install nothing else by pip
        text = (REPO / "scripts" / script).read_text()
        assert "scripts/install-venv.sh" in text and "pip install" not in text, script


# --------------------------------------------------------------------------- in parallel


def test_the_suite_runs_in_pytest_xdist_workers_and_one_file_can_run_serially(tmp_path):
    """scripts/test runs pytest with -n and worksteal before the caller's arguments, so a later
    ``-n 0`` (pytest takes the last) runs serially; pytest-xdist is pinned with its execnet."""
    script = (REPO / "scripts" / "test").read_text()
    (run,) = [line for line in script.splitlines() if line.startswith("exec ")]
    assert run == 'exec .venv/bin/python -m pytest -n "$workers" --dist worksteal "$@"'
    pins = (REPO / "constraints.txt").read_text().splitlines()
    assert {p.split("==")[0] for p in pins} >= {"pytest-xdist", "execnet"}
    assert '"pytest-xdist' in (REPO / "pyproject.toml").read_text()
    serial = pytest_run(
        tmp_path, "-v", "-n", "2", "--dist", "worksteal", "-n", "0", "tests/repo/test_docs.py",
        missing="", ci=False,
    )  # fmt: skip
    assert serial.returncode == 0, serial.stdout + serial.stderr
    assert (
        "workers [" not in serial.stdout and outcome(serial.stdout)["passed"] > 0
    )  # no worker ran


def test_each_worker_has_ports_no_other_worker_and_no_kernel_choice_takes(monkeypatch):
    """tests/support/servers.free_port: blocks of their own per worker, below the kernel's
    ephemeral ports (which bind(0) and outgoing connections take), so a port found free stays so
    until the server started with it binds it."""
    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert servers.PORTS.stop <= first_ephemeral
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "6")
    blocks = []
    for n in range(6):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{n}")
        blocks.append(set(servers._worker_ports()))
        assert servers.free_port() in blocks[-1]
    assert all(blocks) and set.union(*blocks) <= set(servers.PORTS)
    assert sum(map(len, blocks)) == len(set.union(*blocks))  # no port in two blocks
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert servers._worker_ports() == servers.PORTS  # serial: the whole range
