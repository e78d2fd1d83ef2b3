"""The Grafana dashboard (grafana/dashboards/rawp-gateway.json) as the tests read it: its panels and
their queries with Grafana's variables replaced, ready for Prometheus."""

from __future__ import annotations

import json

from tests.support.paths import REPO

DASHBOARD = REPO / "grafana" / "dashboards" / "rawp-gateway.json"

# Grafana's variables, replaced by values of the same syntactic kind (a duration, a regex).
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "${datasource}": "prometheus",
    "$job": ".*",
    "$instance": ".*",
}


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # panels inside collapsed rows
    return out


def substitute(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown Grafana variable left in {expr!r}"
    return expr
