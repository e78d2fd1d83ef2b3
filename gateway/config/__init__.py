"""Configuration: the TOML file of docs/configuration.md, command-line flags, ``RAWP_GATEWAY_*`` variables,
and the agent profiles they configure (built-in ones: gateway/agent/profiles.py).

Theory of operation
-------------------
``load_config(path, flags, environ)`` layers the sources: built-in defaults, then the TOML file,
then command-line flags, then environment variables (docs/configuration.md: "Command-line flags override
the file; RAWP_GATEWAY_* environment variables override both"). Every error names the file, the key
and what was expected; nothing is ignored: an unknown section or key is an error too, with its line
and the nearest known name (strict.py).

Each section of the file is one typed object, nested in ``Config`` under the section's name
(``config.server.port``, ``config.fleet.peers``, ``config.budgets.session_usd``), never flattened
into it: a section's object is what its consumer takes whole (the sandbox its ``Isolation``, the
budget ledger its ``Limits``, the identities their ``AuthSettings``), a key's name in the code is
its name in the file, and two sections may use one key name (``[agents.NAME]`` and ``[acp]``
could both say ``default_agent``) without a prefix made up to tell them apart.

A key is declared once, as a field of its section's class with a ``Setting`` (settings.py): name,
type, default, bounds, variable, flag and doc line; parsing, the bounds, the variables, the
``serve`` flags and the docs test all read that declaration. The sections have rooms of their own:
``[server]``, ``[fleet]`` and ``[acp]`` in server.py, ``[agents.NAME]`` in agents.py, ``[auth]`` in
auth.py, ``[notify]`` in notify.py, ``[isolation]`` in isolation.py, ``[[policy.rules]]`` in
policy.py, ``[mcp.servers.NAME]`` in mcp.py. Five are declared on the class of the lower package
that consumes them, in plain metadata: ``[budgets]`` on the ledger's ``Limits``
(gateway/protocol/budget.py, read here), ``[mcp.servers.NAME]`` on ``ServerSpec``
(gateway/protocol/mcp_servers.py),
``[[policy.rules]]`` on ``Rule`` (gateway/protocol/policy.py), ``[isolation]`` on the sandbox's
``Isolation`` and ``[agents.NAME]`` on ``AgentProfile`` (gateway/agent/). This module holds
``Config``, every section's class (``SECTIONS``), the names each section knows and the layering.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from gateway.agent.profiles import (
    FEATURE_NAMES,
    MAX_ARGV_PROMPT_BYTES,
    AgentProfile,
    builtin_profiles,
    command_for,
    parser_features,
    prompt_on_stdin,
    template_args,
)
from gateway.agent.sandbox import Isolation
from gateway.config.agents import PROFILE_KEYS, parse_profile
from gateway.config.auth import AUTH_KEYS, OIDC_KEYS, AuthSettings, OidcSettings, parse_auth
from gateway.config.checks import ConfigError
from gateway.config.isolation import ISOLATION_KEYS, check_binds_apart, parse_isolation
from gateway.config.mcp import MCP_KEYS, McpSettings, parse_mcp
from gateway.config.notify import WEBHOOK_KEYS, NotifySettings, Webhook, parse_notify
from gateway.config.policy import (
    MAX_FILE_BYTES,
    POLICY_SCHEMA,
    PolicySettings,
    parse_policy,
    refuse_too_many_rules,
)
from gateway.config.server import (
    MAX_PEERS,
    AcpSettings,
    FleetSettings,
    ServerSettings,
    normalize_origin,
    route_prefix,
)
from gateway.config.settings import build, declared, environment_values, file_values
from gateway.config.strict import ANY_NAME, Locator, Schema, known_names, unknown_names
from gateway.local_token import new_token
from gateway.protocol.budget import Limits
from gateway.protocol.mcp_servers import ServerSpec
from gateway.protocol.policy import Rule

# The profile names are gateway/agent/profiles.py's, re-exported: a Config holds profiles, and
# whoever builds one names them with it.
__all__ = [
    "CLAUDE_VARIABLE",
    "ISOLATION_KEYS",
    "MAX_ARGV_PROMPT_BYTES",
    "MAX_PEERS",
    "SCHEMA",
    "SECTIONS",
    "TOKEN_VARIABLE",
    "AcpSettings",
    "AgentProfile",
    "AuthSettings",
    "Config",
    "ConfigError",
    "FleetSettings",
    "Limits",
    "McpSettings",
    "NotifySettings",
    "PolicySettings",
    "ServerSettings",
    "builtin_profiles",
    "command_for",
    "load_config",
    "normalize_origin",
    "parser_features",
    "prompt_on_stdin",
    "read_token_file",
    "template_args",
    "with_made_token",
]

# The variables that are no key of a section: the token itself (a secret, never in the file) and
# the binary of the built-in Claude Code profiles.
TOKEN_VARIABLE: Final = "RAWP_GATEWAY_TOKEN"
CLAUDE_VARIABLE: Final = "RAWP_GATEWAY_CLAUDE"


@dataclass(frozen=True)
class Config:
    """The effective configuration: one object per section, and what no section holds."""

    server: ServerSettings = field(default_factory=ServerSettings)
    fleet: FleetSettings = field(default_factory=FleetSettings)
    acp: AcpSettings = field(default_factory=AcpSettings)
    agents: Mapping[str, AgentProfile] = field(default_factory=builtin_profiles)
    # Identities, the audit log (gateway/config/auth.py) and webhooks (gateway/config/notify.py).
    auth: AuthSettings = field(default_factory=AuthSettings)
    notify: NotifySettings = field(default_factory=NotifySettings)
    # Permission rules (docs/policies.md), first match wins.
    policy: PolicySettings = field(default_factory=PolicySettings)
    isolation: Isolation = field(default_factory=Isolation)
    # Spend caps on the cost the agents report (docs/budgets.md); 0: none.
    budgets: Limits = field(default_factory=Limits)
    # The MCP servers every session of a profile gets (docs/mcp.md), ${NAME}s expanded.
    mcp: McpSettings = field(default_factory=McpSettings)
    # Not keys of a section: the bearer token (from token_file or RAWP_GATEWAY_TOKEN) and the
    # file the settings came from, which SIGHUP reads the rules of again.
    token: str | None = None
    # The token is one ``serve`` (or ``demo``) made because none was configured
    # (gateway/local_token.py): the gateway then stays on loopback.
    made_token: bool = False
    config_file: Path | None = None
    # Every file the gateway read a setting or a secret from (config, token, users, webhook
    # secrets) or writes one to (the audit log and its rotations): never shown to an agent.
    gateway_files: tuple[Path, ...] = ()

    @property
    def authenticated(self) -> bool:
        """Some credential is configured (else the gateway refuses every request until it has
        made one, with_made_token)."""
        return self.token is not None or self.auth.configured

    @property
    def loopback_only(self) -> bool:
        """No credential was configured: the gateway listens, and answers, on loopback only."""
        return self.made_token or not self.authenticated

    @property
    def hidden_paths(self) -> tuple[str, ...]:
        """What a sandboxed agent must not see (docs/isolation.md): the gateway's files, its state
        dir and the workspace root (each session's own workspace is shown again on top)."""
        server = self.server
        dirs = [server.workspace_root] + ([server.state_dir] if server.state_dir else [])
        return tuple(str(p) for p in (*self.gateway_files, *dirs))


# Every section of the file, its keys declared on its class (gateway/config/settings.py), by the
# name docs/configuration.md gives it. The first four are read here; the others by their own
# modules (a profile over its built-in, a rule among the rules, [isolation] with its binds' disk).
SECTIONS: Final[dict[str, type]] = {
    "server": ServerSettings,
    "fleet": FleetSettings,
    "acp": AcpSettings,
    "budgets": Limits,
    "auth": AuthSettings,
    "auth.oidc": OidcSettings,
    "[notify.webhooks]": Webhook,
    "isolation": Isolation,
    "agents.NAME": AgentProfile,
    "[policy.rules]": Rule,
    "mcp.servers.NAME": ServerSpec,
}
_READ_HERE: Final = ("server", "fleet", "acp", "budgets")
# Every name the file may use; any other is an error (gateway/config/strict.py). Each section's
# names are its declared keys (the tests/repo/test_docs.py check says so).
SCHEMA: Final[Schema] = {
    **{name: known_names(declared(SECTIONS[name])) for name in _READ_HERE},
    "agents": {ANY_NAME: {**known_names(PROFILE_KEYS), "features": known_names(FEATURE_NAMES)}},
    "auth": {**known_names(AUTH_KEYS), "oidc": known_names(OIDC_KEYS)},
    "notify": {"webhooks": [known_names(WEBHOOK_KEYS)]},
    "isolation": known_names(ISOLATION_KEYS),
    "policy": POLICY_SCHEMA,
    "mcp": {"servers": {ANY_NAME: known_names(MCP_KEYS)}},
}


def load_config(
    path: str | os.PathLike[str] | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """The effective configuration: defaults < TOML file < flags < ``RAWP_GATEWAY_*``.
    ``flags``: ``[server]`` keys (``serve``'s flags are those with ``Setting.flag``)."""
    environ = os.environ if environ is None else environ
    server: dict[str, Any] = {}  # the [server] values, layered
    sections: dict[str, Any] = {}
    agents = builtin_profiles(environ.get(CLAUDE_VARIABLE, "claude"))
    if path is not None:
        data, locate = _read(path)
        where = locate.where
        sections["config_file"] = Path(path)
        for name in ("agents", *_READ_HERE):
            if not isinstance(data.get(name, {}), dict):
                raise ConfigError(f"{where}: [{name}] must be a table")
        server = file_values(ServerSettings, data.get("server", {}), f"{where} [server]")
        for name in _READ_HERE[1:]:
            if name in data:
                cls, there = SECTIONS[name], f"{where} [{name}]"
                sections[name] = build(cls, file_values(cls, data[name], there), there)
        for name, table in data.get("agents", {}).items():
            if not isinstance(table, dict):
                raise ConfigError(f"{where}: [agents.{name}] must be a table")
            agents[name] = parse_profile(name, table, agents.get(name), where, locate)
        if "isolation" in data:
            sections["isolation"] = parse_isolation(data["isolation"], locate)
        if "policy" in data:
            sections["policy"] = parse_policy(data["policy"], where)
        if "auth" in data:
            sections["auth"] = parse_auth(data["auth"], where)
        if "notify" in data:
            sections["notify"] = parse_notify(data["notify"], where)
        if "mcp" in data:
            sections["mcp"] = parse_mcp(data["mcp"], where, environ, agents)
    server.update((key, value) for key, value in (flags or {}).items() if value is not None)
    over, under = environment_values(ServerSettings, environ)
    server.update(over)
    for key, value in under.items():  # a default only (the Downward API's pod name)
        server.setdefault(key, value)
    token = environ.get(TOKEN_VARIABLE)
    return _build(server, sections, agents, token)


def _read(path: str | os.PathLike[str]) -> tuple[dict[str, Any], Locator]:
    """The file's tables, every name in them known (else one error naming each unknown one)."""
    where = str(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise ConfigError(f"{where}: larger than {MAX_FILE_BYTES} bytes")
        text = raw.decode()  # TOML is UTF-8
        refuse_too_many_rules(where)(text)
        data = tomllib.loads(text)
    except OSError as err:
        raise ConfigError(f"cannot read config file {where}: {err.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where}: not valid TOML: {err}") from None
    except RecursionError:  # tomllib reads nested arrays and tables recursively
        raise ConfigError(f"{where}: not valid TOML: nested too deeply") from None
    locate = Locator(where, text)
    unknown = unknown_names(data, SCHEMA)
    if unknown:  # one line still: the start fails with one line on stderr
        raise ConfigError("; ".join(f"{locate(name)}: {message}" for name, message in unknown))
    return data, locate


def _build(
    values: dict[str, Any],
    sections: dict[str, Any],
    agents: dict[str, AgentProfile],
    token: str | None,
) -> Config:
    """The Config of the layered ``[server]`` values and the other sections, checked across keys."""
    server: ServerSettings = build(ServerSettings, values)
    try:
        prefix = route_prefix(server.route_prefix, server.pod_name)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    server = replace(server, route_prefix=prefix)
    acp: AcpSettings = sections.get("acp", AcpSettings())
    if acp.default_agent is not None and acp.default_agent not in agents:
        known = ", ".join(sorted(agents))
        raise ConfigError(
            f"[acp] default_agent {acp.default_agent!r} is not an agent profile; known: {known}"
        )
    if token is not None and not token.strip():
        # An empty variable must not turn authentication off (nor hide a token file).
        raise ConfigError(f"{TOKEN_VARIABLE} is set but empty: unset it or give a token")
    if token is None and server.token_file:
        token = read_token_file(server.token_file)
    auth: AuthSettings = sections.get("auth", AuthSettings())
    if (token or auth.configured) and "workspace_root" not in values:
        # A token means others reach the gateway: which directory their agents work in must be a
        # decision, not wherever the gateway happened to be started.
        key = declared(ServerSettings)["workspace_root"]
        raise ConfigError(
            f"with a token, workspace_root must be set ({key.flag}, [server] workspace_root "
            f"or {key.setting.env}); it would otherwise be the current directory, {Path.cwd()}"
        )
    root = server.workspace_root.expanduser().resolve()
    if not root.is_dir():
        raise ConfigError(f"workspace_root {str(root)!r} is not a directory")
    config_file = sections.pop("config_file", None)
    notify: NotifySettings = sections.get("notify", NotifySettings())
    secrets = [hook.secret_file for hook in notify.webhooks if hook.secret_file]
    files = _gateway_files(config_file, server.token_file, auth, secrets)
    config = Config(
        server=replace(server, workspace_root=root),
        agents=agents,
        token=token,
        config_file=config_file,
        gateway_files=files,
        **sections,
    )
    check_binds_apart(config.isolation, [Path(p) for p in config.hidden_paths])
    return config


def _gateway_files(
    config_file: Path | None, token_file: str | None, auth: AuthSettings, secrets: list[str]
) -> tuple[Path, ...]:
    """``Config.gateway_files``: where the gateway read its settings and secrets from, and its
    audit log with every rotation it may make."""
    files: list[Any] = [config_file, token_file, auth.users_file, *secrets]
    if auth.audit_log is not None:
        log = auth.audit_log
        files += [log, *(log.with_name(f"{log.name}.{n}") for n in range(1, auth.audit_keep + 1))]
    return tuple(Path(f).expanduser().absolute() for f in files if f)


def with_made_token(config: Config, token_dir: Path | None = None) -> Config:
    """``config`` with a token of its own when it has no credential (docs/identities.md, "The
    local token"); ``token_dir``: where it is kept, which no sandboxed agent may see."""
    if config.authenticated:
        return config
    hidden = (token_dir,) if token_dir is not None else ()
    return replace(
        config,
        token=new_token(),
        made_token=True,
        gateway_files=(*config.gateway_files, *hidden),
    )


def read_token_file(path: str | os.PathLike[str]) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as err:
        raise ConfigError(f"cannot read token file {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"token file {path} is not UTF-8 text") from None
    if not token:
        raise ConfigError(f"token file {path} is empty")
    return token
