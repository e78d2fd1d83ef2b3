"""Signing in: a bearer header and a users file (docs/identities.md) written by a test."""

from __future__ import annotations

import hashlib


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
