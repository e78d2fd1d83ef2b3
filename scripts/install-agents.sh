#!/usr/bin/env bash
# Installs the pinned agent CLIs that the real-agent rig and the end-to-end tests drive, into the
# git-ignored folder .agents/ of the repo (one npm prefix per CLI, so their dependency trees never
# mix). A CLI whose pinned version is already there is reused, so a second run is a fast no-op.
# The pins here must match tests/support/rig/env.py (PINNED); a rig test checks that they do.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD/.agents"

# name  npm package  version  binary
agents=(
  "claude-code @anthropic-ai/claude-code 2.1.328 claude"
  "codex @openai/codex 0.171.0 codex"
  "gemini @google/gemini-cli 0.61.0 gemini"
  # ACP adapters (Gemini speaks ACP itself: gemini --acp). codex-acp's native binary comes from
  # its optional platform package (@zed-industries/codex-acp-linux-x64 here).
  "claude-acp @zed-industries/claude-agent-acp 0.23.1 claude-agent-acp"
  "codex-acp @zed-industries/codex-acp 0.16.0 codex-acp"
)

# Libraries the tests' own Node scripts import (no binary): the official ACP TypeScript SDK drives
# `rawp-gateway acp` as an editor would, and `/acp` itself (tests/support/acp_ts_client.mjs). Its
# WebSocket client takes a WebSocket constructor, and Node 20 has no global one: `ws` (the one the
# SDK's own tests use) is given to it.
# name  npm package  version
libraries=(
  "acp-sdk @agentclientprotocol/sdk 2.4.0"
  "ws ws 8.23.1"
)

command -v npm >/dev/null || { echo "install-agents: npm is required (Node.js >= 20)" >&2; exit 1; }
node -e 'process.exit(Number(process.versions.node.split(".")[0]) < 20 ? 1 : 0)' 2>/dev/null ||
  { echo "install-agents: Node.js >= 20 is required (found $(node --version 2>&1))" >&2; exit 1; }

for line in "${agents[@]}"; do
  read -r name pkg version bin <<<"$line"
  prefix="$root/$name"
  manifest="$prefix/node_modules/$pkg/package.json"
  have=""
  if [ -f "$manifest" ]; then
    have="$(node -p "require(process.argv[1]).version" "$manifest" 2>/dev/null || true)"
  fi
  if [ "$have" != "$version" ] || [ ! -x "$prefix/node_modules/.bin/$bin" ]; then
    echo "install-agents: installing $pkg@$version into $prefix" >&2
    mkdir -p "$prefix"
    # A package.json of our own keeps npm from walking up into the repo; --no-save keeps it small.
    [ -f "$prefix/package.json" ] || echo '{"private": true}' >"$prefix/package.json"
    # Optional dependencies must stay on: Claude Code and Codex ship their native binaries as
    # platform-specific optional packages.
    npm install --prefix "$prefix" --include=optional --no-audit --no-fund --loglevel=error --no-save \
      "$pkg@$version" >&2
  fi
  echo "$name $version $prefix/node_modules/.bin/$bin"
done

for line in "${libraries[@]}"; do
  read -r name pkg version <<<"$line"
  prefix="$root/$name"
  manifest="$prefix/node_modules/$pkg/package.json"
  have=""
  if [ -f "$manifest" ]; then
    have="$(node -p "require(process.argv[1]).version" "$manifest" 2>/dev/null || true)"
  fi
  if [ "$have" != "$version" ]; then
    echo "install-agents: installing $pkg@$version into $prefix" >&2
    mkdir -p "$prefix"
    [ -f "$prefix/package.json" ] || echo '{"private": true}' >"$prefix/package.json"
    npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error --no-save \
      "$pkg@$version" >&2
  fi
  echo "$name $version $prefix/node_modules/$pkg"
done
