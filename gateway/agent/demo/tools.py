"""The demo's tools, answering as the CLI's do: `run_glob`, `run_read` (text, numbered as the CLI
numbers it, or an image: `run_read_image`, measured by `image_info`), `run_write` (with the
`structuredPatch` hunks of an update). Each works inside the workspace only (`ToolError` else)."""

from __future__ import annotations

import base64
import difflib
import os
import time
from pathlib import PurePosixPath
from typing import Any

from gateway.agent.demo import GLOB_LIMIT, IMAGE_EXTENSIONS, MAX_IMAGE_BYTES


class ToolError(Exception):
    """A tool failed; the message goes to the model as an error tool_result."""


def inside_workspace(workspace: str, path: str) -> str:
    """The absolute path of `path` if it is inside `workspace` (symlinks resolved), else ToolError."""
    full = os.path.realpath(os.path.join(workspace, os.path.expanduser(path)))
    root = os.path.realpath(workspace)
    if full != root and not full.startswith(root + os.sep):
        raise ToolError(
            f"Path is outside the workspace: {path}. The demo agent only touches files under {root}."
        )
    return full


def run_glob(workspace: str, pattern: str) -> tuple[str, dict[str, Any]]:
    """List the workspace's files (relative, sorted; hidden and cache directories skipped)."""
    t0 = time.monotonic()
    names: list[str] = []
    total = 0
    skip = {"node_modules", "__pycache__"}
    for root, dirs, files in os.walk(workspace):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in skip)
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(root, f), workspace)
            if pattern not in ("**/*", "*", "**") and not _glob_match(rel, pattern):
                continue
            total += 1
            if len(names) < GLOB_LIMIT:
                names.append(rel)
    result = {
        "filenames": names,
        "durationMs": int((time.monotonic() - t0) * 1000),
        "numFiles": len(names),
        "truncated": total > len(names),
        "totalMatches": total,
        "countIsComplete": True,
    }
    return ("\n".join(names) if names else "No files found"), result


def _glob_match(rel: str, pattern: str) -> bool:
    # "**/" also matches the top level, as in the real tool.
    return PurePosixPath(rel).match(pattern) or PurePosixPath(rel).match(
        pattern.removeprefix("**/")
    )


def run_read(workspace: str, file_path: str) -> tuple[str | list[dict[str, Any]], dict[str, Any]]:
    full = inside_workspace(workspace, file_path)
    if os.path.splitext(full)[1].lower() in IMAGE_EXTENSIONS and os.path.isfile(full):
        return run_read_image(file_path, full)
    try:
        with open(full, encoding="utf-8", errors="replace") as f:
            content = f.read()
    except FileNotFoundError:
        raise ToolError(
            f"File does not exist. Note: your current working directory is {workspace}."
        ) from None
    except IsADirectoryError:
        raise ToolError(f"EISDIR: illegal operation on a directory, read '{full}'") from None
    # As the CLI does: "a\n" is numbered "1\ta\n2\t" and counted as 2 (numLines).
    lines = content.split("\n")
    numbered = "\n".join(f"{i}\t{line}" for i, line in enumerate(lines, 1))
    file_info = {
        "filePath": full,
        "content": content,
        "numLines": len(lines),
        "startLine": 1,
        "totalLines": len(lines),
    }
    return numbered, {"type": "text", "file": file_info}


def image_info(data: bytes) -> tuple[str, int, int] | None:
    """(MIME type, width, height) of a PNG, JPEG, GIF or WebP, read from its header; else None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR" and len(data) >= 24:
        return "image/png", int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data.startswith((b"GIF87a", b"GIF89a")) and len(data) >= 10:
        return (
            "image/gif",
            int.from_bytes(data[6:8], "little"),
            int.from_bytes(data[8:10], "little"),
        )
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_info(data)
    if data.startswith(b"\xff\xd8"):
        return _jpeg_info(data)
    return None


def _webp_info(data: bytes) -> tuple[str, int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30:
        w = int.from_bytes(data[26:28], "little") & 0x3FFF
        h = int.from_bytes(data[28:30], "little") & 0x3FFF
        return "image/webp", w, h
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return "image/webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        w = int.from_bytes(data[24:27], "little") + 1
        return "image/webp", w, int.from_bytes(data[27:30], "little") + 1
    return None


def _jpeg_info(data: bytes) -> tuple[str, int, int] | None:
    # Walk the segments to the first start-of-frame marker (SOF0..SOF15 but DHT, JPG, DAC).
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h = int.from_bytes(data[i + 5 : i + 7], "big")
            return "image/jpeg", int.from_bytes(data[i + 7 : i + 9], "big"), h
        i += 2 + length
    return None


def run_read_image(file_path: str, full: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A Read of an image, as the CLI answers it: an image block for the model and the file's
    base64, type, size and dimensions in `tool_use_result`."""
    try:
        size = os.path.getsize(full)
        if size > MAX_IMAGE_BYTES:
            raise ToolError(
                f"Image {file_path} is {size} bytes; the demo agent reads images of at most"
                f" {MAX_IMAGE_BYTES} bytes."
            )
        with open(full, "rb") as f:
            data = f.read(MAX_IMAGE_BYTES + 1)
    except OSError as exc:
        raise ToolError(str(exc)) from None
    info = image_info(data)
    if info is None:
        raise ToolError(f"{file_path} is not a PNG, JPEG, GIF or WebP image.")
    mime, width, height = info
    b64 = base64.b64encode(data).decode("ascii")
    content = [{"type": "image", "source": {"type": "base64", "data": b64, "media_type": mime}}]
    dimensions = {
        "originalWidth": width,
        "originalHeight": height,
        "displayWidth": width,
        "displayHeight": height,
    }
    file_info = {"base64": b64, "type": mime, "originalSize": len(data), "dimensions": dimensions}
    return content, {"type": "image", "file": file_info}


def _structured_patch(old: str, new: str) -> list[dict[str, Any]]:
    """Hunks in the shape of the CLI's `structuredPatch` (what Edit/Write report)."""
    a, b = old.splitlines(), new.splitlines()
    hunks = []
    for group in difflib.SequenceMatcher(None, a, b).get_grouped_opcodes(3):
        lines: list[str] = []
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines += [" " + x for x in a[i1:i2]]
            else:
                lines += ["-" + x for x in a[i1:i2]] + ["+" + x for x in b[j1:j2]]
        first, last = group[0], group[-1]
        hunks.append(
            {
                "oldStart": first[1] + 1,
                "oldLines": last[2] - first[1],
                "newStart": first[3] + 1,
                "newLines": last[4] - first[3],
                "lines": lines,
            }
        )
    return hunks


def run_write(workspace: str, file_path: str, content: str) -> tuple[str, dict[str, Any]]:
    full = inside_workspace(workspace, file_path)
    try:
        with open(full, encoding="utf-8") as f:
            original: str | None = f.read()
    except FileNotFoundError:
        original = None
    except OSError as exc:
        raise ToolError(str(exc)) from None
    try:
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(content)
    except OSError as exc:
        raise ToolError(str(exc)) from None
    if original is None:
        text = f"File created successfully at: {full}"
        result: dict[str, Any] = {
            "type": "create",
            "filePath": full,
            "content": content,
            "structuredPatch": [],
            "originalFile": None,
        }
    else:
        text = f"The file {full} has been updated successfully."
        result = {
            "type": "update",
            "filePath": full,
            "content": content,
            "structuredPatch": _structured_patch(original, content),
            "originalFile": original,
        }
    return text, result
