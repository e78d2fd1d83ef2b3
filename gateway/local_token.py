"""The token ``serve`` makes when none is configured, and where its own user's clients find it
(docs/identities.md, "The local token").

There is always a credential, loopback included: a process on the same machine (an agent, or a
test file an agent wrote and a permitted ``npm test`` ran) is no master by being local. So a
gateway given no token makes one (256 random bits) and writes it, mode 0600, in a directory of
its own user's (mode 0700), one file per port: ``token-<PORT>``. A client given a loopback URL
and no token reads the file of that URL's port, which is all it knows about the gateway.

The directory is ``$XDG_RUNTIME_DIR/rawp-gateway`` when the user has a runtime directory: made by
the login manager for this user alone, on a tmpfs (the token never reaches a disk or a backup) and
gone at logout. Without one (a container, a service without a login), ``$XDG_STATE_HOME``, else
``~/.local/state``, then ``rawp-gateway``. Neither is inside a workspace, and the sandbox masks the
directory (docs/isolation.md); an agent with ``[isolation] mode = "none"`` runs as this same user
and can read it: only the sandbox keeps it out of the agent's reach.

A leaf: both the server (which writes) and the clients (which read) import it.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

__all__ = [
    "TOKEN_BYTES",
    "LocalTokenError",
    "forget_token",
    "local_token",
    "loopback_port",
    "new_token",
    "token_dir",
    "token_path",
    "write_token",
]

TOKEN_BYTES: Final = 32  # 256 random bits
DIR_NAME: Final = "rawp-gateway"
MAX_TOKEN_FILE_BYTES: Final = 1024  # a made token is 43 characters; anything longer is not one


class LocalTokenError(Exception):
    """The token's directory or file cannot be used safely: one line saying why."""


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where this user's gateways keep the tokens they made (see the module's docstring)."""
    env = os.environ if environ is None else environ
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime) and os.path.isdir(runtime):
        return Path(runtime) / DIR_NAME
    state = env.get("XDG_STATE_HOME", "")
    base = Path(state) if os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / DIR_NAME


def token_path(port: int, environ: Mapping[str, str] | None = None) -> Path:
    return token_dir(environ) / f"token-{port}"


def ensure_dir(path: Path) -> None:
    """The directory, made 0700 if missing; one that is not this user's own directory is refused
    (another user could read or plant tokens there), one others may enter is closed to them."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise LocalTokenError(
            f"{path} is not a directory of this user's: the token stays unwritten"
        )
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


def write_token(path: Path, token: str) -> None:
    """Write ``token`` to ``path`` (mode 0600) at once: a client never reads half of it, and a
    file left by a gateway that died on this port is replaced."""
    ensure_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)
            data = token.encode() + b"\n"
            if os.write(fd, data) != len(data):  # a full disk: never a half token in the file
                raise OSError(errno.ENOSPC, "the token was written short")
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # no stray copy of a secret left beside the file
        raise


def forget_token(path: Path, token: str) -> None:
    """Remove the file when it still holds ``token`` (not a later gateway's on the same port)."""
    if _read(path) == token:
        path.unlink(missing_ok=True)


def loopback_port(url: str) -> int | None:
    """The port of a URL whose host is this machine's loopback, else None."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme in ("https", "wss") else 80)
    except ValueError:
        return None
    host = (parts.hostname or "").rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return port
    try:
        return port if ipaddress.ip_address(host).is_loopback else None
    except ValueError:
        return None


def local_token(url: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The token the gateway at ``url`` made, when ``url`` is a loopback URL and this user's
    directory holds one for its port; else None."""
    port = loopback_port(url)
    return None if port is None else _read(token_path(port, environ))


def _read(path: Path) -> str | None:
    """The file's token, when it is this user's own regular file that no one else may read or
    write (else not trusted: a token planted by another user would be sent to whoever listens)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None
        raw = os.read(fd, MAX_TOKEN_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_TOKEN_FILE_BYTES:
        return None
    token = raw.decode("ascii", "replace").strip()
    return token or None
