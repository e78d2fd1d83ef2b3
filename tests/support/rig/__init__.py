"""The real-agent rig: pinned agent CLIs run against scripted model servers on 127.0.0.1.

Public API (see tests/support/rig/README.md):

* ``env``: ``AGENTS`` (pins), ``require_cli(agent)``, ``agent_env(agent, base_url=, home=)``,
  ``make_home(agent, path)``, ``cli_path(agent)``, ``cli_version(agent)``.
* ``scenario``: ``load_scenario(path)``, ``find_scenario(agent, name)``, ``all_scenarios(agent)``,
  ``parse_scenario(dict, name=, agent=)``.
* ``run``: ``run_scenario(scenario, agent=, variant=, ...) -> RunResult`` and
  ``scripted_cli(scenario, agent=, ...) -> CliSetup`` (server + env + argv, no process), and
  ``make_server(agent, calls)``.
* ``server.ScriptedServer``: the base of ``anthropic.AnthropicServer`` and the other servers.
* ``python -m tests.support.rig.record [--agent A] [SCENARIO ...]`` regenerates ``tests/fixtures/``.
"""
