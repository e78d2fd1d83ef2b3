"""Where a tool call's paths lead on the disk, for the permission rules (docs/policies.md).

The rules judge a path where the tool will touch it, not as it is spelled: ``resolve_tool_paths``
reads the disk for each path of a permission question (its input's ``file_path``, ``path``,
``notebook_path``, and the paths it says it touches), made absolute against the session's
workspace with the symlinks of the part that exists followed (``os.path.realpath``: a ``..`` after
a symlink goes up from where the link leads, as the kernel does), and hands the answers to the
pure decision on the question itself (``PermissionRequest.resolved_paths``). A path inside the
workspace's real directory is given back under the workspace as the session names it, so
``{workspace}`` in a glob still matches when the workspace is itself reached through a symlink.

A path not read (more than ``MAX_PATHS`` of them, too long, from a home directory, a disk error)
is left out: the decision then never allows by it. What is judged is the disk at the question:
a link made between the answer and the write is the sandbox's to stop (docs/isolation.md).
"""

from __future__ import annotations

import os
from typing import Any, Final

from gateway.protocol.policy import MAX_MATCH_CHARS, PATH_FIELDS, where_path
from parsers import events as ev

__all__ = ["MAX_PATHS", "resolve_tool_paths", "where_paths"]

MAX_PATHS: Final = 64  # paths of one tool call read from the disk


def resolve_tool_paths(events: list[ev.AgentEvent], workspace: str) -> list[ev.AgentEvent]:
    """``events`` with each permission question's paths read (in place; the same list)."""
    for event in events:
        if type(event) is ev.PermissionRequest:
            event.resolved_paths = where_paths(event.input, event.affected_paths, workspace)
    return events


def where_paths(tool_input: dict[str, Any], affected: list[str], workspace: str) -> dict[str, str]:
    """Each path of a tool call (as written) and where it leads on the disk."""
    written: list[Any] = []
    for name in PATH_FIELDS:
        value = tool_input.get(name)
        written.extend(value if isinstance(value, list) else (value,))
    written.extend(affected)
    real_workspace = os.path.realpath(workspace) if workspace else ""
    out: dict[str, str] = {}
    for text in written:
        if len(out) >= MAX_PATHS:
            break
        if not isinstance(text, str) or text in out or len(text) > MAX_MATCH_CHARS:
            continue
        if where_path(text, workspace) is None:
            continue
        try:
            real = os.path.realpath(os.path.join(workspace, text))
        except (OSError, ValueError):
            continue
        if real_workspace and (
            real == real_workspace or real.startswith(real_workspace.rstrip("/") + "/")
        ):
            real = workspace.rstrip("/") + real[len(real_workspace.rstrip("/")) :]
        out[text] = real or "/"
    return out
