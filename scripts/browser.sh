#!/usr/bin/env bash
# Headless Chromium for the page tests (crates/ctx/tests/browser_*.rs):
# installs Debian's `chromium` and `chromium-driver` with apt-get when
# either is missing (idempotent, quiet), then runs those tests.
#
#   bash scripts/browser.sh           install, then run the browser tests
#   bash scripts/browser.sh install   install only (.ci/run does this
#                                     before `cargo test --workspace`)
#
# Needs root (or sudo) for apt-get; fails when the install fails, so a run
# never passes without a browser. The tests find the binaries on PATH or
# through CTX_CHROMIUM / CTX_CHROMEDRIVER.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "browser: $*" >&2; }

have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }

if have; then
  echo "browser: $(chromium --version 2>/dev/null | head -1), chromedriver present"
else
  command -v apt-get >/dev/null || { say "apt-get is required to install chromium and chromium-driver"; exit 1; }
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { say "root or sudo is required to install chromium"; exit 1; }
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null
  $sudo apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
  have || { say "chromium or chromedriver still missing after apt-get install"; exit 1; }
  echo "browser: installed $(chromium --version 2>/dev/null | head -1)"
fi

if [ "${1:-}" = "install" ]; then
  exit 0
fi
cargo test --locked -p ctx --test browser_replay --test browser_ui
