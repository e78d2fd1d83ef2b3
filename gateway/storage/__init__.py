"""Everything the gateway writes to disk: the state dir (sessions that survive a restart), each
session's files, and the link-refusing file operations both use in directories an agent can write.
The audit log is the one other writer (``gateway.team.audit``)."""
