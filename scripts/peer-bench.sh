#!/usr/bin/env bash
# Peer benchmark: `ctx serve` beside the context proxies people use today,
# in front of one scripted upstream, measured side by side in one run.
# Not part of CI; docs/benchmarks.md ("Peer proxies") has the current
# figures and the command that made them.
#
#   bash scripts/peer-bench.sh [--rounds 3] [--bare 200] [--clients 100] [--seconds 5]
#
# What it does:
#  1. builds `ctx` in release and the `peer` bench target
#     (crates/context-engine-serve/benches/peer.rs: the scripted upstream
#     and the load generator, both in Rust);
#  2. installs the peers from their Python packages into throwaway
#     virtualenvs under .cache/peer-bench/ (kept between runs; delete the
#     folder for fresh installs): Headroom (package `headroom-ai[proxy]`,
#     `headroom proxy`) and LiteLLM's proxy (`litellm[proxy]`, the
#     plain-forwarding baseline: one model, `/v1/chat/completions` sent on
#     to the upstream unchanged);
#  3. starts the upstream (`peer upstream`), then each proxy against it on
#     loopback: `ctx serve --upstream URL` with its defaults otherwise (an
#     empty working folder and config home, so no config file is read),
#     LiteLLM with a generated config, Headroom with its upstream flags and
#     a dummy key;
#  4. runs `peer run` (bare requests, the corpus sessions from
#     ../shared/corpus or $CTX_CORPUS_DIR, 100 concurrent clients, CPU and
#     RSS of each proxy process), which prints one table and writes
#     .cache/peer-bench/result.json.
#
# A peer that fails to install or start stays in the table as
# unavailable, with the reason (its logs are in .cache/peer-bench/logs/).
# Exit status: non-zero only when ctx itself fails (build, start, or an
# error or a changed reply in the run).
#
# Environment: PEER_PEERS (default "litellm headroom"), PEER_PYTHON
# (default python3), PEER_START_SECONDS (how long a peer may take to
# listen, default 120).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
cache="$root/.cache/peer-bench"
logs="$cache/logs"
mkdir -p "$logs"
export CARGO_INCREMENTAL=0
python=${PEER_PYTHON:-python3}
peers=${PEER_PEERS:-litellm headroom}
start_seconds=${PEER_START_SECONDS:-120}
# The key the bench sends (its KEY): LiteLLM's proxy needs a master key.
key=sk-peer-bench-5b0d7c1e9a3f4e6d8c2b1a0f9e8d7c6b

say() { printf 'peer-bench: %s\n' "$*" >&2; }

started=()
cleanup() {
    for pid in "${started[@]}"; do
        # Each was started in a session of its own: end its group (a
        # peer's workers with it), then wait for it.
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    done
    for pid in "${started[@]}"; do
        wait "$pid" 2>/dev/null
    done
}
trap cleanup EXIT

# A free loopback port.
free_port() {
    "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until 127.0.0.1:$2 accepts, or process $1 died, or the time ran out.
wait_port() {
    local pid=$1 port=$2 deadline=$((SECONDS + start_seconds))
    while ((SECONDS < deadline)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            return 1
        fi
        if "$python" -c "import socket,sys; s=socket.socket(); s.settimeout(0.5); sys.exit(s.connect_ex(('127.0.0.1', $port)))" 2>/dev/null; then
            return 0
        fi
        sleep 0.5
    done
    return 2
}

# The last meaningful line of a log, for the table.
reason() {
    grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1 | cut -c1-200 | tr -d '\r' | tr '|' '/'
}

# Starts "$@" in a session of its own, output to $logs/$name.log; sets pid.
launch() {
    local name=$1
    shift
    setsid "$@" >"$logs/$name.log" 2>&1 &
    pid=$!
    started+=("$pid")
}

say "building ctx (release) and the peer bench"
if ! cargo build --release -p ctx >"$logs/build-ctx.log" 2>&1; then
    tail -n 20 "$logs/build-ctx.log" >&2
    say "ctx failed to build"
    exit 1
fi
bench=$(cargo bench -p context-engine-serve --bench peer --no-run --message-format=json 2>"$logs/build-bench.log" |
    "$python" -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "peer" and m.get("executable"):
        print(m["executable"])')
if [[ -z "$bench" || ! -x "$bench" ]]; then
    tail -n 20 "$logs/build-bench.log" >&2
    say "the peer bench failed to build"
    exit 1
fi

# Installs package spec $2 into the virtualenv $cache/$1; prints the
# reason and fails when it cannot.
install() {
    local venv="$cache/$1" spec=$2 log="$logs/install-$1.log"
    if [[ -f "$venv/.installed" ]] && [[ "$(cat "$venv/.installed")" == "$spec" ]]; then
        return 0
    fi
    say "installing $spec into $venv"
    rm -rf "$venv"
    if ! "$python" -m venv "$venv" >"$log" 2>&1; then
        echo "venv failed: $(reason "$log")"
        return 1
    fi
    if ! "$venv/bin/pip" install --disable-pip-version-check "$spec" >>"$log" 2>&1; then
        echo "pip install $spec failed: $(reason "$log")"
        return 1
    fi
    echo "$spec" >"$venv/.installed"
}

up_port=$(free_port)
upstream="http://127.0.0.1:$up_port/v1"
launch upstream "$bench" upstream --listen "127.0.0.1:$up_port"
if ! wait_port "$pid" "$up_port"; then
    say "the scripted upstream did not start: $(reason "$logs/upstream.log")"
    exit 1
fi

targets=()

# ctx: --upstream, a free loopback port, defaults otherwise.
ctx_home="$cache/ctx-home"
rm -rf "$ctx_home"
mkdir -p "$ctx_home"
ctx_port=$(free_port)
launch ctx env -C "$ctx_home" -u CTX_CONFIG XDG_CONFIG_HOME="$ctx_home" \
    "$root/target/release/ctx" serve --upstream "$upstream" --listen "127.0.0.1:$ctx_port"
ctx_pid=$pid
if ! wait_port "$ctx_pid" "$ctx_port"; then
    say "ctx serve did not start: $(reason "$logs/ctx.log")"
    exit 1
fi
targets+=(--target "ctx=http://127.0.0.1:$ctx_port/v1@$ctx_pid")

# Starts peer $1 (its command after the name), waits for its port $2, and
# adds it to the targets, or adds it as unavailable with the reason.
start_peer() {
    local name=$1 port=$2
    shift 2
    launch "$name" "$@"
    local peer_pid=$pid
    wait_port "$peer_pid" "$port"
    case $? in
    0) targets+=(--target "$name=http://127.0.0.1:$port/v1@$peer_pid") ;;
    1) targets+=(--target "$name=!exited at start: $(reason "$logs/$name.log")") ;;
    *)
        targets+=(--target "$name=!not listening after ${start_seconds}s: $(reason "$logs/$name.log")")
        # Not measured: stop it now rather than let it load the machine.
        kill -TERM -- "-$peer_pid" 2>/dev/null
        ;;
    esac
}

# The peers' working folder and home: what they write stays here.
peer_home="$cache/peer-home"
mkdir -p "$peer_home"
for peer in $peers; do
    case $peer in
    litellm)
        if why=$(install litellm 'litellm[proxy]'); then
            port=$(free_port)
            cat >"$cache/litellm.yaml" <<EOF
model_list:
  - model_name: m
    litellm_params:
      model: openai/m
      api_base: $upstream
      api_key: sk-peer-bench
general_settings:
  master_key: $key
litellm_settings:
  telemetry: false
EOF
            # Offline: the model price map shipped in the package, no
            # download at start.
            LITELLM_LOCAL_MODEL_COST_MAP=True start_peer litellm "$port" \
                env -C "$peer_home" HOME="$peer_home" "$cache/litellm/bin/litellm" --config "$cache/litellm.yaml" \
                --host 127.0.0.1 --port "$port" --num_workers 1
        else
            targets+=(--target "litellm=!$why")
        fi
        ;;
    headroom)
        if why=$(install headroom 'headroom-ai[proxy]'); then
            port=$(free_port)
            # No rate limit (60 requests a minute by default) and no
            # semantic cache (the rounds repeat the same requests, which
            # an agent never does); compression as it comes.
            OPENAI_API_KEY=sk-peer-bench LITELLM_LOCAL_MODEL_COST_MAP=True start_peer headroom "$port" \
                env -C "$peer_home" HOME="$peer_home" "$cache/headroom/bin/headroom" proxy --host 127.0.0.1 --port "$port" \
                --openai-api-url "$upstream" --no-rate-limit --no-cache --no-telemetry
        else
            targets+=(--target "headroom=!$why")
        fi
        ;;
    *)
        targets+=(--target "$peer=!unknown peer (known: litellm headroom)")
        ;;
    esac
done

say "measuring: ${targets[*]}"
"$bench" run --upstream "$upstream" "${targets[@]}" --json "$cache/result.json" "$@"
status=$?
if ((status == 2)); then
    say "ctx failed in the run (see its column and first_error); logs in $logs"
    exit 1
elif ((status != 0)); then
    say "the bench itself failed (status $status); logs in $logs"
    exit 1
fi
