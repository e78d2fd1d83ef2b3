#!/usr/bin/env bash
# Installs what the image tests (tests/image/, marker `image`) need to build and run the sidecar
# image where no Docker daemon answers: Debian's podman with runc (crun 1.8 refuses hybrid
# cgroups), buildah (podman build), debootstrap (the Debian base, where no registry is reachable),
# uidmap and slirp4netns (podman's rootless parts), bubblewrap (the sandbox tests),
# podman-compose (deploy/docker-compose.yml) and what its bridge network needs to publish a port
# (netavark, aardvark-dns for the services' names, iptables). Then podman's system-wide settings
# for this machine (scripts/lib/engine.sh measures them): the drop-in
# /etc/containers/containers.conf.d/rawp-gateway.conf, which a plain `podman run` or
# `podman-compose up` reads, so the commands deploy/README.md shows work as typed. Without it
# Debian's podman fails twice here: its CNI bridge config names plugins Debian does not ship
# (`failed to find plugin "bridge"`: netavark instead), and its default ulimits exceed the
# machine's hard limits (runc: `error setting rlimit type 7`). The project's own scripts write
# the same settings to .engine/ and read them from there (scripts/build-image).
#
# - A no-op when `docker info` succeeds (scripts/build-image then uses Docker; compose is
#   Docker's own), or when every tool is already there and the drop-in says what the machine
#   needs, so re-running the test command costs nothing.
set -euo pipefail

if command -v docker >/dev/null && timeout 20 docker info >/dev/null 2>&1; then
  exit 0
fi
tools=(podman runc buildah debootstrap newuidmap slirp4netns bwrap podman-compose
  /usr/lib/podman/netavark /usr/lib/podman/aardvark-dns iptables)
packages=(podman runc buildah debootstrap uidmap slirp4netns bubblewrap podman-compose
  netavark aardvark-dns iptables)
missing=()
for i in "${!tools[@]}"; do
  command -v "${tools[$i]}" >/dev/null || missing+=("${packages[$i]}")
done
if [ "${#missing[@]}" -gt 0 ]; then
  . "$(dirname "$0")/lib/apt.sh"
  apt_install "${missing[@]}"
  for tool in "${tools[@]}"; do
    command -v "$tool" >/dev/null || {
      echo "install-podman: $tool still not found after install" >&2
      exit 1
    }
  done
  podman --version >&2
fi

. "$(dirname "$0")/lib/engine.sh"
engine_podman_system_settings
