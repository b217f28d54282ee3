#!/usr/bin/env bash
# Builds the Python package (python/) into a virtualenv under .cache/ with
# hermes-agent and pytest, then runs its pytest suite (python/tests):
# the API over dicts, errors, threads, the Hermes adapter, and Hermes's own
# CLI compacting through the engine against a scripted server.
#
#   bash scripts/python-tests.sh [PYTEST ARGS...]
#   bash scripts/python-tests.sh install   # the virtualenv only
#   bash scripts/python-tests.sh lint      # fmt and clippy of python/ only
#
# CI runs `lint` here and the suite against the wheel, installed
# (scripts/release.sh, scripts/installed-tests.sh); this script's build is
# the developer's loop (a dev build of the extension, no zig, no wheel).
#
# Also checks `cargo fmt` and `cargo clippy -D warnings` on python/ first.
# A local-model test runs when the model is installed (LOCAL_LLM_DIR,
# default .cache/local-llm); CTX_REQUIRE_LOCAL_LLM=1 makes its absence a
# failure.
#
# Environment: PYTHON (interpreter for the venv, default python3),
# PY_VENV (default .cache/python-venv), PY_PROFILE (cargo profile of the
# extension: dev, the default, reuses the root test build's dependencies in
# target/; release for benchmarks), CARGO_TARGET_DIR (default target/).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv="${PY_VENV:-$root/.cache/python-venv}"
profile="${PY_PROFILE:-dev}"

if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  "maturin>=1.9.4,<2" "pytest>=7" "hermes-agent==0.19.0"
if [ "${1:-}" = "install" ]; then
  exit 0
fi

# The extension crate is its own workspace: format and lint it here (the
# root's `cargo clippy --workspace` does not see it). Same target dir as the
# root, so the dependencies' check builds are shared.
export PYO3_PYTHON="$venv/bin/python"
cargo fmt --manifest-path python/Cargo.toml -- --check
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" \
  cargo clippy --manifest-path python/Cargo.toml --all-targets --locked -- -D warnings
if [ "${1:-}" = "lint" ]; then
  exit 0
fi

echo "python-tests: building the extension (cargo profile $profile)" >&2
PATH="$venv/bin:$PATH" \
  CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" \
  MATURIN_PEP517_ARGS="--profile $profile" \
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
  --no-build-isolation --no-deps --force-reinstall ./python

# From the root: python/ on sys.path would shadow the installed package.
set +e
"$venv/bin/pytest" -q -rs python/tests "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "python-tests: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
