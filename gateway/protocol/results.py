"""What a tool call's result frame carries, beyond the call's bookkeeping: pure functions.

The mapper (``mapper.py``) keeps the calls and decides which frame comes when; this room shapes an
output: files the shell stored from a result as a ``binary_ref`` output (§4.5), a background
subagent's held result released with the subagent's own report and status (§10.3), and an output
or a request's input cut until its frame fits ``max_frame_size``.
"""

from __future__ import annotations

from typing import Any, Literal

from gateway.protocol.codec import encode
from parsers import events as ev

__all__ = ["binary_refs", "cut_input", "cut_output", "released_output", "subagent_status"]


def binary_refs(files: list[ev.StoredFile], text: Any) -> Any:
    """A ``binary_ref`` output: ``{transfer_id, file_url, mime_type, size_bytes}`` for the file (a
    list of them for several), with the tool's own text beside the file as ``text`` when it
    gave some (an MCP tool's caption of a screenshot)."""
    refs: list[dict[str, Any]] = [
        {
            "transfer_id": f.transfer_id,
            "file_url": f.file_url,
            "mime_type": f.mime_type,
            "size_bytes": f.size_bytes,
        }
        for f in files
    ]
    if isinstance(text, str) and text:
        refs[0]["text"] = text
    return refs[0] if len(refs) == 1 else refs


def subagent_status(result: ev.ToolResult) -> Literal["completed", "failed", "cancelled"]:
    if result.cancelled:
        return "cancelled"
    return "failed" if result.is_error else "completed"


def released_output(held: Any, ended: ev.SubagentEnded) -> Any:
    """A background subagent's result: what the call returned, with the subagent's final report
    (the agent's summary) as its text."""
    if ended.summary is None:
        return held
    if isinstance(held, dict):
        return {**held, "text": ended.summary, "status": ended.status}
    return {"text": ended.summary, "status": ended.status}


def cut_output(output: Any, excess: int) -> Any:
    """``output`` made at least ``excess`` encoded bytes smaller.

    A string loses ``excess`` characters (each is at least one byte encoded); a list loses items
    from its end; anything else is cut as its JSON text.
    """
    if isinstance(output, str):
        return output[: max(0, len(output) - excess)]
    if isinstance(output, list):
        kept = list(output)
        removed = 0
        while kept and removed < excess:
            removed += len(encode(kept.pop())) + 1
        return kept
    text = encode(output).decode()
    return text[: max(0, len(text) - excess)]


def cut_input(tool_input: dict[str, Any], excess: int) -> dict[str, Any]:
    """The input with its longest string values cut until ``excess`` bytes are gone."""
    cut = dict(tool_input)
    while excess > 0:
        strings = [(len(v), k) for k, v in cut.items() if isinstance(v, str) and v]
        if not strings:
            big = max(cut, key=lambda k: len(encode(cut[k])), default=None)
            if big is None:
                break
            text = encode(cut[big]).decode()
            cut[big] = text[: max(0, len(text) - excess)]
            break
        size, key = max(strings)
        take = min(size, excess)
        cut[key] = cut[key][: size - take]
        excess -= take
    return cut
