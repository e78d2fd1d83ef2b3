"""What ACP's content becomes: pure conversions from the agent's ContentBlocks, tool call content
and raw output to event fields, for ``adapter.py`` (and ``store_query.py``'s replay).

``AcpToolCall`` is what the adapter knows of a tool call between its updates; ``tool_result`` its
one ``ToolResult`` (a ``diff`` item → a unified diff, by ``parsers.file_changes``).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from .. import events as ev
from ..file_changes import text_diff
from . import schema as S

_encode: Final = msgspec.json.encode

# ToolKind → the output_type of a result with text (one without is "empty")
_KIND_OUTPUT: Final[dict[str, str]] = {
    "read": "file_content",
    "execute": "text",
    "fetch": "web_content",
    "search": "text",  # file_list when it names locations and no text
    "think": "text",
    "switch_mode": "text",
}
_WRITE_KINDS: Final = frozenset({"edit", "delete", "move"})


class AcpToolCall:
    __slots__ = (
        "announced",
        "content",
        "input",
        "kind",
        "locations",
        "name",
        "status",
        "streamed",
        "title",
    )

    def __init__(self) -> None:
        self.announced = False
        self.name: str | None = None
        self.title = ""
        self.kind = "other"
        self.status = "pending"  # ToolCallStatus, as last reported (ACP's default: pending)
        self.input: dict[str, Any] | None = None
        self.locations: list[str] = []
        self.streamed: list[str] = []  # text already sent as ToolOutput
        # The last content reported before the end (Claude's adapter sends a Write's diff with
        # its input, and none with its completion).
        self.content: list[S.ToolCallContent] | None = None


def tool_result(
    call_id: str,
    call: AcpToolCall,
    failed: bool,
    content: list[S.ToolCallContent] | None,
    raw_output: Any,
) -> ev.ToolResult:
    """A tool call's one ``ToolResult``: its ``output_type`` from its kind and content."""
    items = content or []
    diffs = [_diff(item) for item in items if item.type == "diff"]
    texts = [item_text(item) for item in items if item.type == "content"]
    binary = [
        ev.BinaryData(
            data=item.content.data,
            mime_type=item.content.mimeType or "application/octet-stream",
        )
        for item in items
        if item.type == "content"
        and item.content is not None
        and item.content.type == "image"
        and item.content.data
    ]
    text = _unfence("".join(texts)) if texts else "".join(call.streamed)
    if failed:
        return ev.ToolResult(
            call_id=call_id,
            is_error=True,
            output=text or _raw_text(raw_output) or "the tool failed",
        )
    if diffs:
        return ev.ToolResult(
            call_id=call_id,
            is_error=False,
            output="".join(diffs),
            output_type="diff",
            changed=True,
        )
    kind = call.kind
    if kind in _WRITE_KINDS:
        return ev.ToolResult(
            call_id=call_id,
            is_error=False,
            output=text,
            output_type="text" if text else "empty",
        )
    if kind == "search" and not text and call.locations:
        return ev.ToolResult(
            call_id=call_id,
            is_error=False,
            output=call.locations,
            output_type="file_list",
            listing=True,
        )
    printed = _output_of(raw_output) if not text else None
    if printed is not None:
        text = printed  # Codex: the command's own output is in rawOutput
    elif not text and raw_output is not None and not binary:
        return ev.ToolResult(
            call_id=call_id,
            is_error=False,
            output=raw_output,
            output_type="structured" if not isinstance(raw_output, str) else "text",
        )
    return ev.ToolResult(
        call_id=call_id,
        is_error=False,
        output=text,
        output_type=_KIND_OUTPUT.get(kind, "text") if text or binary else "empty",
        binary=binary,
    )


def block_text(block: S.ContentBlock) -> str:
    """What a ContentBlock says as text: its text, a resource's text, a link's URI."""
    if block.type == "text":
        return block.text or ""
    if block.type == "resource_link":
        return f"[{block.name or block.uri}]({block.uri})" if block.uri else ""
    if block.type == "resource" and block.resource is not None:
        text = block.resource.get("text")
        return text if isinstance(text, str) else ""
    return ""


def item_text(item: S.ToolCallContent) -> str:
    return block_text(item.content) if item.content is not None else ""


def _unfence(text: str) -> str:
    """A tool's output the agent wrapped in one Markdown code fence (Gemini: "```console\\nhi\\n```")
    without it: masters get the output itself."""
    if text.startswith("```") and text.rstrip().endswith("```"):
        body = text.rstrip()[3:-3]
        first, sep, rest = body.partition("\n")
        if sep and "```" not in rest and " " not in first.strip():
            return rest
    return text


def without_images(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A prompt for an agent that declared no image prompts (ACP forbids sending it images): the
    images are named in the text instead."""
    images = [b["mimeType"] for b in blocks if b["type"] == "image"]
    if not images:
        return blocks
    text = (
        blocks[0]["text"]
        + f"\n\n(Attached images not sent: this agent takes no images: {', '.join(images)})"
    )
    return [{"type": "text", "text": text}]


def quota_usage(meta: dict[str, Any] | None) -> ev.UsageInfo | None:
    """Gemini's token counts of a turn: ``_meta.quota.token_count`` of the prompt's answer."""
    quota = meta.get("quota") if meta else None
    counts = quota.get("token_count") if isinstance(quota, dict) else None
    if not isinstance(counts, dict):
        return None
    tokens = {k: v for k, v in counts.items() if type(v) is int and v >= 0}
    return ev.UsageInfo(
        input_tokens=tokens.get("input_tokens", 0), output_tokens=tokens.get("output_tokens", 0)
    )


_OUTPUT_KEYS: Final = ("formatted_output", "aggregated_output", "output", "stdout")


def _output_of(raw: Any) -> str | None:
    """A tool's printed output from its ``rawOutput`` object, where it has one (None: it has
    none; "" is a command that printed nothing)."""
    if not isinstance(raw, dict):
        return None
    found = [raw[k] for k in _OUTPUT_KEYS if isinstance(raw.get(k), str)]
    return next((v for v in found if v), found[0] if found else None)


def _raw_text(raw: Any) -> str:
    if raw is None:
        return ""
    return raw if isinstance(raw, str) else _encode(raw).decode()[:4096]


def _diff(item: S.ToolCallContent) -> str:
    """A ``diff`` item as a unified diff of ``path`` (``oldText`` null: a new file)."""
    return text_diff(item.path or "file", item.oldText, item.newText or "")
