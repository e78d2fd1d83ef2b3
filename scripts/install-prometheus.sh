#!/usr/bin/env bash
# Installs Debian's `prometheus` package, which brings both `prometheus` and `promtool`, for the
# tests that run a real Prometheus against the gateway (tests/metrics/test_prometheus_scrape.py) and check
# the dashboard's queries and the scrape config (tests/metrics/test_dashboard.py, tests/repo/test_deploy.py).
#
# - A no-op when both binaries are already on PATH, so re-running the test command costs nothing.
# - Never starts the packaged system service (scripts/lib/apt.sh, apt_install_no_service): the
#   tests run their own instance on loopback with a temporary config and data dir.
# - Recommends are skipped: they pull prometheus-node-exporter, which the tests do not need.
set -euo pipefail

if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  exit 0
fi

. "$(dirname "$0")/lib/apt.sh"
apt_install_no_service prometheus.service prometheus

command -v prometheus >/dev/null && command -v promtool >/dev/null || {
  echo "install-prometheus: prometheus/promtool still not on PATH after install" >&2
  exit 1
}
prometheus --version 2>&1 | head -n 1 >&2
