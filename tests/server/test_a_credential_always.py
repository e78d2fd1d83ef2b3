"""There is always a credential, loopback included (docs/identities.md, "The local token"): a
gateway started without a token makes one, and an agent, or what an agent ran, is no master of its
own gateway by being on the same machine. Each test runs the hostile agent
tests/support/hostile/masters_itself.py as a session's agent on a real gateway (``serve`` with
``[isolation] mode = "none"``, ``serve`` in the sandbox with ``network = "host"``, ``demo``): while
its permission question waits for the person, it goes to 127.0.0.1 to attach to its own session
and answer the question, to list, read, create and delete sessions, and gets 401 every time."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys

import aiohttp
import pytest

from gateway.local_token import new_token, token_path, write_token
from tests.support.self_master import SCRIPT, play, profile_toml, refused_every_time
from tests.support.serve_process import serve
from tests.support.servers import CLI, user_headers
from tests.support.tmpfs import PAGE, fill, small_tmpfs
from tests.support.waiting import eventually


def listening(proc: subprocess.Popen) -> dict:
    """The ``listening`` record of a stopped ``serve --log-format json``."""
    assert proc.stderr is not None
    records = [
        json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith(b"{")
    ]
    [record] = [r for r in records if r["msg"] == "listening"]
    return record


async def test_serve_without_a_token_makes_one_only_its_user_reads(tmp_path):
    """256 random bits in a 0600 file of a 0700 directory of the user's, named in the listening
    line, found by the user's client for the loopback URL; without it every call is 401, and the
    file is gone when the gateway stops."""
    async with serve("--workspace-root", str(tmp_path), "--log-format", "json") as (proc, url):
        port = int(url.rpartition(":")[2])
        path = token_path(port)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert path.stat().st_uid == os.geteuid()
        token = path.read_text().strip()
        assert len(token) >= 43  # 32 bytes, URL-safe base64
        assert user_headers(url) == {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession() as http:
            for method, where in (("GET", "/v1/sessions"), ("GET", "/v1/agents"),
                                  ("POST", "/v1/session"), ("GET", "/v1/whoami")):  # fmt: skip
                async with http.request(method, url + where, json={"agent": "demo"}) as resp:
                    assert resp.status == 401, where
            async with http.get(url + "/v1/whoami", headers=user_headers(url)) as resp:
                assert await resp.json() == {"user": "admin", "role": "admin"}
            async with http.get(url + "/healthz") as resp:
                assert resp.status == 200
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        assert listening(proc)["token_file"] == str(path)
        assert not path.exists()


async def test_serve_without_a_token_still_refuses_another_address(tmp_path):
    proc = subprocess.run(
        [*CLI, "serve", "--host", "0.0.0.0", "--port", "0", "--workspace-root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "refusing to listen on 0.0.0.0 without a token" in proc.stderr


async def test_an_agent_without_the_sandbox_is_no_master_of_its_gateway(tmp_path):
    """``mode = "none"``: every attempt without a credential is 401, and the question stays the
    person's. The agent runs as the gateway's user and reads the token file: what the docs say
    that mode still exposes (docs/isolation.md), and why the sandbox is the answer."""
    config = tmp_path / "gateway.toml"
    config.write_text(profile_toml(sys.executable))
    args = ("--config", str(config), "--workspace-root", str(tmp_path))
    async with serve(*args) as (_, url), aiohttp.ClientSession() as http:
        token_file = token_path(int(url.rpartition(":")[2]))
        attack, listed = await play(http, url, user_headers(url), tmp_path, token_file)
    refused_every_time(attack)
    assert len(listed) == 2  # nothing created, nothing deleted
    assert attack["token file"] == "read"  # mode "none": the same user reads what it reads


@pytest.mark.sandbox
async def test_an_agent_in_the_sandbox_on_the_host_network_is_no_master_of_its_gateway(tmp_path):
    """``mode = "sandbox"`` with ``network = "host"``: the agent reaches 127.0.0.1, gets 401 every
    time, and cannot read the token file (masked)."""
    from tests.support.sandbox_rig import tokenless

    async with tokenless(profile_toml(), network="host") as dep, aiohttp.ClientSession() as http:
        attack, listed = await play(
            http, dep.url, dep.headers, dep.workspace, dep.token_file, workspace_path="hostile"
        )
    refused_every_time(attack)
    assert len(listed) == 2
    assert attack["token file"] != "read", attack


async def test_an_agent_under_demo_is_no_master_of_its_gateway(tmp_path):
    """``rawp-gateway demo`` with an agent that asks permission (the hostile one as the
    ``claude-acp`` profile's ``claude-agent-acp``): its attempts are 401, the chat answers the
    question itself (no terminal: declined), never "(allow by local)"."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "claude-agent-acp"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{SCRIPT}" "$@"\n')
    wrapper.chmod(0o755)
    work = tmp_path / "work"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.Popen(
        [*CLI, "demo", "--agent", "claude-acp", "--workspace-root", str(work)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        first = proc.stdout.readline()
        url = first.split("server ", 1)[1].split(" ", 1)[0]
        target = {"url": url, "other": "00000000-0000-4000-8000-000000000000",
                  "token_file": str(token_path(int(url.rpartition(":")[2])))}  # fmt: skip
        proc.stdin.write(json.dumps(target) + "\n")
        proc.stdin.flush()
        report = work / "attack.json"
        await eventually(report.exists, "the hostile agent's report", timeout=60)
        attack = json.loads(report.read_text())
        out, _ = proc.communicate(timeout=60)  # stdin closed: the chat ends
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    refused_every_time(attack)
    assert attack["token file"] != "read"  # demo keeps its token in the process: no file
    shown = first + out
    assert "by local" not in shown, shown
    assert "browser console: " in shown and "&token=" in shown, shown


def test_a_token_that_a_full_disk_cuts_short_is_never_left_half_written(tmp_path):
    """The made token's file on a full file system: the write fails with ENOSPC, the file a
    client reads still holds the token before (never half of the new one), and no stray copy of
    the secret is left beside it."""
    with small_tmpfs(tmp_path / "small", 64 * PAGE) as small:
        path = small / "rawp-gateway" / "token-8765"
        write_token(path, "before")
        fill(small / "ballast")
        with pytest.raises(OSError) as err:
            write_token(path, new_token())
        assert err.value.errno == errno.ENOSPC
        assert path.read_text() == "before\n"
        assert sorted(p.name for p in path.parent.iterdir()) == ["token-8765"]
