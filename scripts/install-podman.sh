#!/usr/bin/env bash
# Installs what the image tests (tests/image/, marker `image`) need to build and run the sidecar
# image where no Docker daemon answers: Debian's podman with runc (crun 1.8 refuses hybrid
# cgroups), buildah (podman build), debootstrap (the Debian base, where no registry is reachable),
# uidmap and slirp4netns (podman's rootless parts), bubblewrap (the sandbox tests),
# podman-compose (deploy/docker-compose.yml) and what its bridge network needs to publish a port
# (netavark, aardvark-dns for the services' names, iptables). The machine-specific podman settings are not set here:
# scripts/build-image measures and writes them (scripts/lib/engine.sh).
#
# - A no-op when `docker info` succeeds (scripts/build-image then uses Docker; compose is
#   Docker's own) or when every tool is already there, so re-running the test command costs
#   nothing.
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
[ "${#missing[@]}" -eq 0 ] && exit 0

. "$(dirname "$0")/lib/apt.sh"
apt_install "${missing[@]}"

for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || {
    echo "install-podman: $tool still not found after install" >&2
    exit 1
  }
done
podman --version >&2
