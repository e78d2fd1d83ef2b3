"""Signing in: a bearer header and a users file (docs/identities.md) written by a test."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from gateway.config import Config
from gateway.config.auth import AuthSettings
from tests.support.gateway_peer import make_config


def bearer(token: str) -> dict[str, str]:
    """The ``Authorization`` header that presents ``token``."""
    return {"Authorization": f"Bearer {token}"}


def users_toml(users: dict[str, tuple[str, str]]) -> str:
    """A users file: one ``[[users]]`` table per name, ``{name: (role, token)}``, the token kept
    only as its SHA-256."""
    return "".join(
        f'[[users]]\nname = "{name}"\nrole = "{role}"\n'
        f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n\n'
        for name, (role, token) in users.items()
    )


def users_config(root: Path, users: dict[str, tuple[str, str]], **kw: Any) -> Config:
    """The in-process gateway's config (``make_config``: workspace root ``root``, ``kw``) with a
    users file of ``users`` (as ``users_toml``), written to ``root``/users.toml."""
    path = root / "users.toml"
    path.write_text(users_toml(users))
    return make_config(root, auth=AuthSettings(users_file=path), **kw)


async def shared_with_viewer(gateway: Any, owner: str, viewer: str, **body: Any) -> str:
    """A demo session the user with token ``owner`` creates (``body``: more of the request), the
    user named ``viewer`` made one of its viewers: its id."""
    resp = await gateway.post("/v1/session", json={"agent": "demo", **body}, headers=bearer(owner))
    sid = (await resp.json())["session_id"]
    members = {"members": {viewer: "viewer"}}
    await gateway.patch(f"/v1/session/{sid}", json=members, headers=bearer(owner))
    return sid
