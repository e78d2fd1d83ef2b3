"""The sans-IO protocol core of rawp-gateway.

Nothing in this package reads a pipe, opens a socket, sleeps or reads the clock except through an
injected source: it takes data and returns data, so every RAWP-DPS rule is testable with lists in and
lists out. The asyncio shell in ``gateway/`` drives it.

- ``frames``: the DPS frame types (msgspec Structs), one per event type of Appendix B.
- ``codec``: one encoder, one decoder, and the §2 receiving rules.
- ``factory``: the §2.1 envelope around a payload (cheap UUID v4s and timestamps).
- ``tools``: the built-in tool catalog and the §5.3.3 output_type rule.
- ``capabilities``: the gateway's ``session.capabilities`` and the per-connection filter.
"""
