"""rawp-gateway: the asyncio shell (server, processes, connections, history, metrics) around the
sans-IO protocol core in ``gateway.protocol`` and the agent parsers in ``parsers``."""

__version__ = "0.1.0"
