#!/usr/bin/env bash
# Installs Debian's `chromium` package for the browser console's tests (tests/console/test_browser_console.py,
# marker `browser`), which drive it headless over the DevTools protocol. Browser builds downloaded
# at install time are not used: the system Chromium is the one the tests launch.
#
# - A no-op when /usr/bin/chromium is already there, so re-running the test command costs nothing.
# - Recommends are skipped; fonts-dejavu-core is asked for explicitly so that screenshots have text.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
  exit 0
fi

. "$(dirname "$0")/lib/apt.sh"
apt_install chromium fonts-dejavu-core

[ -x /usr/bin/chromium ] || {
  echo "install-chromium: /usr/bin/chromium still missing after install" >&2
  exit 1
}
/usr/bin/chromium --version >&2
