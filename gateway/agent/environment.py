"""The environment an agent runs with, made in one place for every agent the gateway starts (a
session's, long-lived or one per prompt; an ACP agent asked for its saved conversations; the demo).

The agent stands outside the gateway's trust boundary, like a master: it runs what a model wrote and
reads what a repository or a web page tells it. So it never gets the gateway's own settings: with
``RAWP_GATEWAY_TOKEN`` an agent could call the API as an admin and approve its own permission
requests. Every variable the gateway reads a setting or a secret from is a ``RAWP_GATEWAY_*`` one
(gateway/config/: the token, the token file, the port, the state dir, the Claude command...), so
that whole prefix is left out. The rest of the gateway's environment passes (``PATH``, ``HOME``,
``ANTHROPIC_API_KEY``: the agent needs them), then the profile's ``env`` over it (a profile that
names a ``RAWP_GATEWAY_*`` variable is refused when the configuration is read), then the ``RAWP_*``
variables of DPS §17.2.1, which nothing overrides.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

__all__ = [
    "GATEWAY_PREFIX",
    "RAWP_DPS_VERSION",
    "agent_environment",
    "is_gateway_setting",
]

GATEWAY_PREFIX: Final = "RAWP_GATEWAY_"
RAWP_DPS_VERSION: Final = "rawp-dps-1.0"


def is_gateway_setting(name: str) -> bool:
    """A variable the gateway may read a setting or a secret from: never the agent's."""
    return name.startswith(GATEWAY_PREFIX)


def agent_environment(
    profile_env: Mapping[str, str],
    *,
    session_id: str | None = None,
    workspace: str | None = None,
    gateway_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The agent's whole environment: ``gateway_env`` (None: the gateway's own) without the
    gateway's settings, ``profile_env`` over it, then ``RAWP_SESSION_ID``, ``RAWP_WORKSPACE_PATH``
    (``workspace``, absolute) and ``RAWP_DPS_VERSION`` when a session is given. Without one, it is
    what an agent of the profile would see, for looking up its executable or its saved
    conversations before it runs."""
    base = os.environ if gateway_env is None else gateway_env
    env = {k: v for k, v in base.items() if not is_gateway_setting(k)}
    # Refused at config load; dropped here too, for a profile made in code.
    env.update((k, v) for k, v in profile_env.items() if not is_gateway_setting(k))
    if session_id is not None:
        env["RAWP_SESSION_ID"] = session_id
        env["RAWP_WORKSPACE_PATH"] = os.path.abspath(workspace or ".")
        env["RAWP_DPS_VERSION"] = RAWP_DPS_VERSION
    return env
