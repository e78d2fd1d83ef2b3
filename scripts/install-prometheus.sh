#!/usr/bin/env bash
# Installs Debian's `prometheus` package, which brings both `prometheus` and `promtool`, for the
# tests that run a real Prometheus against the gateway (tests/test_prometheus_scrape.py) and check
# the dashboard's queries and the scrape config (tests/test_dashboard.py, tests/test_deploy.py).
#
# - A no-op when both binaries are already on PATH, so re-running the test command costs nothing.
# - Never starts the packaged system service: the tests run their own instance on loopback with a
#   temporary config and data dir. A policy-rc.d that answers 101 ("action forbidden") is put in
#   place for the install when none exists (container images usually ship one already), and
#   removed again afterwards. On a machine booted with systemd we also stop and disable the unit in
#   case the package's maintainer scripts started it anyway.
# - Recommends are skipped: they pull prometheus-node-exporter, which the tests do not need.
set -euo pipefail

if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-prometheus: must run as root (apt-get install prometheus)" >&2
  exit 1
fi

policy=/usr/sbin/policy-rc.d
made_policy=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  made_policy=1
fi
cleanup() { if [ -n "$made_policy" ]; then rm -f "$policy"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
echo "install-prometheus: apt-get install prometheus" >&2
apt-get update -q >&2
apt-get install -y -q --no-install-recommends prometheus >&2

if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi

command -v prometheus >/dev/null && command -v promtool >/dev/null || {
  echo "install-prometheus: prometheus/promtool still not on PATH after install" >&2
  exit 1
}
prometheus --version 2>&1 | head -n 1 >&2
