"""``mcp_servers`` of ``POST /v1/session`` through a real server (docs/mcp.md, docs/http-api.md):
refused whole with ``INVALID_MCP_SERVERS`` before anything is created; a session whose agent takes
no MCP server (the demo agent) still runs, and says each server failed and why; no secret in the
session object, its frames, its audit record or the gateway's log."""

from __future__ import annotations

import json
import logging

from gateway.config import AuthSettings, McpSettings
from gateway.protocol.mcp_servers import ServerSpec, finished
from tests.support.gateway_peer import Master, demo_config, prompt_and_wait, start_gateway

SECRET = "srv-secret-0e5d9c"
CONFIGURED = finished(
    ServerSpec(url="http://127.0.0.1:9/mcp", headers={"X-Key": SECRET}), "docs", "config"
)


async def test_an_invalid_list_is_refused_before_anything_is_created(tmp_path):
    client = await start_gateway(demo_config(tmp_path, mcp=McpSettings((CONFIGURED,))))
    try:
        for entries, said in [
            ([{"name": "docs", "command": ["x"]}], "never replaced"),
            ([{"name": "a", "command": ["x"]}, {"name": "a", "command": ["y"]}], "given twice"),
            ([{"name": "a", "command": ["x"], "agents": ["demo"]}], "unknown key 'agents'"),
            ([{"name": "a", "url": "http://h/", "headers": {"H": "a\nb"}}], "line break"),
            ("docs", "must be a list"),
        ]:
            resp = await client.post("/v1/session", json={"agent": "demo", "mcp_servers": entries})
            assert resp.status == 400, await resp.text()
            error = await resp.json()
            assert error["error_code"] == "INVALID_MCP_SERVERS" and said in error["message"]
        assert (await (await client.get("/v1/sessions")).json())["sessions"] == []
    finally:
        await client.close()


async def test_an_agent_that_takes_no_server_runs_and_says_why_each_failed(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    audit = tmp_path / "audit.jsonl"
    config = demo_config(
        tmp_path, mcp=McpSettings((CONFIGURED,)), auth=AuthSettings(audit_log=audit)
    )
    client = await start_gateway(config)
    try:
        mine = {"name": "mine", "command": ["srv"], "env": {"TOKEN": SECRET}}
        resp = await client.post("/v1/session", json={"agent": "demo", "mcp_servers": [mine]})
        assert resp.status == 201, await resp.text()
        created = await resp.json()
        master = await Master.attach(client, created["session_id"])
        caps = await master.next()
        shown = caps["payload"]["extensions"]["mcp_servers"]
        assert shown == [
            {
                "name": "docs",
                "kind": "http",
                "origin": "config",
                "url": "http://127.0.0.1:9/mcp",
                "headers": ["X-Key"],
                "status": "failed",
                "reason": "the agent does not take http servers",
            },
            {
                "name": "mine",
                "kind": "stdio",
                "origin": "request",
                "command": ["srv"],
                "env": ["TOKEN"],
                "status": "failed",
                "reason": "the agent does not take stdio servers",
            },
        ]
        frames = await prompt_and_wait(master, "hello", idle=True)
        session = await (await client.get(f"/v1/session/{created['session_id']}")).json()
        assert session["mcp_servers"] == shown
        said = [json.dumps(created), json.dumps(caps), json.dumps(frames), json.dumps(session)]
        said += [audit.read_text(), caplog.text]
        assert "session.create" in said[4] and "mine" in said[4]
        assert [text for text in said if SECRET in text] == []
    finally:
        await client.close()
