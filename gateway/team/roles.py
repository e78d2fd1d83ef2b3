"""What someone may do: the roles of docs/identities.md, a user's role on a session, and the role
each master frame needs. Who is asking (credentials made into an ``Identity``) is auth.py's.

Roles are ranked ``viewer`` < ``operator`` < ``admin``. A user's role on a session is the lower of
their own role and the one the session gives them (``members``); the owner has their own role, an
admin has ``admin`` on every session, anyone else does not see the session at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

__all__ = [
    "ADMIN",
    "AUDITED",
    "LOCAL",
    "ROLES",
    "Identity",
    "Sender",
    "at_least",
    "check_members",
    "lower",
    "may_send",
    "needed",
    "session_role",
    "valid_user_name",
]

ROLES: Final = ("viewer", "operator", "admin")
RANK: Final = {role: rank for rank, role in enumerate(ROLES)}
MAX_USER_NAME_CHARS: Final = 128
MAX_MEMBERS: Final = 256  # users a session is shared with


@dataclass(frozen=True, slots=True)
class Identity:
    """A signed-in user. ``role`` is None for a user whose token named no known role."""

    user: str
    role: str | None


ADMIN: Final = Identity("admin", "admin")  # the holder of token_file's token
LOCAL: Final = Identity("local", "admin")  # everyone, when no credential is configured


def at_least(role: str | None, wanted: str) -> bool:
    return role is not None and RANK[role] >= RANK[wanted]


def lower(a: str, b: str) -> str:
    return a if RANK[a] <= RANK[b] else b


def session_role(identity: Identity, owner: str, members: Mapping[str, str]) -> str | None:
    """The identity's role on a session of ``owner`` shared with ``members``; None: not visible."""
    role = identity.role
    if role is None:
        return None
    if role == "admin" or identity.user == owner:
        return role
    given = members.get(identity.user)
    return lower(role, given) if given is not None else None


# What a master may send on a WebSocket: every control.* frame needs operator, a rename admin;
# the rest (capabilities) anyone attached.
_NEEDS: Final = {"session.renamed": "admin"}


def needed(frame_type: str) -> str | None:
    """The role a master needs on a session to send a frame of this type (None: any)."""
    if frame_type.startswith("control."):
        return "operator"
    return _NEEDS.get(frame_type)


def may_send(role: str | None, frame_type: str) -> bool:
    wanted = needed(frame_type)
    return wanted is None or at_least(role, wanted)


# The audit log's action for each master frame it records.
AUDITED: Final = {
    "control.prompt.request": "prompt",
    "control.prompt.cancel": "cancel",
    "control.interaction.response": "permission",
    "control.interaction.timeout": "permission",
    "control.mode.switch": "mode",
    "control.session.compact": "compact",
    "session.renamed": "session.rename",
}


@dataclass(frozen=True, slots=True)
class Sender:
    """Who sent a frame on a WebSocket: the identity the upgrade carried, and its peer address."""

    identity: Identity
    peer: str | None


def check_members(value: Any) -> dict[str, str]:
    """``members`` of a PATCH: ``{"user": "viewer"|"operator"}``; ValueError says what is wrong."""
    if not isinstance(value, dict) or len(value) > MAX_MEMBERS:
        raise ValueError(f"members must be an object of at most {MAX_MEMBERS} users")
    for user, role in value.items():
        if not valid_user_name(user):
            raise ValueError(
                f"members: {str(user)[:64]!r} is not a user name (1 to {MAX_USER_NAME_CHARS} "
                "printable characters)"
            )
        if role not in ("viewer", "operator"):
            raise ValueError(f"members: the role of {user!r} must be viewer or operator")
    return dict(value)


def valid_user_name(name: Any) -> TypeGuard[str]:
    return isinstance(name, str) and 0 < len(name) <= MAX_USER_NAME_CHARS and name.isprintable()
