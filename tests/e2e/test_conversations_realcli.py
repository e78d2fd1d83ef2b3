"""Picking up a conversation the real Claude Code CLI had on its own (marked ``realcli``).

The pinned CLI is run directly, not through the gateway, against the rig's scripted Messages API
(thinking, a Bash call and its result, text) with a throwaway HOME; then a real gateway whose
profile has that HOME lists the conversation it saved and continues it: the model's next request
carries the earlier messages, and a master that attaches gets the earlier turn as frames marked
``metadata.rawp_replayed`` before the live one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.agent.profiles import builtin_profiles
from gateway.server import SESSIONS
from tests.support.gateway_peer import Master, make_config, start_gateway
from tests.support.paths import RIG
from tests.support.rig.anthropic import last_user_text
from tests.support.rig.env import require_cli
from tests.support.rig.run import CliSetup, scripted_cli
from tests.support.rig.scenario import parse_scenario

pytestmark = pytest.mark.realcli

SCENARIO = RIG / "scenarios" / "claude-code-e2e"
LIMIT_SEC = 90.0
FIRST_PROMPT = "Remember the number 42."
SECOND_PROMPT = "Which number did I ask you to remember?"


# The conversation is had in a workspace whose name has characters the CLI's directory name (its
# "slug") replaces: the gateway must find it where the real CLI put it.
WORKSPACE = "my.project_dir 2"


@dataclass
class Rig:
    cli: CliSetup
    gw: TestClient
    conversation_id: str
    profile: str

    @property
    def workspace(self) -> Path:
        return self.cli.cwd / WORKSPACE

    async def resume(self) -> dict[str, Any]:
        """A new session of the rig's profile that continues the terminal's conversation."""
        body = {
            "agent": self.profile,
            "workspace_path": WORKSPACE,
            "resume_conversation": self.conversation_id,
        }
        resp = await self.gw.post("/v1/session", json=body)
        assert resp.status == 201, await resp.text()
        return await resp.json()


async def in_terminal(cli: CliSetup, cwd: Path, *argv: str) -> bytes:
    """The user's own terminal run of ``argv`` in ``cwd`` with the rig's environment; what it
    printed (it must succeed)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=cli.env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    return out


async def run_cli_directly(cli: CliSetup, conversation_id: str) -> None:
    """The user's own terminal run: ``claude -p`` in the workspace, with the rig's HOME."""
    (cli.cwd / WORKSPACE).mkdir()
    out = await in_terminal(
        cli,
        cli.cwd / WORKSPACE,
        *cli.argv[:1],
        "-p",
        FIRST_PROMPT,
        "--output-format",
        "stream-json",
        "--verbose",
        "--dangerously-skip-permissions",
        "--session-id",
        conversation_id,
    )
    assert b"I will remember 42." in out


@contextlib.asynccontextmanager
async def rig(profile: str = "claude-code") -> AsyncIterator[Rig]:
    require_cli("claude-code")
    async with scripted_cli(SCENARIO / "conversation.toml") as cli, asyncio.timeout(LIMIT_SEC):
        conversation_id = str(uuid.uuid4())
        await run_cli_directly(cli, conversation_id)
        base = builtin_profiles(claude=str(cli.binary))[profile]
        # The profile's env sets HOME: the agent's store is the rig HOME's, as the CLI's was.
        prof = replace(base, env=cli.env)
        client = await start_gateway(make_config(cli.cwd, agents={profile: prof}))
        try:
            yield Rig(cli, client, conversation_id, profile)
        finally:
            await client.close()


async def listing(gw: TestClient, agent: str, workspace: Path, **query: Any) -> Any:
    resp = await gw.get(
        f"/v1/agents/{agent}/conversations", params={"workspace": str(workspace), **query}
    )
    return resp.status, await resp.json()


def replayed(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if (f.get("metadata") or {}).get("rawp_replayed") is True]


async def ask_what_was_remembered(master: Master) -> list[str]:
    """``SECOND_PROMPT`` as a live turn, read to its end; the live (not replayed) agent texts the
    master has."""
    await master.send("control.prompt.request", {"prompt_text": SECOND_PROMPT})
    await master.until("session.turn.end", timeout=60)
    return [
        f["payload"]["text"]
        for f in master.frames
        if f["type"] == "agent.text.delta" and not replayed([f])
    ]


async def listed_and_continued(
    gw: TestClient, agent: str, workspace: Path, conversation_id: str
) -> tuple[list[str], list[str]]:
    """The terminal's one-turn conversation (``FIRST_PROMPT``, whose tool printed "forty-two") is
    listed for ``workspace``, resumed with its turn replayed first, and continued live with
    a second prompt; the replayed and the live agent texts."""
    status, body = await listing(gw, agent, workspace)
    assert status == 200, body
    (only,) = body["conversations"]
    assert (only["id"], only["title"], only["turns"]) == (conversation_id, FIRST_PROMPT, 1)
    resp = await gw.post(
        "/v1/session", json={"agent": agent, "resume_conversation": conversation_id}
    )
    assert resp.status == 201, await resp.text()
    sid = (await resp.json())["session_id"]
    master = await Master.attach(gw, sid, history="all")
    await master.next()
    old = replayed((await master.until("session.history"))["payload"]["frames"])
    assert old[0]["payload"]["prompt_text"] == FIRST_PROMPT
    (result,) = [f for f in old if f["type"] == "tool.invoke.result"]
    assert "forty-two" in str(result["payload"]["output"])
    live = await ask_what_was_remembered(master)
    return [f["payload"]["text"] for f in old if f["type"] == "agent.text.delta"], live


async def test_conversation_run_in_the_terminal_is_listed() -> None:
    async with rig() as r:
        status, body = await listing(r.gw, "claude-code", r.workspace)
        assert status == 200, body
        assert body["complete"] is True
        (only,) = body["conversations"]
        assert only["id"] == r.conversation_id
        assert only["title"] == FIRST_PROMPT
        assert only["turns"] == 1
        assert only["updated_at"].endswith("Z")
        # Another workspace: a sibling directory has none, nor has the one that shares the slug.
        twin = r.cli.cwd / WORKSPACE.replace(".", "-")
        twin.mkdir()
        status, body = await listing(r.gw, "claude-code", twin)
        assert (status, body) == (200, {"conversations": [], "complete": True})
        other = r.cli.cwd / "sub"
        other.mkdir()
        status, body = await listing(r.gw, "claude-code", other)
        assert (status, body) == (200, {"conversations": [], "complete": True})


async def test_continued_conversation_replays_history_then_goes_on_live() -> None:
    async with rig() as r:
        session = await r.resume()
        assert session["agent_session_id"] == r.conversation_id
        master = await Master.attach(r.gw, session["session_id"], history="all")
        caps = await master.next()
        assert caps["type"] == "session.capabilities"
        history = await master.until("session.history")
        frames = history["payload"]["frames"]
        old = replayed(frames)
        types = [f["type"] for f in old]
        # The earlier turn, in the order it happened live, before anything of this session.
        assert types[:2] == ["control.prompt.request", "session.turn.start"]
        assert old[0]["payload"]["prompt_text"] == FIRST_PROMPT
        assert "agent.thinking.delta" in types
        assert "session.turn.end" in types and "session.usage" in types
        texts = "".join(f["payload"]["text"] for f in old if f["type"] == "agent.text.delta")
        assert texts == "I will run a command.I will remember 42."
        (call,) = [f for f in old if f["type"] == "tool.invoke.request"]
        assert call["payload"]["tool_name"] == "Bash"
        (result,) = [f for f in old if f["type"] == "tool.invoke.result"]
        assert result["payload"]["invocation_id"] == call["payload"]["invocation_id"]
        assert "forty-two" in str(result["payload"]["output"])
        usage = next(f for f in old if f["type"] == "session.usage")
        assert usage["payload"]["token_usage"]["output_tokens"] > 0
        # Then the live turn: the CLI resumed the conversation, so the model sees it again.
        live_texts = await ask_what_was_remembered(master)
        assert "".join(live_texts) == "You asked me to remember 42."
        # Claude Code's cost runs on over the resumed conversation: the session counts only the
        # live turn's share of it (docs/usage.md).
        live = await master.until("session.usage")
        replayed_cost = usage["payload"]["cost_usage"]["used"]
        live_cost = live["payload"]["cost_usage"]["used"]
        assert 0 < replayed_cost < live_cost
        tally = r.gw.server.app[SESSIONS][session["session_id"]].usage
        assert tally.cost_usd == pytest.approx(live_cost - replayed_cost)
        last = r.cli.server.requests[-1].body
        assert "Which number" in last_user_text(last)
        earlier = str(last["messages"])
        assert FIRST_PROMPT in earlier and "I will remember 42." in earlier
        assert not r.cli.server.unexpected


async def test_a_second_master_sees_the_earlier_turns_before_the_new_one() -> None:
    async with rig("claude-code-oneshot") as r:
        sid = (await r.resume())["session_id"]
        first = await Master.attach(r.gw, sid)
        await first.next()
        await ask_what_was_remembered(first)
        second = await Master.attach(r.gw, sid, history="all")
        await second.next()
        frames = (await second.until("session.history"))["payload"]["frames"]
        starts = [f for f in frames if f["type"] == "session.turn.start"]
        assert len(starts) == 2
        assert replayed([starts[0]]) and not replayed([starts[1]])
        prompts = [
            f["payload"]["prompt_text"] for f in frames if f["type"] == "control.prompt.request"
        ]
        assert prompts == [FIRST_PROMPT, SECOND_PROMPT]
        assert "Remember the number 42" in str(r.cli.server.requests[-1].body["messages"])


async def test_unknown_conversation_and_agents_without_a_store() -> None:
    async with rig() as r:
        resp = await r.gw.post(
            "/v1/session",
            json={
                "agent": "claude-code",
                "workspace_path": WORKSPACE,
                "resume_conversation": str(uuid.uuid4()),
            },
        )
        assert resp.status == 404
        assert (await resp.json())["error_code"] == "CONVERSATION_NOT_FOUND"
        assert not [s for s in (await (await r.gw.get("/v1/sessions")).json())["sessions"]]
        for agent in ("plain", "demo"):
            status, body = await listing(r.gw, agent, r.workspace)
            assert status == 501 and body["error_code"] == "CONVERSATIONS_NOT_SUPPORTED", body


# --- Codex ---------------------------------------------------------------------------------------

CODEX_CALLS = [
    {
        "match": {"last_user_contains": "Remember the number"},
        "output": [
            {
                "type": "function_call",
                "name": "exec_command",
                "arguments": {"cmd": "echo forty-two"},
            }
        ],
    },
    {
        "match": {"tool_output": True},
        "output": [{"type": "message", "text": "I will remember 42."}],
    },
    {
        "match": {"last_user_contains": "Which number", "input_contains": "I will remember 42."},
        "output": [{"type": "message", "text": "You asked me to remember 42."}],
    },
]


async def test_codex_thread_run_in_the_terminal_is_listed_and_continued() -> None:
    binary = require_cli("codex")
    scenario = parse_scenario({"calls": CODEX_CALLS}, name="conversation", agent="codex")
    async with scripted_cli(scenario) as cli, asyncio.timeout(LIMIT_SEC):
        out = await in_terminal(
            cli, cli.cwd, str(binary), "exec", "--json", "--skip-git-repo-check", FIRST_PROMPT
        )
        thread_id = next(
            json.loads(line)["thread_id"]
            for line in out.splitlines()
            if b'"thread.started"' in line
        )
        base = builtin_profiles(codex=str(binary))["codex"]
        gw = await start_gateway(make_config(cli.cwd, agents={"codex": replace(base, env=cli.env)}))
        try:
            old, live = await listed_and_continued(gw, "codex", cli.cwd, thread_id)
            assert old == ["I will remember 42."]
            assert live == ["You asked me to remember 42."]
            # The resumed thread: the model got the earlier turn again (the call's match says so).
            assert not cli.server.unexpected and not cli.server.unused_calls
        finally:
            await gw.close()


# --- Gemini CLI ----------------------------------------------------------------------------------

GEMINI_MODEL = "gemini-2.5-flash"  # without -m the CLI first makes a routing call ("auto")
GEMINI_CALLS = [
    {
        "match": {"last_user_contains": "Remember the number"},
        "parts": [
            {"text": "I will run a command."},
            {
                "functionCall": {
                    "name": "run_shell_command",
                    "args": {"command": "echo forty-two", "description": "Print the number"},
                }
            },
        ],
    },
    {"match": {"function_response": True}, "parts": [{"text": "I will remember 42."}]},
    {
        "match": {"last_user_contains": "Which number", "contents_contain": "I will remember 42."},
        "parts": [{"text": "You asked me to remember 42."}],
    },
]


async def test_gemini_session_run_in_the_terminal_is_listed_and_continued() -> None:
    binary = require_cli("gemini")
    scenario = parse_scenario({"calls": GEMINI_CALLS}, name="conversation", agent="gemini")
    async with scripted_cli(scenario) as cli, asyncio.timeout(LIMIT_SEC):
        out = await in_terminal(
            cli,
            cli.cwd,
            str(binary),
            "-p",
            FIRST_PROMPT,
            "--output-format",
            "stream-json",
            "--skip-trust",
            "--approval-mode",
            "yolo",
            "-m",
            GEMINI_MODEL,
        )
        session_id = next(
            json.loads(line)["session_id"] for line in out.splitlines() if b'"init"' in line
        )
        base = builtin_profiles(gemini=str(binary))["gemini"]
        profile = replace(
            base, env=cli.env, command=(str(binary), "-m", GEMINI_MODEL, *base.command[1:])
        )
        gw = await start_gateway(make_config(cli.cwd, agents={"gemini": profile}))
        try:
            old, live = await listed_and_continued(gw, "gemini", cli.cwd, session_id)
            assert "".join(old) == "I will run a command.I will remember 42."
            assert "".join(live) == "You asked me to remember 42."
            assert not cli.server.unexpected and not cli.server.unused_calls
        finally:
            await gw.close()
