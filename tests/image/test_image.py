"""The sidecar image, built from deploy/Dockerfile and run by a real container engine (Docker, or
podman where no Docker daemon answers): what the schema and lint checks of tests/repo/test_deploy.py
cannot see. A missing shared library, a path only the build machine has, a healthcheck that never
passes, a user that cannot write its volume, SIGTERM that never reaches the gateway behind tini, a
read-only root file system that breaks the agent's HOME: each test here would fail on one.

Every container runs as deploy/ runs it (``tests.support.engine.SECURITY``) on the host's network,
listening on 127.0.0.1 only; masters are on the host. See tests/support/engine.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

import aiohttp
import pytest

from tests.support.engine import CONFINED, SECURITY, STATE, UID, WORKSPACE, Container, Engine
from tests.support.gateway_peer import SUBPROTOCOL, Master, of, prompt_and_wait
from tests.support.paths import REPO
from tests.support.rig import env as rigenv
from tests.support.rig.run import make_server
from tests.support.serve_process import stalled_master
from tests.support.servers import free_port

pytestmark = pytest.mark.image

# The 4x3 red PNG of the rig's image scenarios.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAQAAAADCAIAAAA7ljmRAAAAEElEQVR4nGP4z8AARww4OQD1MQv1NXv7ggAAAABJRU5ErkJggg=="
)
COMPOSE = REPO / "deploy" / "docker-compose.yml"
ENGINE_STOP_TIMEOUT = "10"  # docker stop / podman stop's default: SIGKILL after that


async def create(http: aiohttp.ClientSession, box: Container, **body: Any) -> dict[str, Any]:
    async with http.post(f"{box.url}/v1/session", json=body, headers=box.headers) as resp:
        assert resp.status == 201, await resp.text()
        return await resp.json()


async def attach(
    http: aiohttp.ClientSession, box: Container, session: dict[str, Any], **query: str
) -> Master:
    ws = await http.ws_connect(
        box.url + session["ws_path"], protocols=(SUBPROTOCOL,), headers=box.headers, params=query
    )
    return Master(ws, session["session_id"])


def bash_then_text(command: str, description: str, text: str) -> list[dict[str, Any]]:
    """The scripted model's two answers: one Bash call, then ``text`` once its result is in."""
    call = {
        "type": "tool_use",
        "name": "Bash",
        "input": {"command": command, "description": description},
    }
    return [
        {"content": [call]},
        {"match": {"tool_result": True}, "content": [{"type": "text", "text": text}]},
    ]


def claude_env(base_url: str) -> dict[str, str]:
    """The rig's environment for the CLI, less what the container has of its own."""
    return {
        k: v
        for k, v in rigenv.claude_code_env(base_url, Path(STATE)).items()
        if k not in ("PATH", "HOME", "USER", "TMPDIR", "IS_SANDBOX")
    }


async def allowed_bash_turn(
    master: Master, prompt: str, timeout: float = 60
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """A turn on a new attachment whose one Bash call the master allows: that call's
    ``tool.invoke.result`` (within ``timeout`` of the answer), the ``session.turn.end`` and the
    agent's text."""
    assert (await master.next())["type"] == "session.capabilities"
    await master.send("control.prompt.request", {"prompt_text": prompt})
    ask = await master.until("agent.interaction.request", timeout=60)
    assert ask["payload"]["context"]["tool_name"] == "Bash"
    await master.send(
        "control.interaction.response",
        {"interaction_id": ask["payload"]["interaction_id"], "selected_value": "allow"},
    )
    result = await master.until("tool.invoke.result", timeout=timeout)
    end = await master.until("session.turn.end", timeout=60)
    text = "".join(f["payload"]["text"] for f in of(master.frames, "agent.text.delta"))
    return result, end, text


def write_into(box: Container, path: str, data: bytes) -> None:
    """A file written inside the container, as its user."""
    code = f"import base64; open({path!r}, 'wb').write(base64.b64decode({base64.b64encode(data).decode()!r}))"
    box.exec("python3", "-c", code)


def test_the_container_runs_as_its_user_on_a_read_only_root_with_two_volumes(engine, token_file):
    """tini is PID 1, every process runs as uid 10001, the root file system refuses writes, and
    the two volumes (the workspace and the state volume with the agent's home) take them."""
    with engine.volumes() as volumes, engine.gateway(volumes, token_file) as box:
        info = engine.inspect("container", box.name)
        assert info["HostConfig"]["ReadonlyRootfs"] is True
        mounts = {m["Destination"]: m.get("Name") for m in info["Mounts"]}
        assert (mounts[WORKSPACE], mounts[STATE]) == volumes
        assert box.exec("cat", "/proc/1/comm").stdout.strip() == "tini"
        uids = box.exec(
            "python3",
            "-c",
            "import os\nfor p in os.listdir('/proc'):\n if p.isdigit():\n"
            "  print(open(f'/proc/{p}/status').read().split('Uid:')[1].split()[0])",
        ).stdout.split()
        assert uids and set(uids) == {str(UID)}, uids
        refused = box.exec("touch", "/etc/rawp-test", check=False)
        assert refused.returncode != 0 and "Read-only file system" in refused.stderr
        home = box.exec("sh", "-c", "echo $HOME").stdout.strip()
        assert home.startswith(STATE + "/")
        box.exec("touch", f"{WORKSPACE}/a", f"{STATE}/b", f"{home}/c", "/tmp/d")


def test_the_healthcheck_passes(engine, token_file):
    """The image's HEALTHCHECK (kept: podman builds with --format docker) runs and succeeds."""
    image = engine.inspect("image", engine.image)
    # podman has it at the top, Docker in Config.
    check = image.get("Healthcheck") or (image.get("Config") or {}).get("Healthcheck")
    assert check and "/healthz" in " ".join(check["Test"]), image.get("Config")
    with engine.volumes() as volumes, engine.gateway(volumes, token_file) as box:
        if engine.name == "podman":
            proc = engine.run("healthcheck", "run", box.name, check=False)
            assert proc.returncode == 0, proc.stdout + proc.stderr
        else:
            end = time.monotonic() + 60
            while (
                status := engine.inspect("container", box.name)["State"]["Health"]["Status"]
            ) != "healthy":
                assert status != "unhealthy" and time.monotonic() < end, status
                time.sleep(0.5)


async def test_a_master_on_the_host_runs_a_demo_turn_and_downloads_a_file(engine, token_file):
    """A demo session over the network with the token: the agent reads a PNG of the workspace,
    the master gets the transfer and the binary result, and downloads the bytes."""
    with engine.volumes() as volumes, engine.gateway(volumes, token_file) as box:
        write_into(box, f"{WORKSPACE}/dot.png", PNG)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{box.url}/v1/agents") as resp:
                assert resp.status == 401  # the token is required beyond /healthz
            session = await create(http, box, agent="demo")
            master = await attach(http, box, session)
            assert (await master.next())["type"] == "session.capabilities"
            frames = await prompt_and_wait(master, "read dot.png")
            (transfer,) = of(frames, "agent.file.transfer")
            (result,) = of(frames, "tool.invoke.result")
            assert result["payload"]["output_type"] == "binary_ref"
            async with http.get(
                box.url + transfer["payload"]["file_url"], headers=box.headers
            ) as got:
                assert got.status == 200 and await got.read() == PNG
            assert of(frames, "session.turn.end")[0]["payload"]["stop_reason"] == "end_turn"
            await master.ws.close()


async def test_claude_code_in_the_image_runs_a_turn_with_a_tool_call(engine, token_file):
    """The real Claude Code binary of the image, spawned by the gateway in the container, against
    the rig's scripted Messages API on the host's loopback: a Bash call the master allows runs in
    the container's workspace, then the answer."""
    calls = bash_then_text("echo made in the image > made.txt", "Write made.txt", "Done: made.txt.")
    server = make_server("claude-code", calls)
    base_url = await server.start()
    try:
        env = claude_env(base_url)
        with engine.volumes() as volumes, engine.gateway(volumes, token_file, env=env) as box:
            async with aiohttp.ClientSession() as http:
                session = await create(http, box, agent="claude-code")
                master = await attach(http, box, session)
                result, end, text = await allowed_bash_turn(master, "Make made.txt.")
                assert result["payload"]["status"] == "success", result
                assert end["payload"]["stop_reason"] == "end_turn"
                assert text == "Done: made.txt."
                await master.ws.close()
            made = box.exec("cat", f"{WORKSPACE}/made.txt").stdout
            assert made == "made in the image\n", box.logs()
            # Its conversation, in the session's HOME on the state volume (the sandbox's).
            home = PurePosixPath(STATE, "state", "sessions", session["session_id"], "home")
            assert "projects" in box.exec("ls", "-a", str(home / ".claude")).stdout.split()
        paths = [r.path for r in server.requests]
        assert sum(p.startswith("/v1/messages") for p in paths) == 2, paths
    finally:
        await server.close()


async def test_stop_suspends_to_the_state_volume_and_a_new_container_restores(engine, token_file):
    """``stop`` (SIGTERM to tini, which passes it on) with one master attached and one that
    reads nothing: the gateway suspends the session and exits 0 within the engine's timeout (not
    SIGKILLed: 137); a new container on the same volumes lists the session, a master reattaches
    with its last message id and the next turn runs."""
    with engine.volumes() as volumes:
        async with aiohttp.ClientSession() as http:
            with engine.gateway(volumes, token_file) as box:
                session = await create(http, box, agent="demo", name="kept")
                sid = session["session_id"]
                master = await attach(http, box, session)
                await master.next()
                await prompt_and_wait(master, "hello there", idle=True)
                last = master.frames[-1]["message_id"]
                stalled = stalled_master(box.url, sid, "hello again", box.headers)
                try:
                    await master.until("session.turn.end")
                    stop = await asyncio.to_thread(
                        engine.run, "stop", "-t", ENGINE_STOP_TIMEOUT, box.name, timeout=60
                    )
                    assert stop.returncode == 0
                finally:
                    stalled.close()
                state = engine.inspect("container", box.name)["State"]
                assert state["ExitCode"] == 0, box.logs()
                closed = await master.drain_until_closed(timeout=10)
                assert master.end is not None and master.end.data == 1012, closed
                last = master.frames[-1]["message_id"]
            with engine.gateway(volumes, token_file) as box:
                async with http.get(f"{box.url}/v1/sessions", headers=box.headers) as resp:
                    listed = (await resp.json())["sessions"]
                assert [(s["session_id"], s["state"], s["name"]) for s in listed] == [
                    (sid, "DETACHED", "kept")
                ]
                master = await attach(http, box, session, last_message_id=last)
                await master.until("session.capabilities")
                frames = await prompt_and_wait(master, "and now?", idle=True)
                assert of(frames, "session.turn.end")
                await master.ws.close()
                info = await (
                    await http.get(f"{box.url}/v1/session/{sid}", headers=box.headers)
                ).json()
                assert info["turn_index"] == 3, json.dumps(info)


def compose(engine: Engine, project: str, *args: str, env: dict[str, str]) -> str:
    """The engine's compose (``docker compose``, or Debian's ``podman-compose``) on
    deploy/docker-compose.yml; its output."""
    command = ["docker", "compose"] if engine.name == "docker" else ["podman-compose"]
    proc = subprocess.run(
        [*command, "-p", project, "-f", str(COMPOSE), *args],
        env={**engine.env, **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


async def test_the_compose_file_brings_the_gateway_up_and_back_with_its_volumes(engine, token_file):
    """deploy/docker-compose.yml's gateway service, with the image of these sources and the
    token from a file: its port published on loopback, healthy, a demo turn; ``down`` (SIGTERM)
    exits 0, and ``up`` again on the same named volumes restores the session."""
    project = f"rawp-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {
        "RAWP_GATEWAY_IMAGE": engine.image,
        "RAWP_GATEWAY_HOST_PORT": str(port),
        "RAWP_GATEWAY_TOKEN_FILE": str(token_file),
    }
    labels = ["--filter", f"label=com.docker.compose.project={project}"]
    box = Container(engine, "", f"http://127.0.0.1:{port}", token_file.read_text().strip())

    def up() -> None:
        compose(engine, project, "up", "-d", "gateway", env=env)
        (box.name,) = engine.run(
            "ps", "-a", *labels, "--filter", "label=com.docker.compose.service=gateway",
            "--format", "{{.Names}}",
        ).stdout.split()  # fmt: skip
        box.wait_ready()

    try:
        up()
        info = engine.inspect("container", box.name)
        assert info["HostConfig"]["ReadonlyRootfs"] is True
        bindings = info["HostConfig"]["PortBindings"]["8765/tcp"]
        assert [(b["HostIp"], b["HostPort"]) for b in bindings] == [("127.0.0.1", str(port))]
        if engine.name == "podman":
            check = engine.run("healthcheck", "run", box.name, check=False)
            assert check.returncode == 0, check.stdout + check.stderr
        async with aiohttp.ClientSession() as http:
            session = await create(http, box, agent="demo", name="composed")
            master = await attach(http, box, session)
            await master.next()
            await prompt_and_wait(master, "hello", idle=True)
            # podman-compose 1.0 stops with -t 1 unless told (stop_grace_period is not read).
            compose(engine, project, "down", "-t", ENGINE_STOP_TIMEOUT, env=env)
            assert engine.run("ps", "-a", "-q", *labels).stdout.split() == []
            await master.drain_until_closed(timeout=10)
            assert master.end is not None and master.end.data == 1012
            up()
            async with http.get(f"{box.url}/v1/sessions", headers=box.headers) as resp:
                listed = (await resp.json())["sessions"]
            assert [(s["name"], s["state"]) for s in listed] == [("composed", "DETACHED")]
    finally:
        compose(engine, project, "down", "-v", "-t", "0", env=env)
        # podman-compose 1.0 leaves its network behind.
        engine.run("network", "rm", "-f", f"{project}_default", check=False)


def process_names(box: Container) -> list[str]:
    return box.exec(
        "python3",
        "-c",
        "import os\nfor p in os.listdir('/proc'):\n if p.isdigit():\n"
        "  print(open(f'/proc/{p}/comm').read().strip())",
    ).stdout.split()


async def test_agents_run_in_the_sandbox_inside_the_container(engine, token_file):
    """The image's config runs agents under bubblewrap; with the settings of SECURITY (the
    manifests' own) the sandbox is made inside the container: the gateway says so, the agent's
    process is bwrap's child, and a turn runs in it."""
    with engine.volumes() as volumes, engine.gateway(volumes, token_file) as box:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{box.url}/v1/agents", headers=box.headers) as resp:
                agents = (await resp.json())["agents"]
            assert {a["isolation"] for a in agents} == {"sandbox"}
            session = await create(http, box, agent="demo")
            assert session["isolation"] == "sandbox"
            master = await attach(http, box, session)
            await master.next()
            frames = await prompt_and_wait(master, "hello from the sandbox", idle=True)
            assert of(frames, "session.turn.end")[0]["payload"]["stop_reason"] == "end_turn"
            assert "bwrap" in process_names(box)
            await master.ws.close()


@pytest.mark.parametrize("without", ["all three", "unmasked_proc", "seccomp"])
def test_without_the_sandbox_settings_the_gateway_refuses_to_start_and_says_why(
    engine, token_file, without
):
    """The engine's defaults (a masked /proc, its seccomp profile), or either one of them alone:
    ``serve`` never runs agents unsandboxed; it exits at once with the line docs/isolation.md
    quotes. (AppArmor is not enabled on the machine the tests run on: its setting cannot be shown
    to matter here.)"""
    security = CONFINED if without == "all three" else {**SECURITY, without: CONFINED[without]}
    with (
        engine.volumes() as volumes,
        engine.gateway(volumes, token_file, security=security, wait=False) as box,
    ):
        end = time.monotonic() + 60
        while box.running():
            assert time.monotonic() < end, box.logs()
            time.sleep(0.1)
        state = engine.inspect("container", box.name)["State"]
        logs = box.logs()
    assert state["ExitCode"] != 0, logs
    assert (
        'rawp-gateway: [isolation] mode = "sandbox": bubblewrap cannot make the agent sandbox '
        "here (bwrap: "
    ) in logs
    assert "docs/isolation.md" in logs
