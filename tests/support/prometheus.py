"""Debian's Prometheus (scripts/install-prometheus.sh) run by a test: scraping gateways on loopback,
and PromQL asked of it. Without ``prometheus`` on PATH a test is skipped on a developer machine and
fails in CI (CI=true)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.procs import reap
from tests.support.servers import free_port


def installed(name: str = "prometheus") -> str:
    """The path of Debian's ``prometheus`` (or ``promtool``, same package); without it the test
    is skipped, and fails under CI."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed: CI must run scripts/install-prometheus.sh")
        pytest.skip(f"{name} not installed (scripts/install-prometheus.sh)")
    return path


def prometheus_binary() -> str:
    return installed("prometheus")


@contextlib.asynccontextmanager
async def run_prometheus(
    workdir: Path, token: str, static_configs: list[dict[str, Any]]
) -> AsyncIterator[str]:
    """A Prometheus on a free loopback port scraping ``static_configs`` (gateways' host:port and
    their labels) as the job ``rawp-gateway`` every second with the bearer ``token``, its files
    in ``workdir``; yields its base URL."""
    token_file = workdir / "token"
    token_file.write_text(token)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "rawp-gateway",
                "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                "static_configs": static_configs,
            }
        ],
    }
    config_file = workdir / "prometheus.yml"
    config_file.write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    log = (workdir / "prometheus.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        prometheus_binary(),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
        stdout=log,
        stderr=log,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(base, proc, workdir / "prometheus.log")
        yield base
    finally:
        if proc.returncode is None:
            proc.terminate()
            await reap(proc)
        log.close()


async def wait_ready(base: str, proc: asyncio.subprocess.Process, log: Path) -> None:
    """Until Prometheus says it is ready: its query API answers 503 while the TSDB starts."""
    deadline = time.monotonic() + 20
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                pytest.fail(f"prometheus exited {proc.returncode}: {log.read_text()[-2000:]}")
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with http.get(f"{base}/-/ready") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
    pytest.fail(f"prometheus was not ready in 20 s: {log.read_text()[-2000:]}")


async def query(http: aiohttp.ClientSession, base: str, promql: str) -> list[dict]:
    async with http.get(f"{base}/api/v1/query", params={"query": promql}) as resp:
        body = await resp.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


async def wait_for_value(
    http: aiohttp.ClientSession, base: str, promql: str, expected: float, deadline: float
) -> list[dict]:
    """Poll `promql` until its single result equals `expected`, or fail at `deadline`."""
    last: object = None
    while time.monotonic() < deadline:
        try:
            result = await query(http, base, promql)
        except aiohttp.ClientConnectionError as e:  # Prometheus still starting
            last = e
        else:
            last = result
            if len(result) == 1 and float(result[0]["value"][1]) == expected:
                return result
        await asyncio.sleep(0.25)
    pytest.fail(f"{promql} did not reach {expected} in time; last answer: {last}")
