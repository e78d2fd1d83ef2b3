# Sourced by scripts/build-image (and what else runs the image): which container engine to use, and
# for podman the settings this machine needs, measured here and written to files under .engine/
# (git-ignored) that every podman call then reads through CONTAINERS_CONF and
# CONTAINERS_STORAGE_CONF. The files say why each value is what it is. scripts/install-podman.sh
# writes the same containers.conf settings as a system-wide drop-in, for podman typed by hand.

# engine_pick: sets ENGINE to docker (when `docker info` succeeds: a CLI without a daemon does not
# count) or podman, and for podman exports CONTAINERS_CONF and CONTAINERS_STORAGE_CONF.
engine_pick() {
  if [ -n "${RAWP_ENGINE:-}" ]; then
    ENGINE="$RAWP_ENGINE"
  elif command -v docker >/dev/null && timeout 20 docker info >/dev/null 2>&1; then
    ENGINE=docker
  elif command -v podman >/dev/null; then
    ENGINE=podman
  else
    echo "${0##*/}: no container engine: docker info fails and podman is not installed" \
      "(scripts/install-podman.sh)" >&2
    exit 1
  fi
  if [ "$ENGINE" = podman ]; then
    engine_podman_settings
  fi
}

# engine_podman_measure: what this machine needs of podman, measured: sets ENGINE_RUNTIME,
# ENGINE_CGROUP_MANAGER, ENGINE_NOFILE, ENGINE_NPROC and ENGINE_DRIVER.
engine_podman_measure() {
  local pid_max
  # crun 1.8 (bookworm) refuses a host with hybrid cgroups (v1 controllers, the v2 tree at
  # /sys/fs/cgroup/unified); runc handles them. On a pure cgroup v2 host either works.
  if [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ]; then
    ENGINE_RUNTIME="${RAWP_PODMAN_RUNTIME:-crun}"
    command -v crun >/dev/null || ENGINE_RUNTIME=runc
  else
    ENGINE_RUNTIME=runc
  fi
  # No systemd as PID 1 (a container or a plain VM): podman must manage cgroups itself and log
  # its events to a file.
  if [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ]; then
    ENGINE_CGROUP_MANAGER=systemd
  else
    ENGINE_CGROUP_MANAGER=cgroupfs
  fi
  # Podman gives a container's processes nofile 1048576 and nproc 4194304 unless told; a process
  # cannot raise its hard limit, so where the machine's own are lower, runc fails to start the
  # container ("error setting rlimit type 7"). Use the machine's hard limits.
  ENGINE_NOFILE="$(ulimit -Hn)"
  ENGINE_NPROC="$(ulimit -Hu)"
  [ "$ENGINE_NOFILE" = unlimited ] && ENGINE_NOFILE=1048576
  [ "$ENGINE_NPROC" = unlimited ] && ENGINE_NPROC=4194304
  # No more processes can exist than there are pids; runc was seen failing to set nproc above
  # kernel.pid_max (EPERM) on a machine whose hard limit was higher, so that is the cap.
  pid_max="$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo "$ENGINE_NPROC")"
  [ "$ENGINE_NPROC" -gt "$pid_max" ] && ENGINE_NPROC="$pid_max"
  if grep -qw overlay /proc/filesystems; then ENGINE_DRIVER=overlay; else ENGINE_DRIVER=vfs; fi
}

# engine_containers_conf: the containers.conf settings this machine needs (after
# engine_podman_measure), on stdout: .engine/containers.conf and the system-wide drop-in
# (engine_podman_system_settings) say the same.
engine_containers_conf() {
  cat <<EOF
[containers]
# The machine's hard limits (ulimit -Hn, -Hu, at most kernel.pid_max processes): podman's
# defaults are higher, and runc cannot set a limit above the hard one it inherits.
default_ulimits = ["nofile=$ENGINE_NOFILE:$ENGINE_NOFILE", "nproc=$ENGINE_NPROC:$ENGINE_NPROC"]

[engine]
# $(if [ "$ENGINE_RUNTIME" = runc ]; then echo "/sys/fs/cgroup is not cgroup2fs (hybrid or v1 cgroups): crun 1.8 refuses them."; else echo "cgroup v2."; fi)
runtime = "$ENGINE_RUNTIME"
# PID 1 is $(cat /proc/1/comm 2>/dev/null || echo unknown).
cgroup_manager = "$ENGINE_CGROUP_MANAGER"
events_logger = "file"
$(if [ -x /usr/lib/podman/netavark ]; then printf '%s\n' "" "[network]" "# Debian's podman ships a CNI bridge config but not the CNI plugins; netavark is installed." 'network_backend = "netavark"'; fi)
EOF
}

# engine_podman_settings: writes .engine/containers.conf and .engine/storage.conf from what this
# machine is (rewritten on every call: they are cheap, and follow the machine) and exports them.
engine_podman_settings() {
  local dir conf storage
  dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.engine"
  mkdir -p "$dir"
  engine_podman_measure
  # Files of this call's own, renamed into place: concurrent callers (scripts/build-image and
  # scripts/build-toolchain from two pytest-xdist workers) write the same values, and each
  # rename is whole.
  conf="$(mktemp "$dir/containers.conf.XXXXXX")"
  storage="$(mktemp "$dir/storage.conf.XXXXXX")"
  {
    echo "# Written by scripts/lib/engine.sh for this machine; do not edit (it is rewritten)."
    engine_containers_conf
  } >"$conf"
  cat >"$storage" <<EOF
# Written by scripts/lib/engine.sh for this machine; do not edit (it is rewritten).
[storage]
# $(if [ "$ENGINE_DRIVER" = overlay ]; then echo "The kernel has overlayfs."; else echo "No overlayfs in /proc/filesystems: vfs (slow, a full copy per layer)."; fi)
driver = "$ENGINE_DRIVER"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"
EOF
  chmod 644 "$conf" "$storage"
  mv "$conf" "$dir/containers.conf"
  mv "$storage" "$dir/storage.conf"
  # podman build (buildah) does not read default_ulimits: build-image passes these as --ulimit.
  ENGINE_BUILD_ULIMITS=(--ulimit "nofile=$ENGINE_NOFILE:$ENGINE_NOFILE"
    --ulimit "nproc=$ENGINE_NPROC:$ENGINE_NPROC")
  export CONTAINERS_CONF="$dir/containers.conf"
  export CONTAINERS_STORAGE_CONF="$dir/storage.conf"
}

# The drop-in podman reads by default (CONTAINERS_CONF, when set, replaces every other file): the
# same settings, so that `podman run` and `podman-compose` typed in a shell work as
# deploy/README.md shows them. Podman's default storage (overlay where the kernel has it, else
# vfs; the same root directories) needs no file.
ENGINE_SYSTEM_CONF=/etc/containers/containers.conf.d/rawp-gateway.conf

# engine_podman_system_settings: writes ENGINE_SYSTEM_CONF unless it already says the same.
# Without root, a stale or missing one is a warning with what to run, not a failure: the
# project's own scripts do not read it.
engine_podman_system_settings() {
  local want
  engine_podman_measure
  want="$(
    echo "# Written by rawp-gateway's scripts/install-podman.sh (scripts/lib/engine.sh): what podman"
    echo "# needs on this machine to run a container. Rewritten when the machine changes."
    engine_containers_conf
  )"
  if [ -f "$ENGINE_SYSTEM_CONF" ] && [ "$(cat "$ENGINE_SYSTEM_CONF")" = "$want" ]; then
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "${0##*/}: podman's system-wide settings ($ENGINE_SYSTEM_CONF) are missing or" \
      "stale: run scripts/install-podman.sh as root" >&2
    return 0
  fi
  mkdir -p "$(dirname "$ENGINE_SYSTEM_CONF")"
  printf '%s\n' "$want" >"$ENGINE_SYSTEM_CONF.new"
  mv "$ENGINE_SYSTEM_CONF.new" "$ENGINE_SYSTEM_CONF"
  echo "${0##*/}: wrote $ENGINE_SYSTEM_CONF" >&2
}

# engine_apt_mirror: the Debian mirror this machine's apt takes bookworm's main from.
engine_apt_mirror() {
  apt-cache policy 2>/dev/null |
    awk '$3 == "bookworm/main" && $2 ~ /^https?:/ { print $2; exit }' |
    grep . || echo http://deb.debian.org/debian
}

# engine_make_base NAME: NAME (debian:bookworm-slim) made from Debian's packages with debootstrap,
# cleaned like the official slim image (no apt lists or caches, docs, man pages or locales, and
# dpkg told to leave them out of later installs), then imported into podman.
engine_make_base() {
  local name="$1" mirror root security
  mirror="$(engine_apt_mirror)"
  echo "${0##*/}: no registry copy of $name can be pulled; making it with debootstrap from $mirror" >&2
  command -v debootstrap >/dev/null || {
    echo "${0##*/}: debootstrap is not installed (scripts/install-podman.sh)" >&2
    exit 1
  }
  root="$(mktemp -d "${TMPDIR:-/tmp}/rawp-base.XXXXXX")"
  debootstrap --variant=minbase bookworm "$root" "$mirror" >&2
  # Later installs in the image leave out what the official slim image leaves out.
  cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror" \
    >"$root/etc/apt/sources.list"
  security="$(apt-cache policy 2>/dev/null |
    awk '$3 == "bookworm-security/main" && $2 ~ /^https?:/ { print $2; exit }')"
  if [ -n "$security" ]; then
    printf 'deb %s bookworm-security main\n' "$security" >>"$root/etc/apt/sources.list"
  fi
  find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
    "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/groff/* \
    "$root"/usr/share/lintian/* "$root"/var/log/* "$root"/tmp/*
  tar -C "$root" --numeric-owner -cf - . |
    podman import --change 'CMD ["bash"]' - "$name" >/dev/null
  rm -rf "$root"
}
