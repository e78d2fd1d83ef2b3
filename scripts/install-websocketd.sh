#!/usr/bin/env bash
# Installs Debian's websocketd, the reference relay of the relay benches (bench/bench_vs_websocketd.py,
# bench/bench_fleet.py) and of their smoke test (tests/repo/test_bench_rig.py). A no-op when
# websocketd is already on PATH, so re-running the test command costs nothing. It ships no service.
set -euo pipefail

if command -v websocketd >/dev/null; then
  exit 0
fi

. "$(dirname "$0")/lib/apt.sh"
apt_install websocketd

command -v websocketd >/dev/null || {
  echo "install-websocketd: websocketd still not found after install" >&2
  exit 1
}
