"""A store of saved Claude Code conversations written by a test, in the shapes Claude Code 2.1.328
writes (``parsers/claude_code/saved.py``): a throwaway HOME, a workspace, and one file per
conversation."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from parsers.claude_code.saved import slug


def line(**fields: Any) -> bytes:
    return json.dumps(fields).encode() + b"\n"


def conversation(workspace: Path, prompt: str = "Remember 42.", answer: str = "Noted.") -> bytes:
    cwd = str(workspace)
    return b"".join(
        [
            line(type="queue-operation", operation="enqueue", content=prompt),
            line(type="user", cwd=cwd, message={"role": "user", "content": prompt}),
            line(
                type="assistant",
                cwd=cwd,
                message={
                    "id": "msg_1",
                    "role": "assistant",
                    "content": [{"type": "text", "text": answer}],
                    "stop_reason": "end_turn",
                    "usage": {"input_tokens": 10, "output_tokens": 3},
                },
            ),
        ]
    )


class Store:
    """HOME and a workspace under a test's tmp_path, and the workspace's project directory."""

    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "home"
        self.workspace = tmp_path / "root" / "work.space"
        self.workspace.mkdir(parents=True)
        self.dir = self.home / ".claude" / "projects" / slug(str(self.workspace))
        self.dir.mkdir(parents=True)

    def put(self, data: bytes, conversation_id: str | None = None, age: float = 0) -> str:
        conversation_id = conversation_id or str(uuid.uuid4())
        path = self.dir / f"{conversation_id}.jsonl"
        path.write_bytes(data)
        if age:
            t = path.stat().st_mtime - age
            os.utime(path, (t, t))
        return conversation_id
