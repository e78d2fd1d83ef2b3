"""The agent sandbox (``[isolation] mode = "sandbox"``, docs/isolation.md): every agent process and
all its descendants run under bubblewrap, seeing the system read-only, its own workspace and HOME,
and nothing of the gateway's.

``plan.py`` holds the decisions, pure (settings, the ``bwrap`` argv, the agent's environment
inside, which limit an agent ran into); ``spawn.py`` is the shell around them (finding and probing
``bwrap``, looking at the disk, each session's HOME), used by ``gateway/agent/process.py`` for
every agent it starts; ``system.py`` looks in a team's system (``system_root``) for it.
"""

from gateway.agent.sandbox.plan import (
    DEFAULT_MAX_MEMORY_MB,
    DEFAULT_MAX_PROCESSES,
    Isolation,
    limit_named,
)
from gateway.agent.sandbox.spawn import SpawnSandbox, missing_command, probe

__all__ = [
    "DEFAULT_MAX_MEMORY_MB",
    "DEFAULT_MAX_PROCESSES",
    "Isolation",
    "SpawnSandbox",
    "limit_named",
    "missing_command",
    "probe",
]
