"""What the gateway writes on Claude Code's stdin (``--input-format stream-json``): prompts (with
images), interrupts, permission answers, mode changes and the ``initialize`` request."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, ClassVar, Final

import msgspec

from ..base import Initializes, PromptImage, TakesImages

_encode: Final = msgspec.json.encode


class ClaudeCodeInput(Initializes, TakesImages):
    """What the gateway writes on Claude Code's stdin (``--input-format stream-json``): one JSON
    object per line."""

    accepts_images: ClassVar[bool] = True

    def prompt(self, text: str, images: Sequence[PromptImage] = ()) -> bytes | None:
        content: str | list[dict[str, Any]] = text
        if images:
            # Image blocks first, then the text (the Messages API's advice for image prompts);
            # the CLI passes them to the model as they are.
            content = [
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": image.mime_type,
                        "data": base64.b64encode(image.data).decode("ascii"),
                    },
                }
                for image in images
            ]
            content.append({"type": "text", "text": text})
        return _encode({"type": "user", "message": {"role": "user", "content": content}}) + b"\n"

    def interrupt(self, request_id: str) -> bytes | None:
        return (
            _encode(
                {
                    "type": "control_request",
                    "request_id": request_id,
                    "request": {"subtype": "interrupt"},
                }
            )
            + b"\n"
        )

    def permission(
        self,
        request_id: str,
        *,
        allow: bool,
        message: str = "",
        updated_input: dict[str, Any] | None = None,
    ) -> bytes | None:
        # The CLI requires updatedInput on allow; the original input means "run it as asked".
        answer: dict[str, Any]
        if allow:
            answer = {"behavior": "allow", "updatedInput": updated_input or {}}
        else:
            answer = {"behavior": "deny", "message": message or "Denied by the user."}
        return (
            _encode(
                {
                    "type": "control_response",
                    "response": {
                        "subtype": "success",
                        "request_id": request_id,
                        "response": answer,
                    },
                }
            )
            + b"\n"
        )

    def set_mode(self, request_id: str, mode: str) -> bytes | None:
        return (
            _encode(
                {
                    "type": "control_request",
                    "request_id": request_id,
                    "request": {"subtype": "set_permission_mode", "mode": mode},
                }
            )
            + b"\n"
        )

    def initialize(self, request_id: str) -> bytes | None:
        """Asked at spawn: the CLI answers at once with its slash commands (its ``init`` line,
        with the tools, comes only when a prompt starts a run)."""
        return (
            _encode(
                {
                    "type": "control_request",
                    "request_id": request_id,
                    "request": {"subtype": "initialize"},
                }
            )
            + b"\n"
        )
