"""``[auth]`` and ``[auth.oidc]`` (docs/identities.md): where the users file and the audit log are,
and which OIDC issuer's tokens are accepted, each key declared once (gateway/config/settings.py)
and checked when the configuration is read. What the gateway does with them is
gateway/team/auth.py's (who is asking) and gateway/team/audit.py's."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from gateway.config.checks import ConfigError
from gateway.config.settings import build, declared, file_values, setting

__all__ = [
    "ASYMMETRIC",
    "AUTH_KEYS",
    "OIDC_KEYS",
    "AuthSettings",
    "OidcSettings",
    "parse_auth",
]

MAX_LEEWAY_SEC: Final = 300
# Asymmetric algorithms only: "none" and HS* are never accepted, whatever the config says.
ASYMMETRIC: Final = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)


def _url(value: str, name: str) -> str:
    if value and not value.startswith(("https://", "http://")):
        raise ValueError(f"{name} must be an http(s) URL, got {value!r}")
    return value


def _not_empty(value: str, name: str) -> str:
    if not value:
        raise ValueError(f"{name} must not be empty")
    return value


def _issuer(value: str, name: str) -> str:
    return _url(_not_empty(value, name), name)


def _algorithms(value: list[Any], name: str) -> tuple[str, ...]:
    if not value or not all(isinstance(a, str) for a in value):
        raise ValueError(f"{name} must be a non-empty list of names")
    bad = [a for a in value if a not in ASYMMETRIC]
    if bad:
        raise ValueError(
            f"{name} {', '.join(bad)} not allowed (never none or HS*); "
            f"choose from {', '.join(sorted(ASYMMETRIC))}"
        )
    return tuple(value)


def _path(value: str, name: str) -> Path | None:
    # Empty: none, as unset.
    return Path(value).expanduser().absolute() if value else None


@dataclass(frozen=True)
class OidcSettings:
    """``[auth.oidc]``: the issuer whose JWTs are accepted."""

    issuer: str = setting(check=_issuer, doc="the issuer of the JWTs accepted")
    audience: str = setting(check=_not_empty, doc="the audience the JWTs must name")
    jwks_url: str = setting(
        "", check=_url, shown='`""`: from the issuer\'s discovery document',
        doc="the issuer's keys",
    )  # fmt: skip
    user_claim: str = setting("sub", check=_not_empty, doc="the claim naming the user")
    role_claim: str = setting("rawp_role", check=_not_empty, doc="the claim naming the role")
    leeway_sec: float = setting(60.0, low=0, high=MAX_LEEWAY_SEC, doc="clock skew allowed")
    algorithms: tuple[str, ...] = setting(
        ("RS256", "ES256"), toml=list, check=_algorithms, doc="never none nor HS*"
    )


@dataclass(frozen=True)
class AuthSettings:
    """``[auth]``: the users file, the audit log, and ``[auth.oidc]``."""

    users_file: Path | None = setting(
        None, toml=str, check=_path, doc="[[users]] of name, role, token_sha256"
    )
    audit_log: Path | None = setting(None, toml=str, check=_path, doc="the JSON-lines audit log")
    audit_max_bytes: int = setting(
        64 * 1024 * 1024, low=4096, doc="the audit log is rotated past it"
    )
    audit_keep: int = setting(5, low=1, doc="rotated audit files kept")
    oidc: OidcSettings | None = None  # its own table

    @property
    def configured(self) -> bool:
        """Credentials besides the token: users file or OIDC."""
        return self.users_file is not None or self.oidc is not None


AUTH_KEYS: Final = (*declared(AuthSettings), "oidc")
OIDC_KEYS: Final = tuple(declared(OidcSettings))


def parse_auth(table: Any, where: str) -> AuthSettings:
    """``[auth]`` (and ``[auth.oidc]``) of the config file; its names are known already
    (gateway/config/strict.py)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [auth] must be a table")
    own = {key: value for key, value in table.items() if key != "oidc"}
    auth = build(AuthSettings, file_values(AuthSettings, own, f"{where} [auth]"), f"{where} [auth]")
    if "oidc" not in table:
        return auth
    oidc = table["oidc"]
    if not isinstance(oidc, dict):
        raise ConfigError(f"{where} [auth.oidc] must be a table")
    values = file_values(OidcSettings, oidc, f"{where} [auth.oidc]")
    return replace(auth, oidc=build(OidcSettings, values, f"{where} [auth.oidc]"))
