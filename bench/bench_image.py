"""The sidecar image's size, its time from ``run`` to ready, and an idle container's memory.

Theory of operation
-------------------
The image of the current sources (``scripts/build-image``: built once, reused while the sources
are unchanged) is run ``--runs`` times as the image tests run it (``tests.support.engine``: non-root,
read-only root file system, two new volumes, host network on 127.0.0.1 at a free port). Printed:

* the image's size, and its largest parts (Claude Code's native binary, the gateway's
  virtualenv, the Debian base with Python, git, tini and bubblewrap);
* the time from the engine's ``run`` command to ``/readyz`` answering 200, each run and the median;
  the baseline in the same run: ``rawp-gateway serve`` of this checkout started on the host with
  the same configuration, to the same answer (so the ratio is what the container adds: the engine,
  the volumes, a cold page cache for the image's files);
* the resident memory of the idle container's processes (tini and the gateway, no session), read
  from ``/proc`` inside it, and the same gateway's on the host.

    .venv/bin/python bench/bench_image.py [--runs 5]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.engine import Engine, built
from tests.support.paths import REPO
from tests.support.servers import free_port

RSS = (
    "import os\n"
    "total = 0\n"
    "for p in os.listdir('/proc'):\n"
    "    if p.isdigit() and p != str(os.getpid()):\n"
    "        try: status = open(f'/proc/{p}/status').read()\n"
    "        except OSError: continue\n"
    "        if 'VmRSS:' in status: total += int(status.split('VmRSS:')[1].split()[0])\n"
    "print(total)"
)


def mb(n: float) -> str:
    return f"{n / 1e6:.0f} MB"


def wait_ready(url: str, timeout: float = 60) -> float:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.01)
    raise SystemExit(f"{url} never became ready")


def host_run(token_file: Path, workspace: Path, state: Path) -> tuple[float, int]:
    """The baseline: this checkout's gateway on the host, the image's config, to ready; its RSS."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "gateway", "serve",
        "--config", str(REPO / "deploy" / "config.toml"),
        "--host", "127.0.0.1", "--port", str(port),
        "--token-file", str(token_file), "--workspace-root", str(workspace),
        "--state-dir", str(state),
    ]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        ready = wait_ready(f"http://127.0.0.1:{port}") - started
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss_kb = int(status.split("VmRSS:")[1].split()[0])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return ready, rss_kb * 1024


def sizes(engine: Engine) -> list[tuple[str, int]]:
    """The image's largest parts, measured inside it."""
    box = engine.run(
        "run", "--rm", "--user", "0", "--no-healthcheck", "--entrypoint", "du", engine.image,
        "-sb", "/usr/local/bin/claude", "/opt/rawp-gateway", "/usr", "/var", "/etc",
    ).stdout  # fmt: skip
    return [(path, int(n)) for n, path in (line.split("\t") for line in box.splitlines())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    engine = built()
    image = engine.inspect("image", engine.image)
    print(f"engine: {engine.name}; image {engine.image}: {mb(image['Size'])}")
    for path, n in sizes(engine):
        print(f"  {path}: {mb(n)}")

    with tempfile.TemporaryDirectory() as tmp:
        token = Path(tmp) / "token"
        token.write_text(secrets.token_hex(32) + "\n")
        token.chmod(0o644)
        container_ready, container_rss = [], []
        for _ in range(args.runs):
            with engine.volumes() as volumes, engine.gateway(volumes, token) as box:
                container_ready.append(box.ready_after)
                time.sleep(2)  # idle: whatever the start left running has settled
                container_rss.append(int(box.exec("python3", "-c", RSS).stdout) * 1024)
        host_ready, host_rss = [], []
        for i in range(args.runs):
            ws, state = Path(tmp) / f"ws{i}", Path(tmp) / f"state{i}"
            ws.mkdir()
            ready, rss = host_run(token, ws, state)
            host_ready.append(ready)
            host_rss.append(rss)

    c, h = statistics.median(container_ready), statistics.median(host_ready)
    print(
        f"run to /readyz: container {', '.join(f'{t:.2f}' for t in container_ready)} s "
        f"(median {c:.2f} s); host serve median {h:.2f} s; ratio {c / h:.2f}"
    )
    cr, hr = statistics.median(container_rss), statistics.median(host_rss)
    print(
        f"idle RSS: container (tini + gateway) {mb(cr)}; host gateway {mb(hr)}; ratio {cr / hr:.2f}"
    )


if __name__ == "__main__":
    main()
