"""The agent sandbox (docs/isolation.md), tried as an attacker would: ``serve`` runs as an
unprivileged account with an admin token, a users file, a webhook secret, an audit log and a state
dir (tests/support/sandbox_rig.py); alice's session runs a hostile agent
(tests/support/hostile/escapes.py), bob owns another session. Every escape that worked without the
sandbox fails in it, while the agent still writes its workspace, /tmp and HOME and runs children;
floods of processes and memory hit the limits while bob's turn completes. And the sandbox is never
silently missing: no ``bwrap``, no start."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from typing import Any

import aiohttp
import pytest

from tests.support.gateway_peer import (
    create_session,
    fast_demo,
    make_config,
    prompt_and_wait,
    start_gateway,
)
from tests.support.loops import LOOPS, run
from tests.support.procs import alive, descendants, session_processes
from tests.support.sandbox_rig import SECRET, Deployment, deployment
from tests.support.servers import CLI
from tests.support.waiting import eventually


async def turn(dep: Deployment, http: aiohttp.ClientSession, user: str, session: dict, text: str):
    """One prompt on the session, as ``user``: the frames of its turn."""
    master = await dep.attach(http, user, session)
    try:
        return await prompt_and_wait(master, text, timeout=60)
    finally:
        await master.ws.close()


async def hostile_turn(
    dep: Deployment, http: aiohttp.ClientSession, plan: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """alice's hostile agent, one turn with ``plan``: what it found, the turn's frames, and the
    session."""
    session = await dep.create(http, "alice", "hostile")
    report = dep.workspace("alice") / "escapes.json"
    report.unlink(missing_ok=True)
    frames = await turn(dep, http, "alice", session, json.dumps(plan))
    return json.loads(report.read_text()), frames, session


def refused_or_empty(result: dict[str, Any]) -> bool:
    return not result["ok"] or not result["value"]


@pytest.mark.sandbox
async def test_every_escape_fails_and_the_agent_still_works(tmp_path):
    async with deployment() as dep, aiohttp.ClientSession() as http:
        bob = await dep.create(http, "bob", "demo")
        bob_turn = await turn(dep, http, "bob", bob, "think about it")
        assert bob_turn[-2]["type"] == "session.turn.end"
        bob_agent = session_processes(bob["session_id"], "demo_agent")
        assert bob_agent, "bob's long-lived agent runs"
        bob_dir = dep.state / "sessions" / bob["session_id"]
        gateway = dep.proc.pid
        plan = {
            "read": [
                str(dep.files["config"]),
                str(dep.files["token"]),
                str(dep.files["users"]),
                str(dep.files["hook"]),
                str(dep.files["audit"]),
                str(dep.files["bob_secret"]),
                str(bob_dir / "session.json"),
                str(bob_dir / "frames.log"),
            ],
            "list": [
                str(dep.base / "work"),
                str(dep.workspace("bob")),
                str(dep.state),
                str(dep.state / "sessions"),
            ],
            "plant": [str(dep.workspace("bob") / "planted.txt"), str(bob_dir / "planted.txt")],
            "kill": [*bob_agent, gateway],
            "proc": [gateway, *bob_agent],
        }
        found, frames, alice = await hostile_turn(dep, http, plan)

        # The admin token (or any gateway setting): not in its environment, nor in what the
        # sandbox's pid 1 (bwrap) was started with.
        assert found["gateway_env"] == {}
        assert found["pid1_environ"]["ok"] and found["pid1_gateway_vars"] == []
        assert SECRET not in found["pid1_environ"]["value"]
        # Every file the gateway read a secret or setting from, the other workspace, the state
        # dir's records and frames: absent, or (the config under the read-only /etc) empty.
        for path, result in found["read"].items():
            assert refused_or_empty(result), (path, result)
        if dep.config.is_relative_to("/etc"):  # under the read-only /etc, as in the image
            assert found["read"][str(dep.files["config"])] == {"ok": True, "value": ""}
        for path, result in found["list"].items():
            # At most the mount points on the way to its own workspace and HOME.
            own = {"alice", "sessions", alice["session_id"]}
            assert not result["ok"] or set(result["value"]) <= own, (path, result)
        # Nothing planted, nothing killed, no other process seen or traced.
        assert not (dep.workspace("bob") / "planted.txt").exists()
        assert not (bob_dir / "planted.txt").exists()
        for pid, result in found["kill"].items():
            assert not result["ok"], (pid, result)
        for what, result in found["proc"].items():
            assert not result["ok"], (what, result)
        assert gateway not in found["proc_pids"] and not set(bob_agent) & set(found["proc_pids"])
        assert len(found["proc_pids"]) < 10, found["proc_pids"]  # bwrap's, its own, its child's
        assert dep.proc.poll() is None and all(alive(pid) for pid in bob_agent)

        # And the agent still works: its workspace, /tmp, its own HOME, a child.
        assert found["workspace"] == {"ok": True, "value": "mine"}
        assert found["tmp"] == {"ok": True, "value": "mine"}
        assert found["home_write"] == {"ok": True, "value": "mine"}
        assert found["child"] == {"ok": True, "value": "child ran"}
        home = dep.state / "sessions" / alice["session_id"] / "home"
        assert found["home"] == str(home)
        assert (home / "agent-home.txt").read_text() == "mine"
        assert (dep.workspace("alice") / "written-by-agent.txt").read_text() == "mine"
        assert any(f["type"] == "agent.text.delta" for f in frames) or frames

        # Its last resort, SIGKILL to every process it may signal, ends its own sandbox only.
        await hostile_turn(dep, http, {"kill_all": True})
        assert dep.proc.poll() is None and all(alive(pid) for pid in bob_agent)
        # bob's session goes on.
        again = await turn(dep, http, "bob", bob, "list files")
        assert again[-2]["type"] == "session.turn.end"
        # The isolation in force is said.
        async with http.get(dep.url + "/v1/agents", headers=dep.headers("bob")) as resp:
            body = await resp.json()
            assert resp.status == 200, body
            agents = body["agents"]
        assert {a["isolation"] for a in agents} == {"sandbox"}
        assert alice["isolation"] == "sandbox"


async def test_without_the_sandbox_the_same_agent_escapes(tmp_path):
    """The control: the same hostile agent with mode = "none" reads the token file and bob's
    notes, and the gateway's own environment (the token in it) through /proc, which is what the
    sandbox is for; only its own environment is clean, in every mode."""
    async with deployment(mode="none") as dep, aiohttp.ClientSession() as http:
        plan = {
            "read": [str(dep.files["token"]), str(dep.files["bob_secret"])],
            "proc": [dep.proc.pid],
        }
        found, _, session = await hostile_turn(dep, http, plan)
        assert session["isolation"] == "none"
        assert found["gateway_env"] == {}
        assert all(r["ok"] and SECRET in r["value"] for r in found["read"].values())
        assert SECRET in found["proc"][f"{dep.proc.pid}/environ"]["value"]


@pytest.mark.sandbox
async def test_limits_hold_for_the_agent_tree_while_another_session_goes_on(tmp_path):
    """A flood of 300 processes stops at max_processes (100, the sandbox's own count, bwrap's
    init included), one allocation over max_memory_mb fails, and an agent that dies of it ends
    with an agent.error naming the limit; meanwhile bob's turn completes."""
    async with deployment() as dep, aiohttp.ClientSession() as http:
        bob = await dep.create(http, "bob", "demo")
        found, _, _ = await hostile_turn(dep, http, {"flood": 300, "alloc_mb": 1024})
        assert 50 < found["flood"]["started"] < 100, found["flood"]
        assert "Resource temporarily unavailable" in found["flood"]["error"]
        assert not found["alloc"]["ok"] and "MemoryError" in found["alloc"]["error"]
        bob_turn = await turn(dep, http, "bob", bob, "list files")
        assert bob_turn[-2]["type"] == "session.turn.end"

        # Flood and bob's turn at the same time.
        flooding = asyncio.ensure_future(hostile_turn(dep, http, {"flood": 300}))
        bob_turn = await turn(dep, http, "bob", bob, "think about it")
        assert bob_turn[-2]["type"] == "session.turn.end"
        assert (await flooding)[0]["flood"]["started"] < 100

        session = await dep.create(http, "alice", "hostile")
        master = await dep.attach(http, "alice", session)
        await master.send(
            "control.prompt.request", {"prompt_text": json.dumps({"die_alloc_mb": 1024})}
        )
        error = await master.until("agent.error", timeout=60)
        assert error["payload"]["severity"] == "fatal"
        assert "max_memory_mb (512)" in error["payload"]["message"], error
        assert dep.proc.poll() is None


async def test_serve_refuses_to_start_without_bwrap(tmp_path):
    """One line that says what is missing and how to fix it; exit 2."""
    (tmp_path / "gateway.toml").write_text(
        f'[server]\nworkspace_root = "{tmp_path}"\n[isolation]\nmode = "sandbox"\n'
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    done = subprocess.run(
        [*CLI, "serve", "--config", str(tmp_path / "gateway.toml"), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PATH": str(bin_dir)},
    )
    assert done.returncode == 2
    assert done.stderr == (
        'rawp-gateway: [isolation] mode = "sandbox": [isolation] mode = "sandbox" needs bwrap on '
        "PATH: install Debian's bubblewrap (apt-get install bubblewrap; "
        'scripts/install-bubblewrap.sh) or set [isolation] mode = "none"\n'
    )


@pytest.mark.sandbox
async def test_serve_refuses_to_start_where_user_namespaces_are_refused(tmp_path):
    """bwrap is there but the kernel (here: a sandbox that allows no more user namespaces)
    refuses it: serve says so, and how to fix it."""
    (tmp_path / "gateway.toml").write_text(
        f'[server]\nworkspace_root = "{tmp_path}"\n[isolation]\nmode = "sandbox"\n'
    )
    done = subprocess.run(
        [
            "bwrap",
            "--dev-bind",
            "/",
            "/",
            "--unshare-user",
            "--disable-userns",
            "--",
            *CLI,
            "serve",
            "--config",
            str(tmp_path / "gateway.toml"),
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line
    assert line.startswith(
        'rawp-gateway: [isolation] mode = "sandbox": bubblewrap cannot make the agent sandbox here'
    )
    assert "user namespaces are likely refused" in line and 'mode = "none"' in line


async def test_a_session_whose_sandbox_cannot_be_made_fails_and_its_agent_never_runs(
    tmp_path, monkeypatch
):
    """bwrap gone after the start: 502 AGENT_START_FAILED with the reason, no agent process."""
    from gateway.agent.sandbox import Isolation

    config = make_config(
        tmp_path, agents={"demo": fast_demo()}, isolation=Isolation(mode="sandbox")
    )
    client = await start_gateway(config)
    try:
        monkeypatch.setenv("PATH", str(tmp_path))
        for agent in ("demo", "plain"):  # long-lived, and one process per prompt
            resp = await client.post("/v1/session", json={"agent": agent})
            assert resp.status == 502
            body = await resp.json()
            assert body["error_code"] == "AGENT_START_FAILED"
            assert "needs bwrap on PATH" in body["message"]
        assert (await (await client.get("/v1/sessions")).json())["sessions"] == []
    finally:
        await client.close()


async def test_isolation_none_is_said_too(tmp_path):
    client = await start_gateway(make_config(tmp_path, agents={"demo": fast_demo()}))
    try:
        session = await create_session(client)
        assert session["isolation"] == "none"
        agents = (await (await client.get("/v1/agents")).json())["agents"]
        assert {a["isolation"] for a in agents} == {"none"}
        # Still listed once a session has ended (its summary declares nothing).
        await client.delete(f"/v1/session/{session['session_id']}")
        resp = await client.get("/v1/agents")
        assert resp.status == 200 and len((await resp.json())["agents"]) == len(agents)
    finally:
        await client.close()


def said_at_start(tmp_path, config: str) -> str:
    """What ``serve`` with ``config`` (after its ``[server]`` line) logs until it listens."""
    (tmp_path / "gateway.toml").write_text(f'[server]\nworkspace_root = "{tmp_path}"\n{config}')
    proc = subprocess.Popen(
        [*CLI, "serve", "--config", str(tmp_path / "gateway.toml"), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        while not lines or "listening" not in lines[-1]:
            line = proc.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        return "".join(lines)
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_a_team_without_the_sandbox_is_warned(tmp_path):
    """With a users file and mode = "none", serve says at start (one line) what that means."""
    (tmp_path / "users.toml").write_text("")
    said = said_at_start(tmp_path, f'[auth]\nusers_file = "{tmp_path}/users.toml"\n')
    assert (
        'several users and [isolation] mode = "none": every agent can read every '
        "session's files and the gateway's secrets (docs/isolation.md)"
    ) in said


TRAPS_TERM = """
import os, signal, subprocess, sys, time
child = subprocess.Popen(["sleep", "60"], start_new_session=True)
print(child.pid, flush=True)
def term(*_):
    print("got SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("ready", flush=True)
time.sleep(60)
"""


def _sandbox(tmp_path):
    from gateway.agent.sandbox import Isolation, SpawnSandbox

    (tmp_path / "ws").mkdir()
    (tmp_path / "home").mkdir()
    box = SpawnSandbox(
        Isolation(mode="sandbox"),
        workspace=str(tmp_path / "ws"),
        home=str(tmp_path / "home"),
        hidden=(),
    )
    return box, str(tmp_path / "ws")


@pytest.mark.sandbox
async def test_a_stop_reaches_the_agent_not_bubblewrap_and_its_leftovers_end_with_it(tmp_path):
    """SIGTERM goes to the agent inside (its handler runs, it exits 0), never to bwrap, which
    would end the whole sandbox at once with SIGKILL; what it started, even in a session of its
    own, ends with the sandbox."""
    from gateway.agent.process import AgentProcess

    box, ws = _sandbox(tmp_path)
    proc = await AgentProcess.start(
        ["/usr/bin/python3", "-c", TRAPS_TERM], env={}, session_id="s", workspace=ws, sandbox=box
    )
    try:
        (await proc.readline())  # the child's pid inside: not ours to see
        assert (await proc.readline()).line == b"ready"
        inside = descendants(proc.pid)
        status = await proc.terminate(grace=10)
        assert (status.kind, status.returncode) == ("ok", 0)
        assert (await proc.readline()).line == b"got SIGTERM"
        await eventually(lambda: not any(alive(p) for p in inside), "the sandbox to end")
    finally:
        await proc.aclose()


@LOOPS
@pytest.mark.sandbox
def test_a_single_turn_agents_wide_stdout_holds_in_the_sandbox(loop_factory, tmp_path):
    """The wide stdout pipe the gateway makes is bubblewrap's fd 1, so the agent inside has it: a
    Node-like exit with more written than a default pipe or socket pair holds loses nothing, and
    the agent has exactly fds 0, 1 and 2."""
    from gateway.agent.process import WIDE_STDOUT_PIPE_BYTES, AgentProcess
    from tests.agent.test_process import EXITS_DROPPING_THE_REST, began

    box, ws = _sandbox(tmp_path)
    script = "import os; print(sorted(os.listdir('/proc/self/fd')), flush=True)\n"

    async def scenario() -> tuple[bytes, bytes]:
        proc = await AgentProcess.start(
            ["/usr/bin/python3", "-c", script + EXITS_DROPPING_THE_REST],
            env={},
            session_id="s",
            workspace=ws,
            sandbox=box,
            high_water=1024,
            stdout_pipe_bytes=WIDE_STDOUT_PIPE_BYTES,
        )
        await began(proc)
        await eventually(lambda: proc.stdout_pauses == 1, "the reader held by backpressure")
        assert (await proc.wait()).kind == "ok"
        lines = [item.line async for item in proc]
        return lines[0], lines[-1]

    fds, last = run(loop_factory, scenario())
    assert fds == b"['0', '1', '2', '3']"  # 3: the listing's own
    assert last == b'{"type": "result"}'


@pytest.mark.sandbox
async def test_an_agent_killed_in_the_sandbox_is_reported_as_killed(tmp_path):
    from gateway.agent.process import AgentProcess

    box, ws = _sandbox(tmp_path)
    proc = await AgentProcess.start(
        ["/usr/bin/python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
        env={},
        session_id="s",
        workspace=ws,
        sandbox=box,
    )
    status = await proc.wait()
    proc.close()
    assert (status.kind, status.signal_name) == ("signal", "SIGKILL")


async def test_saved_conversations_are_read_from_the_callers_own_sessions_homes_only(tmp_path):
    """In sandbox mode each agent saves its conversations in its session's HOME: alice lists
    and continues hers (the new session starts from a copy of that HOME), bob, working in the
    same workspace, neither sees nor continues it; the gateway's own HOME is not read."""
    import sys
    from dataclasses import replace

    from gateway.agent.profiles import builtin_profiles
    from gateway.agent.sandbox import Isolation
    from gateway.server import SESSIONS
    from parsers.claude_code.saved import slug
    from tests.support.auth import users_config
    from tests.support.saved import conversation

    agent = "claude-code-oneshot"  # single-turn: nothing is spawned before a prompt
    profile = replace(builtin_profiles()[agent], command=(sys.executable, "-c", "pass", "{prompt}"))
    workspace = tmp_path / "root" / "shared"
    workspace.mkdir(parents=True)
    tokens = {"alice": ("operator", "alice-token-aaaa"), "bob": ("operator", "bob-token-bbbb")}
    config = users_config(
        workspace.parent, tokens, agents={agent: profile}, isolation=Isolation(mode="sandbox")
    )
    gw = await start_gateway(config)

    def auth(user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {tokens[user][1]}"}

    async def listed(user: str) -> list[str]:
        resp = await gw.get(
            f"/v1/agents/{agent}/conversations", params={"workspace": "shared"}, headers=auth(user)
        )
        assert resp.status == 200, await resp.text()
        return [c["id"] for c in (await resp.json())["conversations"]]

    async def created(user: str, **body: Any) -> Any:
        return await gw.post(
            "/v1/session",
            json={"agent": agent, "workspace_path": "shared", **body},
            headers=auth(user),
        )

    try:
        alice = await (await created("alice")).json()
        await (await created("bob")).json()
        home = gw.server.app[SESSIONS][alice["session_id"]].sandbox().home
        store = os.path.join(home, ".claude", "projects", slug(str(workspace)))
        os.makedirs(store)
        conversation_id = "5e551011-0000-4000-8000-000000000042"
        with open(os.path.join(store, f"{conversation_id}.jsonl"), "wb") as f:
            f.write(conversation(workspace))

        assert await listed("alice") == [conversation_id]
        assert await listed("bob") == []
        resp = await created("bob", resume_conversation=conversation_id)
        assert resp.status == 404 and (await resp.json())["error_code"] == "CONVERSATION_NOT_FOUND"

        resp = await created("alice", resume_conversation=conversation_id)
        assert resp.status == 201, await resp.text()
        again = await resp.json()
        assert again["agent_session_id"] == conversation_id
        copied = gw.server.app[SESSIONS][again["session_id"]].sandbox().home
        assert copied != home
        with open(
            os.path.join(
                copied, ".claude", "projects", slug(str(workspace)), f"{conversation_id}.jsonl"
            ),
            "rb",
        ) as f:
            assert f.read() == conversation(workspace)
    finally:
        await gw.close()


COUNTS = (
    "import os; p = os.path.join(os.environ['HOME'], 'count.txt'); "
    "n = int(open(p).read()) + 1 if os.path.exists(p) else 1; "
    "open(p, 'w').write(str(n)); print(f'turn {n} in', os.environ['HOME'])"
)


@pytest.mark.sandbox
async def test_the_home_is_kept_with_the_session_across_a_restart(tmp_path):
    """With a state dir, the agent's HOME is the session's own directory there: what the agent
    kept in it is there again after the gateway restarts, and goes when the session is deleted."""
    from gateway.agent.profiles import AgentProfile, parser_features
    from gateway.agent.sandbox import Isolation

    profile = AgentProfile(
        name="counter",
        parser="plain",
        command=("/usr/bin/python3", "-c", COUNTS, "{prompt}"),
        single_turn_process=True,
        features=parser_features("plain"),
    )
    state = tmp_path / "state"
    (tmp_path / "work").mkdir()

    def config():
        return make_config(
            tmp_path / "work",
            agents={"counter": profile},
            state_dir=state,
            isolation=Isolation(mode="sandbox"),
        )

    async def said(gw, sid: str) -> str:
        from tests.support.gateway_peer import Master

        master = await Master.attach(gw, sid)
        frames = await prompt_and_wait(master, "count")
        await master.ws.close()
        return "".join(f["payload"]["text"] for f in frames if f["type"] == "agent.text.delta")

    gw = await start_gateway(config())
    sid = (await create_session(gw, "counter"))["session_id"]
    home = state / "sessions" / sid / "home"
    assert (await said(gw, sid)).strip() == f"turn 1 in {home}"
    await gw.server.close()
    await gw.close()
    gw = await start_gateway(config())
    try:
        assert (await said(gw, sid)).strip() == f"turn 2 in {home}"
        assert (await gw.delete(f"/v1/session/{sid}")).status in (200, 204)
        await eventually(lambda: not home.exists(), "the HOME to go with the session")
    finally:
        await gw.close()


@pytest.mark.sandbox
def test_serve_in_sandbox_mode_as_root_says_what_root_means(tmp_path):
    """Warned at start exactly when serve runs as root (uid 0 gets no process limit, and reads
    what root reads)."""
    said = said_at_start(tmp_path, '[isolation]\nmode = "sandbox"\n')
    assert ("running as root: sandboxed agents read" in said) == (os.geteuid() == 0), said
