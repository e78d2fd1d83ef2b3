"""``[notify]`` and its ``[[notify.webhooks]]`` (docs/identities.md): which URL hears of which
events, in which body format, signed with which secret, and how long a delivery is tried; checked
(and the secrets read) when the configuration is read. The deliveries are gateway/team/notify.py's."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from gateway.config.checks import ConfigError
from gateway.config.settings import build, declared, file_values, setting

__all__ = ["EVENTS", "WEBHOOK_KEYS", "NotifySettings", "Webhook", "parse_notify"]

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
MAX_WEBHOOKS: Final = 32
TIMEOUT_SEC: Final = 5.0  # per attempt, at most
RETRY_FOR_SEC: Final = 60.0  # from the first attempt, at most


def _url(value: str, name: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"{name} must be an http:// or https:// URL")
    return value


def _events(value: list[Any], name: str) -> frozenset[str]:
    if not value or any(e not in EVENTS for e in value):
        raise ValueError(f"{name} must be a list of {', '.join(EVENTS)}")
    return frozenset(value)


@dataclass(frozen=True)
class Webhook:
    """One ``[[notify.webhooks]]`` entry (docs/identities.md#notifications)."""

    url: str = setting(check=_url, doc="where to POST, http or https")
    events: frozenset[str] = setting(
        frozenset(EVENTS), toml=list, check=_events, shown="all seven", doc="what it hears of"
    )
    secret_file: str | None = setting(
        None, toml=str, doc="the HMAC-SHA256 secret that signs each body, read at start"
    )
    format: str = setting("json", choices=FORMATS, doc="the body's format")
    remind_after_sec: float = setting(
        300.0, low=0, high=7 * 24 * 3600, doc="a permission still pending is told again"
    )
    timeout_sec: float = setting(TIMEOUT_SEC, low=0.1, high=TIMEOUT_SEC, doc="per attempt")
    retry_for_sec: float = setting(
        RETRY_FOR_SEC, low=0, high=RETRY_FOR_SEC, doc="from the first attempt; then dropped"
    )
    secret: bytes | None = None  # secret_file's content


WEBHOOK_KEYS: Final = tuple(declared(Webhook))


@dataclass(frozen=True)
class NotifySettings:
    """``[notify]``: its webhooks."""

    webhooks: tuple[Webhook, ...] = ()


def parse_notify(table: Any, where: str) -> NotifySettings:
    """``[notify]`` with its ``[[notify.webhooks]]``; secrets are read from their files now. The
    names are known already (gateway/config/strict.py)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [notify] must be a table")
    entries = table.get("webhooks", [])
    if not isinstance(entries, list) or len(entries) > MAX_WEBHOOKS:
        raise ConfigError(f"{where}: [[notify.webhooks]] must be at most {MAX_WEBHOOKS} tables")
    hooks = []
    for i, entry in enumerate(entries, 1):
        w = f"{where} [[notify.webhooks]] {i}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{w} must be a table")
        hook: Webhook = build(Webhook, file_values(Webhook, entry, w), w)
        if hook.secret_file:
            hook = replace(hook, secret=_read_secret(hook.secret_file, w))
        hooks.append(hook)
    return NotifySettings(tuple(hooks))


def _read_secret(path: str, where: str) -> bytes:
    try:
        secret = Path(path).expanduser().read_bytes().strip()
    except OSError as err:
        raise ConfigError(f"{where}: cannot read secret_file {path}: {err.strerror}") from None
    if not secret:
        raise ConfigError(f"{where}: secret_file {path} is empty")
    return secret
