#!/usr/bin/env bash
# Installs Debian's `chromium` package for the browser console's tests (tests/test_browser_console.py,
# marker `browser`), which drive it headless over the DevTools protocol. Browser builds downloaded
# at install time are not used: the system Chromium is the one the tests launch.
#
# - A no-op when /usr/bin/chromium is already there, so re-running the test command costs nothing.
# - Recommends are skipped; fonts-dejavu-core is asked for explicitly so that screenshots have text.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-chromium: must run as root (apt-get install chromium)" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "install-chromium: apt-get install chromium" >&2
apt-get update -q >&2
apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >&2

[ -x /usr/bin/chromium ] || {
  echo "install-chromium: /usr/bin/chromium still missing after install" >&2
  exit 1
}
/usr/bin/chromium --version >&2
