#!/usr/bin/env bash
# Installs Debian's `nginx` package for the fleet tests (tests/test_fleet.py), which run the router
# of deploy/k8s (its configuration generated from deploy/k8s/router/nginx.conf.template) in front of
# three gateways on loopback.
#
# - A no-op when nginx is already on PATH (or in /usr/sbin), so re-running the test command costs
#   nothing.
# - Never starts the packaged system service: the tests run their own nginx with a temporary
#   configuration and prefix. A policy-rc.d that answers 101 ("action forbidden") is put in place
#   for the install when none exists, and removed again afterwards; on a machine booted with systemd
#   the unit is also stopped and disabled in case the package's maintainer scripts started it.
set -euo pipefail

if command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-nginx: must run as root (apt-get install nginx)" >&2
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
echo "install-nginx: apt-get install nginx" >&2
apt-get update -q >&2
apt-get install -y -q --no-install-recommends nginx >&2

if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl disable --now nginx.service >/dev/null 2>&1 || true
fi

[ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || {
  echo "install-nginx: nginx still not found after install" >&2
  exit 1
}
/usr/sbin/nginx -v 2>&1 | head -n 1 >&2
