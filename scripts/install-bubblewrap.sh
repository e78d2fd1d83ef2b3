#!/usr/bin/env bash
# Installs Debian's `bubblewrap` package (bwrap) for the agent sandbox's tests (tests marked
# `sandbox`: tests/agent/test_sandbox.py and the real CLIs in sandbox mode), which run agents under
# `[isolation] mode = "sandbox"` (docs/isolation.md).
#
# - A no-op when bwrap is already on PATH, so re-running the test command costs nothing.
# - bwrap needs unprivileged user namespaces: scripts/missing-test-parts says so when the kernel or
#   the container refuses them (installing cannot fix that).
set -euo pipefail

if command -v bwrap >/dev/null; then
  exit 0
fi

. "$(dirname "$0")/lib/apt.sh"
apt_install_command bwrap bubblewrap
bwrap --version >&2
