"""The Grafana dashboard: every query parses as PromQL, and uses only metrics the gateway exports.

`promtool` has no "parse this expression" command, but `promtool check rules` parses the `expr` of
every rule in a file with Prometheus's own parser. So each panel query (after replacing Grafana's
variables with values of the right shape) becomes one recording rule in a temporary file. The
metric names of the queries are compared with the names `GatewayMetrics`' registry exports, sample
suffixes included (`_total`, `_bucket`, `_sum`, `_count`).

promtool comes from Debian's `prometheus` package (scripts/install-prometheus.sh). Without it the
PromQL check is skipped on a developer machine, and fails in CI (CI=true), so that a broken CI set-up
can never pass as green.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from gateway.metrics import GatewayMetrics
from tests.support.dashboard import all_panels, load_dashboard, substitute
from tests.support.paths import REPO
from tests.support.prometheus import installed

PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}


def panel_exprs(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL expression) of every query target."""
    return [
        (panel["title"], target["expr"])
        for panel in all_panels(dashboard)
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


def variable_selectors(dashboard: dict) -> list[str]:
    """The series selectors inside the template variables' label_values(selector, label) queries."""
    out = []
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((.+),\s*\w+\)", query.strip())
        assert m, f"variable {var['name']}: unexpected query {query!r}"
        out.append(m.group(1))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions, keywords,
    label names (inside {} or by/without/on/ignoring/group_* lists) or parts of a string/range."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    s = re.sub(r"\{[^}]*\}", "", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", "", s)  # range and subquery durations
    # Grouping clauses go entirely, so `sum by (le) (x)` reads as the call `sum (x)`.
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = m.group(0)
        after = s[m.end() :].lstrip()
        if after.startswith("(") or word.lower() in PROMQL_KEYWORDS:
            continue
        if re.fullmatch(r"\d+[smhdwy]|e\d*", word):  # stray duration or exponent piece
            continue
        names.add(word)
    return names


def exported_names() -> set[str]:
    """Every sample name a GatewayMetrics exposes, including series that have no sample yet."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("_sum", "_count", "_created"),
        "gauge": ("",),
        "info": ("_info",),
    }
    names = set()
    for family in GatewayMetrics().registry.collect():
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def test_metric_name_parser_finds_names_not_labels_or_functions():
    expr = (
        'histogram_quantile(0.99, sum by (le, agent) (rate(a_bucket{le!="x", job=~"$job"}[1m])))'
        " / on (agent) group_left b_total + 2e-3 * c"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}


def test_dashboard_has_a_prometheus_datasource_variable_used_by_every_query():
    dashboard = load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in all_panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_dashboard_shows_what_the_issue_asks_for():
    dashboard = load_dashboard()
    panels = [p for p in all_panels(dashboard) if p["type"] != "row"]
    exprs = " ".join(e for _, e in panel_exprs(dashboard))
    assert any(p["type"] == "heatmap" for p in panels)
    for quantile in ("0.5", "0.95", "0.99"):
        assert (
            f"histogram_quantile({quantile}, sum by (le) (rate(rawp_gateway_frame_latency" in exprs
        )
    for needle in (
        "sum by (type) (rate(rawp_gateway_frames_total",  # throughput by type
        "rawp_gateway_sessions{",
        "rawp_gateway_ws_connections{",
        "sum by (stop_reason) (rate(rawp_gateway_turns_total",
        "rawp_gateway_agent_process_exits_total",
        "rawp_gateway_agent_parse_errors_total",
        "rawp_gateway_history_buffer_bytes",
        "rawp_gateway_history_evicted_frames_total",
        "sum by (type, outcome) (rate(rawp_gateway_interactions_total",
        "rawp_gateway_tool_invocations_total",
        # Usage and cost: tokens/s and cost per hour by agent and model, cache hit share,
        # compactions, context fill, by user.
        "sum by (agent, model) (rate(rawp_gateway_tokens_total",
        "sum by (agent, model) (rate(rawp_gateway_cost_usd_total",
        'rate(rawp_gateway_tokens_total{kind="cache_read"',
        "rawp_gateway_compactions_total",
        "rawp_gateway_context_limit_turns_total",
        "sum by (band) (rawp_gateway_sessions_context_fill",
        "sum by (user) (rate(rawp_gateway_user_tokens_total",
        # Webhook notifications: sent, retried, dropped.
        "sum by (event, result) (rate(rawp_gateway_notifications_total",
    ):
        assert needle in exprs, needle
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert "Usage and cost" in rows
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_dashboard_has_a_fleet_view_per_pod_and_in_total():
    """Sessions, frames/s, latency and agent exits, each per gateway pod (the ``pod`` label the
    scrape jobs give every target) and summed over the fleet."""
    dashboard = load_dashboard()
    (row,) = [p for p in dashboard["panels"] if p["type"] == "row" and "Fleet" in p["title"]]
    fleet = [
        p for p in all_panels(dashboard) if p["gridPos"]["y"] > row["gridPos"]["y"]
        and p["gridPos"]["y"] <= row["gridPos"]["y"] + 17 and p["type"] != "row"
    ]  # fmt: skip
    metrics = {
        "rawp_gateway_sessions{": "sum by (pod) (rawp_gateway_sessions{",
        "rawp_gateway_frames_total{": "sum by (pod) (rate(rawp_gateway_frames_total{",
        "rawp_gateway_frame_latency_seconds_bucket{": "sum by (le, pod) (rate(",
        "rawp_gateway_agent_process_exits_total{": "sum by (pod) (rate(",
    }
    for metric, per_pod in metrics.items():
        (panel,) = [p for p in fleet if any(metric in t["expr"] for t in p["targets"])]
        exprs = [t["expr"] for t in panel["targets"]]
        assert any(per_pod in e for e in exprs), panel["title"]
        totals = [t for t in panel["targets"] if t["legendFormat"] == "total"]
        assert len(totals) == 1 and "pod" not in totals[0]["expr"], panel["title"]
    # Every scrape job the deployment ships puts that label on its targets.
    k8s = (REPO / "deploy" / "k8s" / "prometheus-scrape.yml").read_text()
    assert "source_labels: [__meta_kubernetes_pod_name]\n        target_label: pod" in k8s
    compose = (REPO / "deploy" / "prometheus" / "prometheus.yml").read_text()
    assert "pod: gateway" in compose


def test_every_dashboard_metric_is_exported_by_the_gateway():
    dashboard = load_dashboard()
    exported = exported_names()
    used = set()
    for _title, expr in panel_exprs(dashboard):
        used |= metric_names(substitute(expr))
    for selector in variable_selectors(dashboard):
        used |= metric_names(substitute(selector))
    assert used, "no metric names found in the dashboard"
    missing = sorted(used - exported)
    assert not missing, f"dashboard uses metrics the gateway does not export: {missing}"


@pytest.mark.prometheus
def test_every_dashboard_query_parses_with_promtool(tmp_path):
    tool = installed("promtool")
    dashboard = load_dashboard()
    exprs = [substitute(e) for _, e in panel_exprs(dashboard)]
    exprs += [substitute(s) for s in variable_selectors(dashboard)]
    assert len(exprs) > 20
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    # JSON is YAML, so promtool reads this as a rules file.
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps(rules, indent=1))
    proc = subprocess.run(
        [tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(exprs)} rules found" in proc.stdout + proc.stderr


@pytest.mark.prometheus
def test_promtool_check_rejects_a_broken_query(tmp_path):
    """The check above would prove nothing if promtool accepted anything."""
    tool = installed("promtool")
    path = tmp_path / "broken.yml"
    rule = {"record": "x:y", "expr": "sum by (le (rate(x[1m]))"}
    path.write_text(json.dumps({"groups": [{"name": "g", "rules": [rule]}]}))
    proc = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, timeout=60)
    assert proc.returncode != 0
