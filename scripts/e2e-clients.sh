#!/usr/bin/env bash
# Real clients through `ctx serve`: the official openai Python SDK
# (non-streamed, streamed, tools) and mini-swe-agent (its litellm model
# pointed at the proxy) against the local llama.cpp server
# (scripts/local-llm.sh) as the upstream. Installs the clients' pinned
# versions (scripts/e2e-clients-requirements.txt) into a venv under .cache/,
# starts the model server and the proxy, runs scripts/e2e_clients.py, and
# stops both, also when a test fails. Fails when a prerequisite is missing:
# it never passes without having run.
#
# `bash scripts/e2e-clients.sh install` installs only (.ci/run does this
# in the background while the workspace builds).
#
# Environment: E2E_CLIENTS_VENV (default .cache/e2e-clients/venv),
# LOCAL_LLM_DIR / LOCAL_LLM_STATE as for scripts/local-llm.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

export LOCAL_LLM_STATE="${LOCAL_LLM_STATE:-$PWD/.cache/local-llm/e2e-clients-server.state}"
VENV="${E2E_CLIENTS_VENV:-$PWD/.cache/e2e-clients/venv}"
say() { echo "e2e-clients: $*" >&2; }

echo "== clients: install"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV" || { say "cannot create a virtualenv with python3 -m venv"; exit 1; }
fi
"$VENV/bin/pip" install --disable-pip-version-check -q -r scripts/e2e-clients-requirements.txt

echo "== local model: install"
bash scripts/local-llm.sh install
if [ "${1:-}" = "install" ]; then
  exit 0
fi

echo "== ctx: build"
cargo build --locked -p ctx
CTX="$PWD/target/debug/ctx"

serve_pid=""
cleanup() {
  if [ -n "$serve_pid" ] && kill -0 "$serve_pid" 2>/dev/null; then
    kill "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
  fi
  bash scripts/local-llm.sh stop || true
}
trap cleanup EXIT

echo "== local model: start"
upstream="$(bash scripts/local-llm.sh start)"
echo "model server at $upstream"

echo "== ctx serve: start"
port="$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
log="$(mktemp -t ctx-serve-XXXXXX.log)"
CTX_LOG=info "$CTX" serve --upstream "$upstream" --listen "127.0.0.1:$port" --context-length 8192 >"$log" 2>&1 &
serve_pid=$!
for _ in $(seq 1 100); do
  curl -fsS --max-time 1 "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  kill -0 "$serve_pid" 2>/dev/null || { cat "$log" >&2; say "ctx serve exited"; exit 1; }
  sleep 0.1
done
curl -fsS --max-time 1 "http://127.0.0.1:$port/healthz" >/dev/null || { cat "$log" >&2; say "ctx serve did not start"; exit 1; }

echo "== clients: tests"
status=0
# LITELLM_LOCAL_MODEL_COST_MAP: litellm would fetch its price table from the network.
CTX_SERVE_URL="http://127.0.0.1:$port/v1" LITELLM_LOCAL_MODEL_COST_MAP=True "$VENV/bin/python" scripts/e2e_clients.py || status=$?
echo "== ctx serve: metrics"
curl -fsS "http://127.0.0.1:$port/metrics" | grep -E '^ctx_(requests|fallbacks|compactions|prompt_tokens)_total' || true
if [ "$status" -ne 0 ]; then
  echo "== ctx serve: log"
  tail -n 50 "$log"
fi
rm -f "$log"
exit "$status"
