"""The ``rawp-gateway`` command as a user runs it: ``serve`` in a real process (graceful shutdown on
SIGTERM, no agent left behind), ``translate`` on a recorded fixture, clear errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys

import aiohttp

from tests.support.gateway_peer import Master
from tests.support.paths import FIXTURES
from tests.support.procs import alive, session_processes
from tests.support.serve_process import attached, serve
from tests.support.servers import CLI, free_port, user_headers, wait_http
from tests.support.waiting import eventually

CLAUDE_CODE = FIXTURES / "claude-code"


async def test_serve_sigterm_ends_sessions_the_DPS_way_and_leaves_no_agent(tmp_path):
    """DPS-17.2.3-signals, DPS-7.5.3-cleanup, DPS-7.7-deleted on gateway shutdown."""
    env = dict(os.environ, RAWP_DEMO_DELAY_MS="200")
    args = ("--workspace-root", str(tmp_path), "--log-format", "json")
    async with serve(*args, env=env) as (proc, url):
        async with aiohttp.ClientSession(headers=user_headers(url)) as http:
            master = await attached(http, url, "demo")
            sid = master.session_id
            await master.send(
                "control.prompt.request", {"prompt_text": "tell me a long story " * 10}
            )
            await master.until("agent.text.delta", timeout=20)  # the agent is streaming
            async with http.get(url + "/v1/session/" + sid) as resp:
                assert (await resp.json())["state"] == "RUNNING"
            agent_pids = session_processes(sid, "gateway.demo_agent")
            assert agent_pids, "the demo agent process should be running"
            proc.send_signal(signal.SIGTERM)
            await master.drain_until_closed(timeout=20)
        frames = master.frames
        types = master.types()
        assert types[-1] == "session.deleted"
        assert frames[-1]["payload"]["reason"] == "error"
        end = types.index("session.turn.end")
        assert frames[end]["payload"]["stop_reason"] == "error"
        assert types[end + 1] == "session.usage"
        assert proc.wait(timeout=20) == 0
        assert not [p for p in agent_pids if alive(p)]
        # the log says which workspace root it serves
        assert proc.stderr is not None
        logs = [
            json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith(b"{")
        ]
        listening = next(r for r in logs if r["msg"] == "listening")
        assert listening["workspace_root"] == str(tmp_path.resolve())


def test_serve_refuses_a_public_address_without_a_token(tmp_path):
    done = subprocess.run(
        [*CLI, "serve", "--host", "0.0.0.0", "--port", "0", "--workspace-root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if not k.startswith("RAWP_GATEWAY_")},
    )
    assert done.returncode == 2  # a setting error, as docs/configuration.md says
    message = done.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert message.startswith("rawp-gateway: refusing to listen on 0.0.0.0 without a token")
    assert "--workspace-root" in message  # a token needs it too


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)


def test_an_unknown_option_shows_the_subcommands_usage():
    done = _cli("serve", "--bogus")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: rawp-gateway serve ")
    assert "rawp-gateway serve: error: unrecognized arguments: --bogus" in done.stderr


def test_every_subcommands_help_has_a_description_and_its_defaults():
    top = _cli("--help").stdout
    for command in ("serve", "translate", "demo", "chat"):
        done = _cli(command, "--help")
        assert done.returncode == 0
        usage, description, *rest = done.stdout.split("\n\n")
        assert usage.startswith(f"usage: rawp-gateway {command} ")
        # one line (a sentence), the same words as the top-level list gives it
        assert "\n" not in description and description.endswith(".")
        assert " ".join(description[:-1].lower().split()[:3]) in " ".join(top.lower().split())
        # each option (an entry starts at a line indented by two) says its default
        entries = re.split(r"^  (?=-)", "\n\n".join(rest), flags=re.M)[1:]
        assert len(entries) >= 3, done.stdout
        for entry in entries:
            flag, said = entry.split()[0], " ".join(entry.split())
            if flag not in ("-h,", "--ui", "--forward-unknown", "--yes", "--no", "--keep"):
                assert "default" in said or "required" in said, (command, said)
    assert "(default claude-code)" in " ".join(_cli("translate", "--help").stdout.split())


def test_translate_names_the_parser_another_agents_lines_look_like():
    """Codex's output given to the Claude Code parser: after a few unknown lines, one line says
    which parser knows them."""
    fixture = FIXTURES / "codex" / "text.jsonl"
    done = subprocess.run(
        [*CLI, "translate", "--agent", "claude-code", str(fixture)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    hints = [line for line in done.stderr.splitlines() if "look like" in line]
    assert hints == [
        "translate: these lines look like codex's, not claude-code's: try --agent codex"
    ]
    # ... and nothing of the kind for the right parser
    right = _cli("translate", "--agent", "codex", str(fixture))
    assert "look like" not in right.stderr


def test_serve_config_errors_are_one_clear_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nport = 'x'\n")
    done = subprocess.run(
        [*CLI, "serve", "--config", str(bad)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == f"rawp-gateway: {bad} [server]: port must be an integer from 0 to 65535, got 'x'"
    )


def test_translate_a_recorded_fixture():
    """translate writes only frames on stdout: capabilities, catalog, commands, then turns."""
    fixture = CLAUDE_CODE / "tool-bash--partial.jsonl"
    sid = "0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a"
    done = subprocess.run(
        [*CLI, "translate", "--agent", "claude-code", "--session-id", sid, str(fixture)],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    frames = [json.loads(line) for line in done.stdout.splitlines()]
    types = [f["type"] for f in frames]
    assert types[0] == "session.capabilities"
    # §18.3: the CLI's session id, announced again once init reports it
    assert types[1] == "session.capabilities"
    init = json.loads(fixture.read_bytes().splitlines()[0])
    assert frames[1]["payload"]["extensions"] == {"agent_session_id": init["session_id"]}
    assert types[2:4] == ["tool.catalog.publish", "agent.commands.publish"]
    assert types[4] == "session.turn.start"
    assert types[-3:] == ["session.turn.end", "session.usage", "agent.state.changed"]
    assert all(f["session_id"] == sid for f in frames)
    assert "tool.invoke.request" in types and "tool.invoke.result" in types
    # the same through stdin
    piped = subprocess.run(
        [*CLI, "translate", "-"], input=fixture.read_bytes(), capture_output=True, timeout=60
    )
    assert [json.loads(x)["type"] for x in piped.stdout.splitlines()] == types


def test_translate_reports_bad_lines_on_stderr_only():
    lines = (CLAUDE_CODE / "text.jsonl").read_bytes() + b"this is not json\n"
    done = subprocess.run([*CLI, "translate"], input=lines, capture_output=True, timeout=60)
    assert done.returncode == 0
    for line in done.stdout.splitlines():
        json.loads(line)  # stdout stays pure JSON lines
    assert b"not valid" in done.stderr


def test_translate_unknown_agent_and_missing_file():
    done = subprocess.run(
        [*CLI, "translate", "--agent", "nope", "x"], capture_output=True, timeout=60
    )
    assert done.returncode == 2
    done = subprocess.run([*CLI, "translate", "/no/such/file"], capture_output=True, timeout=60)
    assert done.returncode == 2 and b"cannot read" in done.stderr


def test_translate_into_a_closed_pipe_stops_quietly(tmp_path):
    """``translate FILE | head -1``: the reader leaves after one line; translate stops as a tool
    killed by SIGPIPE would (141), with no traceback on stderr."""
    lines = tmp_path / "many.txt"  # far more output than a pipe buffers, so a write must fail
    lines.write_text("a line of the agent's output\n" * 20_000)
    proc = subprocess.Popen(
        [*CLI, "translate", "--agent", "plain", str(lines)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    json.loads(proc.stdout.readline())
    proc.stdout.close()  # as head -1 does
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err


def test_serve_with_a_token_needs_an_explicit_workspace_root(tmp_path):
    """With a token others reach the gateway: it does not serve whatever directory it was started
    in; the error says how to set the root."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAWP_GATEWAY_")}
    done = subprocess.run(
        [*CLI, "serve", "--port", "0", "--token-file", str(token)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert "workspace_root must be set" in done.stderr and "--workspace-root" in done.stderr


def _serve_fails(tmp_path, *args: str, env: dict[str, str] | None = None) -> str:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RAWP_GATEWAY_")}
    done = subprocess.run(
        [*CLI, "serve", "--port", "0", "--workspace-root", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**environ, **(env or {})},
    )
    assert done.returncode == 2  # docs/configuration.md: exit 2, one line
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # one line, no traceback
    return done.stderr.strip()


def test_serve_bad_host_or_empty_token_is_one_line_and_a_failure(tmp_path):
    assert "host must be" in _serve_fails(tmp_path, "--host", "127.0.0.1 ")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        message = _serve_fails(tmp_path, "--host", "127.0.0.1", "--port", port)
    assert message == (
        f"rawp-gateway: cannot listen on 127.0.0.1:{port}: port {port} is in use "
        "(another gateway? --port 0 picks a free one)"
    )
    (tmp_path / "token").write_text("s3cret\n")
    message = _serve_fails(
        tmp_path, "--token-file", str(tmp_path / "token"), env={"RAWP_GATEWAY_TOKEN": ""}
    )
    assert "RAWP_GATEWAY_TOKEN is set but empty" in message


def test_serve_with_an_unusable_state_dir_is_one_clear_line(tmp_path):
    """A state_dir that is a file (or cannot be created) stops the gateway before it listens,
    with one line naming the directory, not a traceback."""
    state = tmp_path / "state"
    state.write_text("not a directory\n")
    message = _serve_fails(tmp_path, "--state-dir", str(state))
    assert message.startswith(
        f"rawp-gateway: state_dir {str(state)!r} cannot be used: Not a directory"
    )


async def test_a_restart_after_a_crash_kills_what_the_old_agents_left_running(tmp_path):
    """A SIGKILLed gateway runs no shutdown: an agent that ignores its closed stdin (here a
    single-turn agent asleep in its work) goes on. The gateway restarted on the same state_dir
    kills it before the restored session's next prompt could start another beside it."""
    state, config = tmp_path / "state", tmp_path / "gateway.toml"
    sleeper = "import sys, time; print('working on', sys.argv[1], flush=True); time.sleep(600)"
    config.write_text(
        "[agents.sleeper]\nparser = 'plain'\nsingle_turn_process = true\n"
        f"command = [{json.dumps(sys.executable)}, '-c', {json.dumps(sleeper)}, '{{prompt}}']\n"
    )
    argv = [*CLI, "serve", "--config", str(config), "--workspace-root", str(tmp_path)]
    port = free_port()
    argv += ["--port", str(port), "--state-dir", str(state)]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE)
    agents: list[int] = []
    try:
        await wait_http(url, proc)
        async with aiohttp.ClientSession(headers=user_headers(url)) as http:
            async with http.post(url + "/v1/session", json={"agent": "sleeper"}) as resp:
                sid = (await resp.json())["session_id"]
            ws = await http.ws_connect(url + f"/v1/session/{sid}/ws", protocols=("rawp-dps-1.0",))
            master = Master(ws, sid)
            await master.send("control.prompt.request", {"prompt_text": "the report"})
            await master.until("agent.text.delta", timeout=20)
            agents = session_processes(sid)
            assert agents
            proc.kill()
            proc.wait()
            await asyncio.sleep(0.5)
            assert all(alive(p) for p in agents)  # the old gateway's agent goes on

            proc = subprocess.Popen(argv, stderr=subprocess.PIPE)
            await wait_http(url, proc)
            # A new gateway, a new token in the port's file: the client reads it again.
            async with http.get(url + f"/v1/session/{sid}", headers=user_headers(url)) as resp:
                assert resp.status == 200  # restored
        await eventually(lambda: not any(alive(p) for p in agents), "the old agents to be killed")
    finally:
        for pid in agents:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_demo_ui_ends_with_exit_0_on_ctrl_c(tmp_path):
    """`demo --ui` runs until Ctrl-C, which is how it is meant to end: SIGINT → exit 0, no
    traceback."""
    proc = subprocess.Popen(
        [*CLI, "demo", "--ui", "--workspace-root", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        assert lines[1].startswith("browser console: http://127.0.0.1:"), lines
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
