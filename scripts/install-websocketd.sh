#!/usr/bin/env bash
# Installs Debian's websocketd, the reference relay of the relay benches (bench/bench_vs_websocketd.py,
# bench/bench_fleet.py) and of their smoke tests (tests/repo/test_bench_rig.py), when it is not on
# PATH. It ships no service.
set -euo pipefail

. "$(dirname "$0")/lib/apt.sh"
apt_install_command websocketd websocketd
