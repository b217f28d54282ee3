#!/usr/bin/env bash
# Real agents through `ctx serve`: installs the pinned Claude Code and Codex
# packages (scripts/clients/package.json + package-lock.json) into
# .cache/npm-clients with `npm ci` (skipped when the lock file has not
# changed since the last install), then runs their test
# (crates/ctx/tests/agents.rs: each agent, offline, against the project's
# scripted upstream). Only the packages' native binaries are used; no
# install script runs.
#
#   bash scripts/e2e-agents.sh           install, then run the test
#   bash scripts/e2e-agents.sh install   install only (.ci/run does this
#                                        before `cargo test --workspace`)
#
# Fails when npm is missing or the install fails: it never passes without
# having run. Environment: CTX_AGENT_CLIENTS_CACHE (default
# .cache/npm-clients).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${CTX_AGENT_CLIENTS_CACHE:-$PWD/.cache/npm-clients}"
say() { echo "e2e-agents: $*" >&2; }

command -v npm >/dev/null || { say "npm is required to install the agent clients"; exit 1; }
mkdir -p "$CACHE"
stamp="$CACHE/.lock-sha256"
want="$(sha256sum scripts/clients/package-lock.json | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d "$CACHE/node_modules" ]; then
  echo "agent clients: cached ($CACHE)"
else
  cp scripts/clients/package.json scripts/clients/package-lock.json "$CACHE/"
  (cd "$CACHE" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  echo "$want" >"$stamp"
fi
for bin in "@anthropic-ai/claude-code-linux-x64/claude" \
           "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"; do
  [ -x "$CACHE/node_modules/$bin" ] || { say "missing after install: $bin (only linux-x64 is supported)"; exit 1; }
done

if [ "${1:-}" = "install" ]; then
  exit 0
fi
CTX_AGENT_CLIENTS="$CACHE/node_modules" cargo test --locked -p ctx --test agents -- --test-threads=1
