#!/usr/bin/env bash
# Installs the gateway into .venv (editable, pinned by constraints.txt) with the extras named in $1
# ("test", or nothing). scripts/demo and scripts/test call it. Only the first set-up, or one after
# pyproject.toml or constraints.txt changed, needs the package index: a stamp in .venv records the
# hash of both files per extra, and a .venv that matches it is used as it is, offline.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
stamp=.venv/rawp-installed
hash="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
# "test" installs everything the plain install does, so its stamp stands for both.
if [ -x .venv/bin/python ] && [ -f "$stamp" ] &&
  grep -qxE "$hash (${extra:-none}|test)" "$stamp"; then
  exit 0
fi
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -qq -c constraints.txt -e ".${extra:+[$extra]}"
# The stamp keeps only lines of the current hash: an older install says nothing about this one.
{ grep -sE "^$hash " "$stamp" || true; echo "$hash ${extra:-none}"; } | sort -u >"$stamp.new"
mv "$stamp.new" "$stamp"
