"""End to end through ``/acp`` with the real Claude Code CLI behind the gateway (against the rig's
scripted Messages API) and the official ACP Python SDK in front of it, over its WebSocket
transport (docs/acp-masters.md): an editor loads a session a phone (a DPS master) started, runs a
turn with a permission, cancels one while its question is open, and goes on."""

from __future__ import annotations

import asyncio

import pytest
from acp import PROTOCOL_VERSION, connect_to_agent, text_block
from acp.schema import AgentMessageChunk, ClientCapabilities, ToolCallProgress, UserMessageChunk
from acp.ws.client import create_websocket_stream

from tests.e2e.test_e2e_claude import SCENARIOS
from tests.server.test_acp_master_sdk import Recorder
from tests.support import realcli
from tests.support.gateway_peer import Master, base_url
from tests.support.servers import user_headers

pytestmark = pytest.mark.realcli


async def a_phone_said_hello(rig: realcli.Rig) -> tuple[str, Master]:
    """The story's start, for each kind of editor: a phone (a DPS master) creates a session and
    runs its first turn; the session's id and the phone."""
    sid = (await rig.create())["session_id"]
    phone = await rig.attach(sid)
    await phone.send("control.prompt.request", {"prompt_text": "Hello from the phone"})
    await phone.until("session.turn.end", timeout=60)
    return sid, phone


async def test_an_editor_drives_real_claude_code_a_phone_started():
    async with realcli.gateway(SCENARIOS / "acp-master.toml", "claude-code") as rig:
        sid, phone = await a_phone_said_hello(rig)

        url = base_url(rig.gw).replace("http", "ws", 1) + "/acp"
        editor = Recorder(choose="allow")
        headers = user_headers(base_url(rig.gw))  # the gateway's own token, as a client finds it
        conn = connect_to_agent(editor, await create_websocket_stream(url, headers=headers))
        try:
            await conn.initialize(
                protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities()
            )
            await conn.load_session(cwd=str(rig.cli.cwd), session_id=sid)
            assert editor.text(UserMessageChunk) == "Hello from the phone"
            assert editor.text() == "Hello, phone."

            done = await conn.prompt(session_id=sid, prompt=[text_block("Write acp.txt please")])
            assert done.stop_reason == "end_turn"
            assert (rig.cli.cwd / "acp.txt").read_text() == "from the editor\n"
            [(_, tool_call, _)] = editor.asked
            results = [u for _, u in editor.updates if isinstance(u, ToolCallProgress) and u.status]
            assert results[-1].tool_call_id == tool_call.tool_call_id
            assert results[-1].status == "completed"
            assert [c.path for c in results[-1].content if c.type == "diff"] == [
                str(rig.cli.cwd / "acp.txt")
            ]
            assert editor.text().endswith("Written for the editor.")
            relayed = await phone.until("control.prompt.request", timeout=30)
            assert relayed["payload"]["prompt_text"] == "Write acp.txt please"

            editor.choose = None  # hold the next question open
            editor.asked_event.clear()
            turn = asyncio.ensure_future(
                conn.prompt(session_id=sid, prompt=[text_block("Write never.txt")])
            )
            await asyncio.wait_for(editor.asked_event.wait(), 60)
            await conn.cancel(session_id=sid)
            editor.release.set()
            assert (await asyncio.wait_for(turn, 60)).stop_reason == "cancelled"
            assert not (rig.cli.cwd / "never.txt").exists()

            again = await conn.prompt(session_id=sid, prompt=[text_block("Still there?")])
            assert again.stop_reason == "end_turn"
            assert editor.text(AgentMessageChunk).endswith("Still here.")
        finally:
            await conn.close()
