"""``[auth]`` and ``[auth.oidc]`` (docs/identities.md): where the users file and the audit log are,
and which OIDC issuer's tokens are accepted, checked when the configuration is read. What the
gateway does with them is gateway/team/auth.py's (who is asking) and gateway/team/audit.py's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = [
    "ASYMMETRIC",
    "AUTH_KEYS",
    "OIDC_KEYS",
    "AuthConfigError",
    "AuthSettings",
    "OidcSettings",
    "parse_auth",
]

MAX_LEEWAY_SEC: Final = 300
# Asymmetric algorithms only: "none" and HS* are never accepted, whatever the config says.
ASYMMETRIC: Final = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)


@dataclass(frozen=True)
class OidcSettings:
    issuer: str
    audience: str
    jwks_url: str = ""
    user_claim: str = "sub"
    role_claim: str = "rawp_role"
    leeway_sec: float = 60.0
    algorithms: tuple[str, ...] = ("RS256", "ES256")


@dataclass(frozen=True)
class AuthSettings:
    users_file: Path | None = None
    audit_log: Path | None = None
    audit_max_bytes: int = 64 * 1024 * 1024
    audit_keep: int = 5
    oidc: OidcSettings | None = None

    @property
    def configured(self) -> bool:
        """Credentials besides the token: users file or OIDC."""
        return self.users_file is not None or self.oidc is not None


class AuthConfigError(ValueError):
    pass


AUTH_KEYS: Final = ("users_file", "audit_log", "audit_max_bytes", "audit_keep", "oidc")
OIDC_KEYS: Final = tuple(OidcSettings.__dataclass_fields__)


def parse_auth(table: Any, where: str) -> AuthSettings:
    """``[auth]`` (and ``[auth.oidc]``) of the config file; its names are known already
    (gateway/config/strict.py)."""
    if not isinstance(table, dict):
        raise AuthConfigError(f"{where}: [auth] must be a table")
    kw: dict[str, Any] = {}
    for key in ("users_file", "audit_log"):
        value = table.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise AuthConfigError(f"{where} [auth]: {key} must be a path string")
            if value:
                kw[key] = Path(value).expanduser().absolute()
    for key, low in (("audit_max_bytes", 4096), ("audit_keep", 1)):
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise AuthConfigError(f"{where} [auth]: {key} must be an integer >= {low}")
            kw[key] = value
    if "oidc" in table:
        kw["oidc"] = _parse_oidc(table["oidc"], where)
    return AuthSettings(**kw)


def _parse_oidc(table: Any, where: str) -> OidcSettings:
    where = f"{where} [auth.oidc]"
    if not isinstance(table, dict):
        raise AuthConfigError(f"{where} must be a table")
    kw: dict[str, Any] = {}
    for key in ("issuer", "audience", "jwks_url", "user_claim", "role_claim"):
        if key in table:
            if not isinstance(table[key], str):
                raise AuthConfigError(f"{where}: {key} must be a string")
            kw[key] = table[key]
    for key in ("issuer", "audience"):
        if not kw.get(key):
            raise AuthConfigError(f"{where}: {key} is required")
    for key in ("issuer", "jwks_url"):
        url = kw.get(key, "")
        if url and not url.startswith(("https://", "http://")):
            raise AuthConfigError(f"{where}: {key} must be an http(s) URL, got {url!r}")
    for key in ("user_claim", "role_claim"):
        if key in kw and not kw[key]:
            raise AuthConfigError(f"{where}: {key} must not be empty")
    if "leeway_sec" in table:
        leeway = table["leeway_sec"]
        if isinstance(leeway, bool) or not isinstance(leeway, int | float):
            raise AuthConfigError(f"{where}: leeway_sec must be a number")
        if not 0 <= leeway <= MAX_LEEWAY_SEC:
            raise AuthConfigError(f"{where}: leeway_sec must be 0 to {MAX_LEEWAY_SEC}")
        kw["leeway_sec"] = float(leeway)
    if "algorithms" in table:
        algs = table["algorithms"]
        if not isinstance(algs, list) or not algs or not all(isinstance(a, str) for a in algs):
            raise AuthConfigError(f"{where}: algorithms must be a non-empty list of names")
        bad = [a for a in algs if a not in ASYMMETRIC]
        if bad:
            raise AuthConfigError(
                f"{where}: algorithms {', '.join(bad)} not allowed (never none or HS*); "
                f"choose from {', '.join(sorted(ASYMMETRIC))}"
            )
        kw["algorithms"] = tuple(algs)
    return OidcSettings(**kw)
