"""Who is asking: the credentials of docs/identities.md made into an ``Identity`` (user, role).
What each role may do is roles.py's.

Theory of operation
-------------------
Three kinds of credential may be configured together; a bearer token is accepted by the first that
knows it, in this order:

* ``token_file`` (or ``RAWP_GATEWAY_TOKEN``): one shared token; its holder is user ``admin`` with
  role ``admin``, as before identities existed;
* a users file (``[auth] users_file``): ``[[users]]`` tables of ``name``, ``role`` and
  ``token_sha256``; the token itself is never stored. The SHA-256 of a presented token is compared
  with every user's in constant time (no early exit). The file is read again on SIGHUP; a file that
  cannot be used then keeps the users already loaded and says why in one log line;
* OIDC (``[auth.oidc]``): a JWT signed by one of the issuer's keys, checked with PyJWT for issuer,
  audience, expiry (with a bounded leeway) and an allow-listed asymmetric algorithm (never
  ``none``, never HMAC: an ``HS256`` token "signed" with the issuer's public key is refused before
  any key is looked at). The keys come from the issuer's JWKS (``jwks_url``, or the ``jwks_uri`` of
  its ``/.well-known/openid-configuration``), fetched with PyJWT's ``PyJWKClient`` in a worker
  thread (never on the event loop), one fetch at a time, cached for ``JWKS_LIFESPAN_SEC``. A token
  whose ``kid`` is unknown refetches the set (key rotation), at most ``MAX_KID_REFETCHES`` times a
  minute, so random ``kid``s cannot make the gateway hammer the issuer. An issuer that cannot be
  reached leaves the keys fetched before in use and is asked again after ``RETRY_AFTER_SEC``. The
  user is the ``user_claim``; the role the ``role_claim`` (a string or a list: the highest known
  role wins).

There is always a credential: with none configured at all, every request is refused (``serve``
and ``demo`` make a token first when none is configured, gateway/local_token.py); being on the
same machine makes no one a master.

The settings (``AuthSettings``, read from ``[auth]`` and ``[auth.oidc]``) are gateway/config/auth.py's.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import jwt
from jwt import PyJWKClient
from jwt.api_jwk import PyJWK, PyJWKSet

from gateway.config.auth import AuthSettings, OidcSettings
from gateway.config.checks import read_toml
from gateway.team.roles import (
    ADMIN,
    MAX_USER_NAME_CHARS,
    RANK,
    ROLES,
    Identity,
    valid_user_name,
)

__all__ = ["AuthFailure", "Authenticator", "OidcVerifier", "highest_role", "load_users"]

log = logging.getLogger("rawp_gateway.auth")

MAX_USERS: Final = 1000  # entries of a users file (each request compares against all of them)
MAX_USERS_FILE_BYTES: Final = 1024 * 1024
MAX_BEARER_BYTES: Final = 16 * 1024  # a longer credential is refused unread (JWTs are ~1 KiB)
JWKS_LIFESPAN_SEC: Final = 300.0  # a fetched key set is used this long, then fetched again
JWKS_TIMEOUT_SEC: Final = 5.0
MAX_KID_REFETCHES: Final = 5  # forced refetches for unknown kids, per minute
RETRY_AFTER_SEC: Final = 5.0  # after a failed fetch, the issuer is not asked again before this


@dataclass(frozen=True, slots=True)
class AuthFailure:
    """Why a credential was refused (for the audit log; never the credential itself)."""

    reason: str


# --- the users file -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _User:
    identity: Identity
    digest: bytes  # SHA-256 of the token


def load_users(path: Path) -> list[_User]:
    """The users of a users file; ValueError (with the file's name) when it cannot be used."""
    _, doc = read_toml(path, MAX_USERS_FILE_BYTES, "users file")
    entries = doc.get("users", [])
    if not isinstance(entries, list) or len(entries) > MAX_USERS:
        raise ValueError(f"users file {path}: [[users]] must be at most {MAX_USERS} tables")
    users: list[_User] = []
    names: set[str] = set()
    digests: set[bytes] = set()
    for i, entry in enumerate(entries, 1):
        where = f"users file {path}: user {i}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} is not a table")
        name, role, digest = entry.get("name"), entry.get("role"), entry.get("token_sha256")
        if not valid_user_name(name):
            raise ValueError(f"{where}: name must be 1 to {MAX_USER_NAME_CHARS} characters")
        if role not in ROLES:
            raise ValueError(f"{where} ({name}): role must be one of {', '.join(ROLES)}")
        try:
            raw = bytes.fromhex(digest) if isinstance(digest, str) else b""
        except ValueError:
            raw = b""
        if len(raw) != 32:
            raise ValueError(f"{where} ({name}): token_sha256 must be 64 hex digits")
        if name in names or raw in digests:
            raise ValueError(f"{where} ({name}): name or token given twice")
        names.add(name)
        digests.add(raw)
        users.append(_User(Identity(name, role), raw))
    return users


# --- OIDC -----------------------------------------------------------------------------------------


class OidcVerifier:
    """JWTs of one issuer, its keys fetched (off the event loop) and cached."""

    def __init__(self, settings: OidcSettings) -> None:
        self.settings = settings
        self._jwks_url = settings.jwks_url
        self._keys: dict[str, PyJWK] = {}
        self._fetched_at = -JWKS_LIFESPAN_SEC
        self._failed_at = -RETRY_AFTER_SEC
        self._fetching: asyncio.Future[None] | None = None
        self._refetches: deque[float] = deque(maxlen=MAX_KID_REFETCHES)

    async def verify(self, token: str) -> Identity | AuthFailure:
        s = self.settings
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            return AuthFailure("not a JWT")
        alg = header.get("alg")
        if alg not in s.algorithms:  # "none" and HS* never are
            return AuthFailure(f"algorithm {str(alg)[:16]!r} not allowed")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            return AuthFailure("the token names no key (kid)")
        key = await self._key(kid)
        if key is None:
            if not self._keys:
                return AuthFailure("the issuer's keys could not be fetched")
            return AuthFailure("unknown signing key")
        try:
            claims = jwt.decode(
                token,
                key=key,
                algorithms=list(s.algorithms),
                audience=s.audience,
                issuer=s.issuer,
                leeway=s.leeway_sec,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            return AuthFailure("token expired")
        except jwt.InvalidAudienceError:
            return AuthFailure("wrong audience")
        except jwt.InvalidIssuerError:
            return AuthFailure("wrong issuer")
        except jwt.PyJWTError as err:
            return AuthFailure(f"invalid token: {type(err).__name__}")
        user = _claim(claims, s.user_claim)
        if not valid_user_name(user):
            return AuthFailure(f"no user in claim {s.user_claim}")
        return Identity(user, highest_role(_claim(claims, s.role_claim)))

    async def _key(self, kid: str) -> PyJWK | None:
        if time.monotonic() - self._fetched_at >= JWKS_LIFESPAN_SEC:
            await self._refresh()
        key = self._keys.get(kid)
        if key is None and self._may_refetch(time.monotonic()):
            await self._refresh()  # rotation: a key the cached set does not have yet
            key = self._keys.get(kid)
        return key

    async def _refresh(self) -> None:
        """Fetch the key set; an issuer that cannot be reached leaves the keys there were (a
        short outage does not sign everyone out) and is not asked again for ``RETRY_AFTER_SEC``."""
        if time.monotonic() - self._failed_at < RETRY_AFTER_SEC:
            return
        try:
            await self._fetch()
        except Exception as err:  # unreachable, an error status, not a key set
            self._failed_at = time.monotonic()
            log.warning("cannot fetch the OIDC issuer's keys: %s", err)

    def _may_refetch(self, now: float) -> bool:
        recent = self._refetches
        if len(recent) == recent.maxlen and now - recent[0] < 60:
            return False
        recent.append(now)
        return True

    async def _fetch(self) -> None:
        """One fetch at a time: whoever comes while one runs waits for it."""
        if self._fetching is None:
            self._fetching = asyncio.ensure_future(self._fetch_now())
        fetching = self._fetching
        try:
            await asyncio.shield(fetching)
        finally:
            if fetching.done() and self._fetching is fetching:
                self._fetching = None

    async def _fetch_now(self) -> None:
        url = self._jwks_url or await asyncio.to_thread(self._discover)
        self._jwks_url = url
        client = PyJWKClient(url, cache_jwk_set=False, timeout=JWKS_TIMEOUT_SEC)
        keyset: PyJWKSet = await asyncio.to_thread(client.get_jwk_set)
        self._keys = {
            k.key_id: k for k in keyset.keys if k.key_id and k.public_key_use in (None, "sig")
        }
        self._fetched_at = time.monotonic()
        log.info("OIDC keys fetched", extra={"url": url, "keys": len(self._keys)})

    def _discover(self) -> str:
        """The ``jwks_uri`` of the issuer's discovery document (in a worker thread)."""
        issuer = self.settings.issuer.rstrip("/")
        # PyJWKClient fetches any JSON object: no redirects, a timeout, the same TLS as the keys.
        doc = PyJWKClient(
            f"{issuer}/.well-known/openid-configuration",
            cache_jwk_set=False,
            timeout=JWKS_TIMEOUT_SEC,
        ).fetch_data()
        uri = doc.get("jwks_uri")
        if not isinstance(uri, str) or not uri.startswith(("https://", "http://")):
            raise ValueError(f"{issuer}'s discovery document has no jwks_uri")
        return uri


def _claim(claims: Mapping[str, Any], name: str) -> Any:
    """A claim by name; a dotted name reaches into objects (``realm_access.roles``)."""
    if name in claims:
        return claims[name]
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def highest_role(value: Any) -> str | None:
    """The highest known role in a claim that is a string or a list of them."""
    values = value if isinstance(value, list) else [value]
    known = [v for v in values if isinstance(v, str) and v in RANK]
    return max(known, key=RANK.__getitem__) if known else None


# --- the authenticator ----------------------------------------------------------------------------


@dataclass
class Authenticator:
    """Turns a bearer credential into an ``Identity`` (or an ``AuthFailure``)."""

    token: str | None = None
    settings: AuthSettings = field(default_factory=AuthSettings)
    _users: list[_User] = field(default_factory=list)
    _oidc: OidcVerifier | None = None

    def __post_init__(self) -> None:
        if self.settings.users_file is not None:
            self._users = load_users(
                self.settings.users_file
            )  # ValueError: the gateway won't start
        if self.settings.oidc is not None:
            self._oidc = OidcVerifier(self.settings.oidc)

    @property
    def enabled(self) -> bool:
        return self.token is not None or self.settings.configured

    @property
    def oidc(self) -> OidcVerifier | None:
        return self._oidc

    def users(self) -> dict[str, Identity]:
        """The users of the users file by name."""
        return {u.identity.user: u.identity for u in self._users}

    def reload_users(self) -> bool:
        """Read the users file again (SIGHUP); a file that cannot be used keeps the old users."""
        path = self.settings.users_file
        if path is None:
            return False
        try:
            users = load_users(path)
        except ValueError as err:
            log.error(
                "users file not reloaded, the %d users before stay: %s", len(self._users), err
            )
            return False
        self._users = users
        log.info("users file reloaded", extra={"users": len(users)})
        return True

    async def authenticate(self, credential: bytes) -> Identity | AuthFailure:
        if not self.enabled:
            return AuthFailure("no credential is configured")
        if not credential:
            return AuthFailure("no credentials")
        if len(credential) > MAX_BEARER_BYTES:
            return AuthFailure("credentials too long")
        if self.token is not None and hmac.compare_digest(credential, self.token.encode()):
            return ADMIN
        if self._users:
            digest = hashlib.sha256(credential).digest()
            found: Identity | None = None
            for user in self._users:  # every one compared: the time says nothing of which
                if hmac.compare_digest(digest, user.digest):
                    found = user.identity
            if found is not None:
                return found
        if self._oidc is not None and credential.count(b".") == 2:
            try:
                token = credential.decode("ascii")
            except UnicodeDecodeError:
                return AuthFailure("not a JWT")
            return await self._oidc.verify(token)
        return AuthFailure("unknown token")
