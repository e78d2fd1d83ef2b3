# Sourced by scripts/install-*.sh: installs the Debian packages a group of tests needs. The caller
# checks before that its tool is missing (re-running the test command then costs nothing) and
# after that it is there. Needs root; recommends are skipped; apt's output goes to stderr.

apt_who=$(basename "$0" .sh)

apt_need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "$apt_who: must run as root (apt-get install $*)" >&2
    exit 1
  fi
}

# apt_install PACKAGE...
apt_install() {
  apt_need_root "$@"
  export DEBIAN_FRONTEND=noninteractive
  echo "$apt_who: apt-get install $*" >&2
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends "$@" >&2
}

# apt_install_command COMMAND PACKAGE...: installs the packages unless COMMAND is already on PATH
# (re-running the test command then costs nothing), and fails unless COMMAND is there after.
apt_install_command() {
  local command=$1
  shift
  if command -v "$command" >/dev/null; then
    return 0
  fi
  apt_install "$@"
  command -v "$command" >/dev/null || {
    echo "$apt_who: $command still not found after install" >&2
    exit 1
  }
}

# apt_install_no_service UNIT PACKAGE...: for a package that ships a system service the tests never
# use (they run their own instance, with a temporary configuration). A policy-rc.d that answers 101
# ("action forbidden") is put in place for the install when none exists (container images usually
# ship one already), and removed again at exit; on a machine booted with systemd the unit is also
# stopped and disabled in case the package's maintainer scripts started it anyway.
apt_install_no_service() {
  local unit=$1
  shift
  apt_need_root "$@"
  apt_policy=/usr/sbin/policy-rc.d
  apt_made_policy=""
  if [ ! -e "$apt_policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$apt_policy"
    chmod 755 "$apt_policy"
    apt_made_policy=1
  fi
  trap 'if [ -n "$apt_made_policy" ]; then rm -f "$apt_policy"; fi' EXIT
  apt_install "$@"
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    systemctl disable --now "$unit" >/dev/null 2>&1 || true
  fi
}
