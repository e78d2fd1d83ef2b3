"""``python -m gateway.demo_agent``, the demo profile's command, keeps working: the demo agent
lives in ``gateway.agent.demo``."""

if __name__ == "__main__":
    import sys

    from gateway.agent.demo.__main__ import main

    sys.exit(main())
