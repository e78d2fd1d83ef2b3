"""The agent side: the agent's process, its profiles, its saved conversations and the demo agent.

Kept empty on purpose: ``python -m gateway.agent.demo`` imports this package first, and the demo
agent's start must stay cheap."""
