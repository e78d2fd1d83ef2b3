#!/bin/sh
# Installs Debian's websocketd, the anchor of bench/bench_vs_websocketd.py (as root, with apt-get).
set -eu
if command -v websocketd >/dev/null 2>&1; then
    exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq websocketd
