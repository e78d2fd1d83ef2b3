"""Agent parsers: one per agent CLI, each turning stdout lines into normalised agent events.

``parsers.base.get(name)`` finds one by name; ``parsers.events`` is the vocabulary they share.
"""
