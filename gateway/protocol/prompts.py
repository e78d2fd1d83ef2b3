"""What the agent is given for a master's prompt, and what a prompt may carry, sans-IO.

A ``control.prompt.request`` becomes the text the agent reads: slash commands as ``/name args``,
file reference tokens replaced by their paths, the attached files listed after it. Attached files
(``context_files``) must be files stored in this session under a base name; those an agent takes
as images go to it as images, the others are written under ``UPLOADS_DIR`` in the workspace. What
a prompt must not carry is refused with ``PromptRefused``, which the session machine answers with
a non-fatal ``session.error``. ``storage/files.py`` holds uploads to the same name and type rules.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Any, Final

from gateway.protocol import frames as F
from parsers import events as ev

__all__ = [
    "IMAGE_MIME_TYPES",
    "MAX_CONTEXT_FILES",
    "MAX_FILE_NAME_BYTES",
    "MAX_FILE_REFERENCES",
    "UPLOADS_DIR",
    "PromptRefused",
    "attachments_text",
    "context_files",
    "nul_refused",
    "prompt_text_for_agent",
    "valid_file_name",
]

# A prompt's file_references (each a token replaced in the text): far more than a person attaches.
MAX_FILE_REFERENCES: Final = 64
# docs/files.md: uploads reach an agent that takes images as images when they are one of
# these; every other upload is written here in the workspace and named in the prompt.
IMAGE_MIME_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
UPLOADS_DIR: Final = ".rawp/uploads"
MAX_CONTEXT_FILES: Final = 20  # files attached to one prompt
MAX_FILE_NAME_BYTES: Final = 255  # a file name, in UTF-8 bytes (most file systems' limit)


class PromptRefused(ValueError):
    """A prompt the agent must not get; answered with a non-fatal ``session.error`` ``code``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def prompt_text_for_agent(
    prompt: F.PromptRequest, max_bytes: int = 1 << 20, *, attached: str = ""
) -> str:
    """The text the agent gets: slash commands as ``/name args``; each file reference token (its
    ``ref_id``) replaced by its ``display_path`` (DPS-6.1.1-prompt); attached files listed after
    the prompt (``attached``: what the session says of them; their URLs are never listed). At most ``MAX_FILE_REFERENCES``
    references and ``max_bytes`` of UTF-8 text, and no NUL, else ``PromptRefused``."""
    text = prompt.prompt_text
    if prompt.input_type == "slash_command" and not text.startswith("/"):
        text = "/" + text
    refs = prompt.file_references or ()
    if len(refs) > MAX_FILE_REFERENCES:
        raise PromptRefused(
            "TOO_MANY_FILE_REFERENCES",
            f"a prompt may carry at most {MAX_FILE_REFERENCES} file_references, got {len(refs)}",
        )
    text = _replace_tokens(text, refs, max_bytes) + attached
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise _too_large(max_bytes)
    overrides = prompt.config_overrides
    tools = [*(overrides.allowed_tools or ()), *(overrides.denied_tools or ())] if overrides else []
    if "\0" in text or any("\0" in tool for tool in tools):
        raise nul_refused()
    return text


def nul_refused() -> PromptRefused:
    # No argv can carry a NUL: a single-turn agent's start would fail and end the session.
    return PromptRefused("INVALID_FRAME", "the prompt or a tool name contains a NUL character")


def valid_file_name(name: str) -> bool:
    """A base name: 1 to ``MAX_FILE_NAME_BYTES`` UTF-8 bytes, not ``.`` or ``..``, without ``/``
    or a character that looks like one, and without a control, format or line/paragraph
    separator character (Unicode categories Cc, Cf, Zl, Zp: C1 controls, bidi overrides, zero
    widths), which would show a master or the agent another name than the one stored
    (docs/files.md)."""
    return (
        name not in ("", ".", "..")
        and not any(c in _SLASHES or unicodedata.category(c) in _HIDDEN for c in name)
        and len(name.encode("utf-8", "surrogatepass")) <= MAX_FILE_NAME_BYTES
    )


# What a file name may not hold besides "/": characters drawn as a slash (a name must not read as
# a path), and the Unicode categories that are invisible or move text around.
_SLASHES: Final = frozenset(
    "/\u0337\u0338\u2044\u2215\u2571\u27cb\u29f8\u2afb\u2afd\uff0f\U0001f67c"
)
_HIDDEN: Final = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def attachments_text(images: list[ev.StoredFile], uploads: list[tuple[ev.StoredFile, str]]) -> str:
    """What the prompt says about its attached files: images given to the agent as images by
    name, other files by their path in the workspace."""
    if not images and not uploads:
        return ""
    lines = [f"- {f.file_name} ({f.mime_type}, attached as an image)" for f in images]
    lines += [
        f"- {UPLOADS_DIR}/{name} ({f.mime_type}, {f.size_bytes} bytes)" for f, name in uploads
    ]
    return "\n\nAttached files:\n" + "\n".join(lines)


def context_files(
    attached_files: list[F.ContextFile],
    stored_files: Mapping[str, ev.StoredFile],
    *,
    session_id: str,
    accepts_images: bool,
) -> tuple[list[ev.StoredFile], list[tuple[ev.StoredFile, str]]] | str:
    """A prompt's ``context_files`` as (images for the agent, (file, name) to write into the
    workspace), or why they are refused. Only files stored in this session (``stored_files``, by
    transfer_id) count: the gateway never fetches a URL that came in a frame (docs/files.md)."""
    if len(attached_files) > MAX_CONTEXT_FILES:
        return f"a prompt may attach at most {MAX_CONTEXT_FILES} context_files"
    images: list[ev.StoredFile] = []
    uploads: list[tuple[ev.StoredFile, str]] = []
    for attached in attached_files:
        stored = stored_files.get(attached.file_url.rpartition("/")[2])
        if stored is None or stored.file_url != attached.file_url:
            return (
                f"context_files: {attached.file_url[:200]!r} is not a file of this session: "
                f"upload it with PUT /v1/session/{session_id}/files?name=... and use the "
                "file_url it returns (the gateway fetches no URL)"
            )
        if not valid_file_name(attached.file_name):
            return f"context_files: {attached.file_name[:200]!r} is not a base file name"
        if accepts_images and stored.mime_type in IMAGE_MIME_TYPES:
            images.append(stored)
        else:
            uploads.append((stored, attached.file_name))
    return images, uploads


def _too_large(max_bytes: int) -> PromptRefused:
    return PromptRefused(
        "PROMPT_TOO_LARGE",
        f"the prompt for the agent (file references replaced) would exceed {max_bytes} bytes",
    )


def _replace_tokens(text: str, refs: Any, max_bytes: int) -> str:
    """Every token replaced in one pass over the original text: a ``display_path`` that contains a
    ``ref_id`` (its own or another's) is never scanned again, and the longest ``ref_id`` wins where
    two start at the same place. A reference with an empty ``ref_id`` names no token. The result is
    measured as it grows, so a short token repeated many times cannot build more than
    ``max_bytes`` before it is refused."""
    paths: dict[str, str] = {}
    for ref in refs:
        if ref.ref_id and ref.display_path and ref.ref_id not in paths:
            paths[ref.ref_id] = ref.display_path
    if not paths:
        return text
    tokens = re.compile("|".join(re.escape(r) for r in sorted(paths, key=len, reverse=True)))
    parts: list[str] = []
    size = pos = 0
    for match in tokens.finditer(text):
        path = paths[match.group()]
        size += match.start() - pos + len(path)
        if size > max_bytes:  # characters: a lower bound of the UTF-8 size
            raise _too_large(max_bytes)
        parts += (text[pos : match.start()], path)
        pos = match.end()
    parts.append(text[pos:])
    return "".join(parts)
