"""Files both ways with the real CLIs (DPS §4.5, docs/files.md): the real gateway server
spawns the pinned Claude Code, Codex and Gemini CLIs against the rig's scripted model servers, and a
real master uploads and downloads over HTTP while it drives the session over the WebSocket.

What is asserted is what really happened: the bytes a master downloads through ``file_url`` against
the file the CLI read, and the image or text the scripted model server received in its request.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tests.support import realcli
from tests.support.gateway_peer import of, prompt_and_wait

pytestmark = pytest.mark.realcli

PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAQAAAADCAIAAAA7ljmRAAAAEElEQVR4nGP4z8AARww4OQD1MQv1NXv7ggAAAABJRU5ErkJggg=="
PNG = base64.b64decode(PNG_B64)  # a 4x3 red PNG


def gateway(agent: str, calls: list[dict[str, Any]], isolation: str | None = None, **server: Any):
    """The Codex/Gemini end-to-end rig (any of the three CLIs) with ``dot.png`` in its workspace;
    ``server``: ``Config`` fields; ``isolation``: the ``[isolation]`` mode (else the suite's)."""
    files = {"dot.png": {"base64": PNG_B64}}
    scenario = realcli.scenario(agent, calls, files=files)
    return realcli.gateway(scenario, agent, server=server, isolation_mode=isolation)


async def prompt_with_upload(rig: Any, text: str, name: str, body: bytes, mime: str) -> Any:
    """Upload ``name``, name it in a prompt's context_files and run the turn to its end_turn; the
    one request the scripted model received."""
    session_id, master = await rig.master()
    status, stored = await rig.upload(session_id, name, body, mime)
    assert status == 201
    files = [{"file_url": stored["file_url"], "file_name": name}]
    frames = await prompt_and_wait(master, text, context_files=files)
    assert of(frames, "session.turn.end")[0]["payload"]["stop_reason"] == "end_turn"
    (request,) = rig.requests
    return request


# --- agent -> master ----------------------------------------------------------------------------


async def test_claude_code_reads_a_png_and_the_master_downloads_the_same_bytes():
    """The scripted model asks Claude Code to Read a PNG: agent.file.transfer (download), then the
    Read's result as binary_ref naming the same transfer; GET file_url gives the file's bytes with
    its Content-Type; the base64 of the image is in no frame."""
    calls = [
        {
            "content": [
                {"type": "tool_use", "name": "Read", "input": {"file_path": "{workspace}/dot.png"}}
            ]
        },
        {"match": {"tool_result": True}, "content": [{"type": "text", "text": "A red dot."}]},
    ]
    async with gateway("claude-code", calls) as rig:
        session_id, master = await rig.master()
        start = len(master.frames)
        raw: list[str] = []
        await master.send("control.prompt.request", {"prompt_text": "Look at dot.png."})
        while True:  # the raw text of every frame, to look for the image's base64
            msg = await master.ws.receive(timeout=60)
            raw.append(msg.data)
            master.frames.append(json.loads(msg.data))
            if master.frames[-1]["type"] == "session.turn.end":
                break
        frames = master.frames[start:]
        assert not any(PNG_B64 in text for text in raw)
        types = [f["type"] for f in frames]
        i = types.index("agent.file.transfer")
        transfer, result = frames[i]["payload"], frames[i + 1]["payload"]
        (request,) = of(frames, "tool.invoke.request")
        assert frames[i + 1]["type"] == "tool.invoke.result"
        assert transfer["direction"] == "download" and transfer["file_name"] == "dot.png"
        assert (
            transfer["context"]["related_tool_invocation_id"] == request["payload"]["invocation_id"]
        )
        assert transfer["context"]["workspace_relative_path"] == "dot.png"
        assert result["output_type"] == "binary_ref"
        assert result["output"]["transfer_id"] == transfer["transfer_id"]
        assert result["output"]["file_url"] == transfer["file_url"]
        assert transfer["file_url"] == f"/v1/session/{session_id}/files/{transfer['transfer_id']}"
        got = await rig.gw.get(transfer["file_url"])
        assert got.status == 200 and await got.read() == (rig.cli.cwd / "dot.png").read_bytes()
        assert got.headers["Content-Type"] == "image/png"
        assert [f["payload"]["full_text"] for f in of(frames, "agent.text.done")] == ["A red dot."]
        assert (await rig.gw.delete(f"/v1/session/{session_id}")).status == 200
        await master.drain_until_closed()
        gone = await rig.gw.get(transfer["file_url"])
        assert gone.status == 404 and (await gone.json())["error_code"] == "TRANSFER_NOT_FOUND"


# --- master -> agent ------------------------------------------------------------------------------


def _images_in(content: Any) -> list[dict[str, Any]]:
    return [b for b in content if isinstance(b, dict) and b.get("type") == "image"]


async def test_claude_code_gets_an_uploaded_screenshot_as_an_image_block():
    """A master PUTs a screenshot and names it in context_files: the scripted model receives it as
    an image content block of the user message, the same bytes."""
    calls = [{"content": [{"type": "text", "text": "I see a red rectangle."}]}]
    async with gateway("claude-code", calls) as rig:
        request = await prompt_with_upload(
            rig, "What is on my screen?", "screenshot.png", PNG, "image/png"
        )
        user = [m for m in request.body["messages"] if m["role"] == "user"][-1]
        (image,) = _images_in(user["content"])
        assert image["source"]["media_type"] == "image/png"
        assert base64.b64decode(image["source"]["data"]) == PNG
        text = "".join(b.get("text", "") for b in user["content"] if isinstance(b, dict))
        assert "What is on my screen?" in text and "screenshot.png" in text
        assert not (rig.cli.cwd / ".rawp").exists()  # an image for the model, not a file


@pytest.mark.parametrize("isolation", [None, pytest.param("sandbox", marks=pytest.mark.sandbox)])
async def test_codex_gets_an_uploaded_image_through_image_flag(isolation):
    """Codex takes the uploaded screenshot with --image: the Responses request carries it as an
    input_image of the same bytes. In the sandbox too, where the file store (in the hidden state
    dir) shows only that file, read-only (docs/isolation.md)."""
    calls = [{"output": [{"type": "message", "text": "A red rectangle."}]}]
    async with gateway("codex", calls, isolation) as rig:
        request = await prompt_with_upload(
            rig, "What is on my screen?", "screenshot.png", PNG, "image/png"
        )
        parts = [
            part
            for item in request.body["input"]
            if isinstance(item, dict) and isinstance(item.get("content"), list)
            for part in item["content"]
        ]
        images = [p for p in parts if p.get("type") == "input_image"]
        assert len(images) == 1
        prefix = "data:image/png;base64,"
        assert images[0]["image_url"].startswith(prefix)
        assert base64.b64decode(images[0]["image_url"][len(prefix) :]) == PNG


async def test_gemini_gets_an_uploaded_file_in_the_workspace_named_in_the_prompt():
    """Gemini takes no image with its prompt: an upload (here a log) is written under
    .rawp/uploads/ in the workspace and the prompt the model receives names that path."""
    calls = [{"parts": [{"text": "The log says boom."}]}]
    async with gateway("gemini", calls) as rig:
        request = await prompt_with_upload(
            rig, "What does the log say?", "app.log", b"boom\n", "text/plain"
        )
        assert (rig.cli.cwd / ".rawp" / "uploads" / "app.log").read_bytes() == b"boom\n"
        sent = json.dumps(request.body)
        assert "What does the log say?" in sent and ".rawp/uploads/app.log" in sent


async def test_refusals_with_a_real_agent_lose_nothing():
    """Over-size upload (413), bad name (400), foreign URL and unknown transfer in a prompt
    (session.error INVALID_FRAME), an unknown transfer's URL (404): each refused on its own, and
    the next good prompt still runs on the same Claude Code process."""
    calls = [{"content": [{"type": "text", "text": "Still here."}]}]
    async with gateway("claude-code", calls, max_upload_bytes=1024) as rig:
        session_id, master = await rig.master()
        status, body = await rig.upload(session_id, "big.bin", b"x" * 2048, "text/plain")
        assert (status, body["error_code"]) == (413, "FILE_TOO_LARGE")
        status, body = await rig.upload(session_id, "../escape.png", PNG, "image/png")
        assert (status, body["error_code"]) == (400, "INVALID_FILE_NAME")
        unknown = f"/v1/session/{session_id}/files/00000000-0000-4000-8000-000000000000"
        got = await rig.gw.get(unknown)
        assert (got.status, (await got.json())["error_code"]) == (404, "TRANSFER_NOT_FOUND")
        for url in ("https://example.com/screenshot.png", unknown):
            await master.send(
                "control.prompt.request",
                {
                    "prompt_text": "Look.",
                    "context_files": [{"file_url": url, "file_name": "s.png"}],
                },
            )
            error = await master.until("session.error")
            assert error["payload"]["error_code"] == "INVALID_FRAME"
            assert error["payload"]["fatal"] is False
        assert not rig.requests  # nothing reached the agent
        frames = await prompt_and_wait(master, "Are you there?")
        assert [f["payload"]["full_text"] for f in of(frames, "agent.text.done")] == ["Still here."]
