"""A fleet on loopback: three ``rawp-gateway serve`` processes (127.0.0.2, .3, .4, one port), each
with its own state directory and route prefix, behind Debian's nginx running the router of
deploy/k8s (router/default.conf.template, its ``${RAWP_*}`` variables filled in here as the nginx
image fills them in from router.yaml's environment), and a small DNS server on 127.0.0.1 that
answers nginx's resolver as the cluster's DNS answers for the headless Service:
``<pod>.<domain>`` is that pod's address, ``<domain>`` every pod's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.paths import REPO
from tests.support.servers import free_port_on, wait_http

TEMPLATE = REPO / "deploy" / "k8s" / "router" / "default.conf.template"
DOMAIN = "gw.fleet.test"  # <pod>.DOMAIN: one pod, as under the StatefulSet's headless Service
READY = "ready.fleet.test"  # every pod, as the ready pods' headless Service (all stay ready here)
TOKEN = "fleet-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
START_TIMEOUT_SEC = 60.0  # a loaded machine starts Python slowly


NGINX = os.environ.get("RAWP_TEST_NGINX", "/usr/sbin/nginx")


def nginx_path() -> str | None:
    """Debian's nginx (``RAWP_TEST_NGINX``, by default /usr/sbin/nginx, often not on a user's
    PATH; else nginx on PATH), or None."""
    if os.access(NGINX, os.X_OK):
        return NGINX
    return shutil.which(NGINX) or shutil.which("nginx")


def render_router(values: dict[str, str]) -> str:
    """The template with its ``${RAWP_*}`` variables replaced, as the nginx image's envsubst step
    does with ``NGINX_ENVSUBST_FILTER=^RAWP_``; every variable must be given."""
    text = TEMPLATE.read_text()
    wanted = set(re.findall(r"\$\{(RAWP_[A-Z_]+)\}", text))
    missing = wanted - values.keys()
    if missing:
        raise KeyError(f"no value for {sorted(missing)}")
    return re.sub(r"\$\{(RAWP_[A-Z_]+)\}", lambda m: values[m[1]], text)


# --- DNS --------------------------------------------------------------------------------------------


class Dns:
    """A DNS server on 127.0.0.1 (UDP) answering A queries from ``records``; other names are
    NXDOMAIN, other types of a known name are answered empty. Enough for nginx's resolver."""

    def __init__(self, records: dict[str, list[str]]) -> None:
        self.records = records
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                query, peer = self.sock.recvfrom(512)
            except TimeoutError:
                continue
            except OSError:
                return
            answer = self.answer(query)
            if answer is not None:
                self.sock.sendto(answer, peer)

    def answer(self, query: bytes) -> bytes | None:
        if len(query) < 12:
            return None
        ident, _flags, qdcount = struct.unpack("!HHH", query[:6])
        if qdcount != 1:
            return None
        labels, at = [], 12
        while at < len(query) and query[at] != 0:
            size = query[at]
            labels.append(query[at + 1 : at + 1 + size].decode("ascii", "replace"))
            at += 1 + size
        at += 1
        if at + 4 > len(query):
            return None
        qtype, qclass = struct.unpack("!HH", query[at : at + 4])
        question = query[12 : at + 4]
        name = ".".join(labels).lower()
        addresses = self.records.get(name)
        if addresses is None:
            return struct.pack("!HHHHHH", ident, 0x8183, 1, 0, 0, 0) + question  # NXDOMAIN
        answers = b""
        count = 0
        if qtype == 1 and qclass == 1:
            for address in addresses:
                answers += struct.pack("!HHHIH", 0xC00C, 1, 1, 1, 4) + socket.inet_aton(address)
                count += 1
        return struct.pack("!HHHHHH", ident, 0x8180, 1, count, 0, 0) + question + answers

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(timeout=2)


# --- processes --------------------------------------------------------------------------------------


@dataclass
class Pod:
    """One gateway of the fleet: ``rawp-gateway serve`` on its own address and state directory."""

    name: str
    address: str
    port: int
    home: Path
    extra: str = ""
    proc: subprocess.Popen[bytes] | None = None
    peers: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @property
    def prefix(self) -> str:
        return f"/pods/{self.name}"

    def write_config(self, workspace: Path) -> Path:
        config = self.home / "gateway.toml"
        config.write_text(
            "[server]\n"
            f'host = "{self.address}"\n'
            f"port = {self.port}\n"
            f"workspace_root = {json.dumps(str(workspace))}\n"
            f"state_dir = {json.dumps(str(self.home / 'state'))}\n"
            f'pod_name = "{self.name}"\n'
            'route_prefix = "/pods/{pod}"\n'
            'trusted_proxies = ["127.0.0.1/32"]\n'
            f"{self.extra}"
            "[agents.demo]\n"
            'env = { RAWP_DEMO_DELAY_MS = "20" }\n'
            "[fleet]\n"
            f"peers = {json.dumps(self.peers)}\n"
        )
        return config

    async def start(self, workspace: Path) -> None:
        config = self.write_config(workspace)
        env = dict(os.environ, RAWP_GATEWAY_TOKEN=TOKEN)
        env.pop("RAWP_GATEWAY_POD_NAME", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        await wait_http(self.url, self.proc, START_TIMEOUT_SEC)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)


class Router:
    """Debian's nginx running the rendered router configuration on 127.0.0.1."""

    def __init__(self, home: Path, dns: Dns, gateway_port: int) -> None:
        self.home = home
        self.port = free_port_on(("127.0.0.1",))
        self.url = f"http://127.0.0.1:{self.port}"
        self.values = {
            "RAWP_ROUTER_LISTEN": f"127.0.0.1:{self.port}",
            "RAWP_RESOLVER": f"127.0.0.1:{dns.port}",
            "RAWP_GATEWAY_DOMAIN": DOMAIN,
            "RAWP_GATEWAY_READY": READY,
            "RAWP_GATEWAY_PORT": str(gateway_port),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def write_config(self) -> Path:
        """The rendered template inside the http block nginx's packaged nginx.conf would give it
        (the image includes conf.d/*.conf there), with this test's own pid, logs and temp paths."""
        (self.home / "conf.d").mkdir(parents=True, exist_ok=True)
        (self.home / "conf.d" / "default.conf").write_text(render_router(self.values))
        main = self.home / "nginx.conf"
        temp = self.home / "temp"
        temp.mkdir(exist_ok=True)
        # As root, nginx's workers would run as nobody, who cannot enter pytest's temporary dirs.
        user = "user root;\n" if os.geteuid() == 0 else ""
        main.write_text(
            user + f"pid {self.home / 'nginx.pid'};\n"
            f"error_log {self.home / 'error.log'} info;\n"
            "worker_processes 1;\n"
            "events { worker_connections 1024; }\n"
            "http {\n"
            # Which gateways each request was tried on, in order ("a:p, b:p"), and their answers.
            "    log_format rawp '$request_method $uri $status|$upstream_addr|$upstream_status';\n"
            f"    access_log {self.home / 'access.log'} rawp;\n"
            f"    client_body_temp_path {temp / 'body'};\n"
            f"    proxy_temp_path {temp / 'proxy'};\n"
            f"    fastcgi_temp_path {temp / 'fastcgi'};\n"
            f"    uwsgi_temp_path {temp / 'uwsgi'};\n"
            f"    scgi_temp_path {temp / 'scgi'};\n"
            f"    include {self.home / 'conf.d'}/*.conf;\n"
            "}\n"
        )
        return main

    def check(self) -> subprocess.CompletedProcess[str]:
        """``nginx -t`` on the configuration."""
        nginx = nginx_path()
        assert nginx is not None
        main = self.write_config()
        return subprocess.run(
            [nginx, "-t", "-p", str(self.home), "-c", str(main), "-e", str(self.home / "e.log")],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    async def start(self) -> None:
        nginx = nginx_path()
        assert nginx is not None
        main = self.write_config()
        self.proc = subprocess.Popen(
            [nginx, "-p", str(self.home), "-c", str(main), "-e", str(self.home / "error.log"),
             "-g", "daemon off;"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        await wait_http(self.url, self.proc, START_TIMEOUT_SEC)

    def tries(self, method: str, uri: str) -> list[list[tuple[str, str]]]:
        """From the access log: for each such request, the (gateway address, status) tried."""
        found = []
        for line in (self.home / "access.log").read_text().splitlines():
            request, addresses, statuses = line.split("|")
            if request.split()[:2] == [method, uri]:
                found.append(list(zip(addresses.split(", "), statuses.split(", "), strict=True)))
        return found

    def error_log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.home / "error.log").read_text()[-4000:]
        return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Fleet:
    """Three pods, the DNS they are found by, and the router in front."""

    def __init__(self, home: Path, extras: tuple[str, str, str] = ("", "", "")) -> None:
        self.home = home
        self.workspace = home / "workspace"
        self.workspace.mkdir(parents=True, exist_ok=True)
        port = free_port_on(ADDRESSES)
        self.pods = [
            Pod(f"rawp-gateway-{i}", address, port, home / f"pod-{i}", extra=extras[i])
            for i, address in enumerate(ADDRESSES)
        ]
        for pod in self.pods:
            pod.home.mkdir(exist_ok=True)
            pod.peers = [p.url for p in self.pods]  # its own address too: it is skipped
        records = {f"{p.name}.{DOMAIN}": [p.address] for p in self.pods}
        records[READY] = [p.address for p in self.pods]
        self.dns = Dns(records)
        self.router = Router(home / "router", self.dns, port)

    async def start(self) -> None:
        await asyncio.gather(*(p.start(self.workspace) for p in self.pods))
        await self.router.start()

    def pod(self, name: str) -> Pod:
        (pod,) = [p for p in self.pods if p.name == name]
        return pod

    def close(self) -> None:
        self.router.stop()
        for pod in self.pods:
            pod.kill()
        self.dns.close()
