"""What the tests share: one of each helper, imported from here (or from ``tests.support.gateway_peer``,
the in-process gateway and its masters, ``prompt_and_wait`` and ``demo_config``; the ``gw``
fixture is in ``tests/conftest.py``) and never from another test module.

``procs``: a session's processes, a pid's state, its descendants, through /proc.
``waiting``: ``eventually``, the one way to wait for a condition that cannot be awaited.
``loops``: one scenario on both event loops (stdlib and uvloop); the hostile agent script.
``servers``: ``rawp-gateway serve`` as a real process: its command, a free port, ``serving``.
``realcli``: the real-CLI gateway (a scripted model server, a gateway running the pinned CLI).
``chat``: the terminal client at a pipe (``piped_chat``, ``Pipe``, ``shown``).
``logs``: what the gateway logged (a session's end and its reason).
"""
