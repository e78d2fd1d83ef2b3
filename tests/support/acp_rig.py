"""An ACP agent's side played by a test: ``Rig`` is a session machine whose agent is the ACP
adapter, fed JSON-RPC lines in the shapes of the protocol's schema (``rpc``, ``update``,
``permission``), sans-IO."""

from __future__ import annotations

import json
from typing import Any

from gateway.protocol import actions as act
from gateway.protocol import codec
from gateway.protocol import machine as sm
from gateway.protocol.capabilities import ALL_FEATURES
from parsers import acp
from parsers.base import get

SID = "sess-1"


def rpc(**fields: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **fields}).encode()


def update(session_update: str, **fields: Any) -> bytes:
    return rpc(
        method="session/update",
        params={"sessionId": SID, "update": {"sessionUpdate": session_update, **fields}},
    )


class Rig:
    """A session machine whose agent is an ACP adapter; ``agent`` plays the agent's side."""

    def __init__(self, *, can_load: bool = False) -> None:
        parser, agent_input = get("acp").make()
        assert parser is agent_input
        self.adapter: acp.AcpAdapter = parser  # type: ignore[assignment]
        self.adapter.set_workspace("/srv/project")
        config = sm.SessionConfig(agent="acp-test", features=ALL_FEATURES, permission_timeout_sec=5)
        self.machine = sm.SessionMachine("s1", parser, agent_input, config)
        self.frames: list[dict[str, Any]] = []
        self.writes: list[dict[str, Any]] = []
        self.actions: list[act.Action] = []
        self.can_load = can_load

    def take(self, actions: list[act.Action]) -> None:
        self.actions += actions
        for action in actions:
            if isinstance(action, act.Emit):
                self.frames.append(json.loads(codec.encode(action.frame)))
            elif isinstance(action, act.WriteStdin) and action.data:
                self.writes.append(json.loads(action.data))

    def agent(self, line: bytes) -> None:
        self.take(self.machine.agent_line(line))

    def master(self, type_: str, payload: dict[str, Any]) -> None:
        frame = {
            "v": 1,
            "type": type_,
            "message_id": f"m{len(self.actions)}",
            "timestamp": "2026-01-01T00:00:00.000Z",
            "session_id": "s1",
            "payload": payload,
        }
        self.take(self.machine.receive("c1", json.dumps(frame)))

    def last_write(self) -> dict[str, Any]:
        return self.writes[-1]

    def start(self, modes: list[str] = ("default", "plan")) -> None:  # type: ignore[assignment]
        self.take(self.machine.start())
        init = self.last_write()
        assert init["method"] == "initialize"
        assert init["params"]["clientCapabilities"] == {
            "fs": {"readTextFile": False, "writeTextFile": False},
            "terminal": False,
        }
        caps = {"loadSession": self.can_load, "promptCapabilities": {"image": True}}
        self.agent(rpc(id=init["id"], result={"protocolVersion": 1, "agentCapabilities": caps}))
        new = self.last_write()
        assert new["method"] == "session/new"
        assert new["params"] == {"cwd": "/srv/project", "mcpServers": []}
        available = [{"id": m, "name": m.title()} for m in modes]
        result = {
            "sessionId": SID,
            "modes": {"currentModeId": modes[0], "availableModes": available},
        }
        self.agent(rpc(id=new["id"], result=result))

    def prompt(self, text: str = "hi") -> int:
        self.master("control.prompt.request", {"prompt_text": text})
        sent = self.last_write()
        assert sent["method"] == "session/prompt"
        assert sent["params"] == {"sessionId": SID, "prompt": [{"type": "text", "text": text}]}
        return sent["id"]

    def end(self, prompt_id: int, stop: str = "end_turn", **extra: Any) -> None:
        self.agent(rpc(id=prompt_id, result={"stopReason": stop, **extra}))

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["type"] == type_]


def permission(rpc_id: Any = 7, call: str = "w1") -> bytes:
    options = [
        {"optionId": "proceed_always", "name": "Allow always", "kind": "allow_always"},
        {"optionId": "proceed_once", "name": "Allow once", "kind": "allow_once"},
        {"optionId": "cancel", "name": "Reject", "kind": "reject_once"},
    ]
    tool = {
        "toolCallId": call,
        "title": "Write a.txt",
        "kind": "edit",
        "status": "pending",
        "locations": [{"path": "/srv/project/a.txt"}],
    }
    return rpc(
        id=rpc_id,
        method="session/request_permission",
        params={"sessionId": SID, "toolCall": tool, "options": options},
    )
