"""End to end through the stdio relay: the real Claude Code CLI behind the gateway (against the
rig's scripted Messages API), and in front an editor made of the official ACP Python SDK that
launches ``rawp-gateway acp`` as its agent over stdio, as Zed or a JetBrains IDE does
(docs/acp-masters.md). The same story as the WebSocket client's (test_e2e_acp_master.py): the
editor loads a session a phone started, runs a turn with a permission, cancels one while its
question is open, and goes on."""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.test_e2e_acp_master import a_phone_said_hello
from tests.e2e.test_e2e_claude import SCENARIOS
from tests.support import realcli
from tests.support.acp_editors import python_editor, relay_argv, relay_env
from tests.support.gateway_peer import base_url
from tests.support.waiting import eventually

pytestmark = pytest.mark.realcli


def prompt(session_id: str, text: str) -> dict[str, object]:
    return {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}


async def test_an_editor_on_the_stdio_relay_drives_real_claude_code_a_phone_started(tmp_path):
    async with realcli.gateway(SCENARIOS / "acp-master.toml", "claude-code") as rig:
        sid, phone = await a_phone_said_hello(rig)

        async with python_editor(relay_argv(base_url(rig.gw)), relay_env(), tmp_path) as ed:
            await ed.request("initialize", {})
            await ed.request("session/load", {"sessionId": sid, "cwd": str(rig.cli.cwd)})
            assert ed.text(sid, "user_message_chunk") == "Hello from the phone"
            assert ed.text(sid) == "Hello, phone."

            turn = asyncio.ensure_future(
                ed.request("session/prompt", prompt(sid, "Write acp.txt please"))
            )
            await eventually(lambda: ed.questions, "the permission question", 60)
            await ed.answer(0, "allow")
            assert (await asyncio.wait_for(turn, 60))["stopReason"] == "end_turn"
            assert (rig.cli.cwd / "acp.txt").read_text() == "from the editor\n"
            assert ed.text(sid).endswith("Written for the editor.")
            relayed = await phone.until("control.prompt.request", timeout=30)
            assert relayed["payload"]["prompt_text"] == "Write acp.txt please"

            turn = asyncio.ensure_future(
                ed.request("session/prompt", prompt(sid, "Write never.txt"))
            )
            await eventually(lambda: len(ed.questions) > 1, "the second question", 60)
            await ed.notify("session/cancel", {"sessionId": sid})
            await ed.answer(1, None)
            assert (await asyncio.wait_for(turn, 60))["stopReason"] == "cancelled"
            assert not (rig.cli.cwd / "never.txt").exists()

            again = await ed.request("session/prompt", prompt(sid, "Still there?"))
            assert again["stopReason"] == "end_turn"
            assert ed.text(sid).endswith("Still here.")
            ids = ed.ids(sid)
            assert len(ids) == len(set(ids))
