"""``[notify]`` and its ``[[notify.webhooks]]`` (docs/identities.md): which URL hears of which
events, in which body format, signed with which secret, and how long a delivery is tried; checked
(and the secrets read) when the configuration is read. The deliveries are gateway/team/notify.py's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = [
    "EVENTS",
    "WEBHOOK_KEYS",
    "NotifyConfigError",
    "NotifySettings",
    "Webhook",
    "parse_notify",
]

# What a webhook may ask to hear of (also the values of the notifications metric's event label).
EVENTS: Final = (
    "permission.pending",
    "turn.ended",
    "agent.error",
    "session.stalled",
    "session.ended",
    "budget.warning",
    "budget.exceeded",
)
FORMATS: Final = ("json", "slack", "ntfy")
WEBHOOK_KEYS: Final = (
    "url",
    "events",
    "secret_file",
    "format",
    "remind_after_sec",
    "timeout_sec",
    "retry_for_sec",
)
MAX_WEBHOOKS: Final = 32
TIMEOUT_S: Final = 5.0  # per attempt, at most
RETRY_FOR_S: Final = 60.0  # from the first attempt, at most


@dataclass(frozen=True)
class Webhook:
    url: str
    events: frozenset[str] = frozenset(EVENTS)
    secret: bytes | None = None
    format: str = "json"
    remind_after_sec: float = 300.0
    timeout_sec: float = TIMEOUT_S
    retry_for_sec: float = RETRY_FOR_S


@dataclass(frozen=True)
class NotifySettings:
    """``[notify]``: its webhooks."""

    webhooks: tuple[Webhook, ...] = ()


class NotifyConfigError(ValueError):
    pass


def parse_notify(table: Any, where: str) -> NotifySettings:
    """``[notify]`` with its ``[[notify.webhooks]]``."""
    return NotifySettings(parse_webhooks(table, where))


def parse_webhooks(table: Any, where: str) -> tuple[Webhook, ...]:
    """``[notify]`` with its ``[[notify.webhooks]]``; secrets are read from their files now. The
    names are known already (gateway/config/strict.py)."""
    if not isinstance(table, dict):
        raise NotifyConfigError(f"{where}: [notify] must be a table")
    entries = table.get("webhooks", [])
    if not isinstance(entries, list) or len(entries) > MAX_WEBHOOKS:
        raise NotifyConfigError(
            f"{where}: [[notify.webhooks]] must be at most {MAX_WEBHOOKS} tables"
        )
    hooks = []
    for i, entry in enumerate(entries, 1):
        w = f"{where} [[notify.webhooks]] {i}"
        if not isinstance(entry, dict):
            raise NotifyConfigError(f"{w} must be a table")
        url = entry.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise NotifyConfigError(f"{w}: url must be an http:// or https:// URL")
        kw: dict[str, Any] = {"url": url}
        if "events" in entry:
            events = entry["events"]
            if not isinstance(events, list) or not events or any(e not in EVENTS for e in events):
                raise NotifyConfigError(f"{w}: events must be a list of {', '.join(EVENTS)}")
            kw["events"] = frozenset(events)
        if "format" in entry:
            if entry["format"] not in FORMATS:
                raise NotifyConfigError(f"{w}: format must be one of {', '.join(FORMATS)}")
            kw["format"] = entry["format"]
        if entry.get("secret_file"):
            kw["secret"] = _read_secret(entry["secret_file"], w)
        for key, low, high in (
            ("remind_after_sec", 0.0, 7 * 24 * 3600.0),
            ("timeout_sec", 0.1, TIMEOUT_S),
            ("retry_for_sec", 0.0, RETRY_FOR_S),
        ):
            if key in entry:
                value = entry[key]
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise NotifyConfigError(f"{w}: {key} must be a number")
                if not low <= value <= high:
                    raise NotifyConfigError(f"{w}: {key} must be {low:g} to {high:g}")
                kw[key] = float(value)
        hooks.append(Webhook(**kw))
    return tuple(hooks)


def _read_secret(path: Any, where: str) -> bytes:
    if not isinstance(path, str):
        raise NotifyConfigError(f"{where}: secret_file must be a path")
    try:
        secret = Path(path).expanduser().read_bytes().strip()
    except OSError as err:
        raise NotifyConfigError(
            f"{where}: cannot read secret_file {path}: {err.strerror}"
        ) from None
    if not secret:
        raise NotifyConfigError(f"{where}: secret_file {path} is empty")
    return secret
