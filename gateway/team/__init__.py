"""What a shared deployment turns on: who is asking (identities), what they may do (roles), the
audit trail, webhook notifications and the fleet behind a router."""
