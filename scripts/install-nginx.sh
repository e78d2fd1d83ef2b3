#!/usr/bin/env bash
# Installs Debian's `nginx` package for the fleet tests (tests/team/test_fleet.py), which run the router
# of deploy/k8s (its configuration generated from deploy/k8s/router/nginx.conf.template) in front of
# three gateways on loopback.
#
# - A no-op when nginx is already on PATH (or in /usr/sbin), so re-running the test command costs
#   nothing.
# - Never starts the packaged system service (scripts/lib/apt.sh, apt_install_no_service): the
#   tests run their own nginx with a temporary configuration and prefix.
set -euo pipefail

if command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; then
  exit 0
fi

. "$(dirname "$0")/lib/apt.sh"
apt_install_no_service nginx.service nginx

[ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || {
  echo "install-nginx: nginx still not found after install" >&2
  exit 1
}
/usr/sbin/nginx -v 2>&1 | head -n 1 >&2
