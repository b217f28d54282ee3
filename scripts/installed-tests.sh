#!/usr/bin/env bash
# Tests what scripts/release.sh built into dist/, installed as someone
# without Rust has it: the wheel in a fresh virtualenv, then, with a bare
# environment (`env -i`, no cargo or rustc on PATH), `ctx --version`, the
# README's main job, `ctx serve` answering, the import, the Python suite
# (python/tests, Hermes 0.19 end to end through the installed plugin)
# against the installed package, and the standalone binary; before that,
# the wheel's tags (abi3, manylinux_2_17), its size (at most 30 MB) and the
# glibc floor (no GLIBC_ symbol above 2.28 in the extension or dist/ctx);
# after, the wheel in CPython 3.9 and 3.13 too (abi3).
#
#   bash scripts/installed-tests.sh [PYTEST ARGS...]
#
# Environment: DIST (default dist/), INSTALLED_VENV (default
# .cache/installed-venv, made anew), PYTHON (its interpreter, default
# python3), LOCAL_LLM_DIR and CTX_REQUIRE_LOCAL_LLM (the local-model test,
# as for scripts/python-tests.sh), ABI3_PYTHONS (default "3.9 3.13"). Under
# CI=true a missing prerequisite (another interpreter) fails; elsewhere it
# is skipped with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dist="${DIST:-$root/dist}"
venv="${INSTALLED_VENV:-$root/.cache/installed-venv}"
say() { echo "installed-tests: $*" >&2; }
fail() {
  say "FAILED: $*"
  exit 1
}
in_ci() { [ "${CI:-}" = "1" ] || [ "$(echo "${CI:-}" | tr '[:upper:]' '[:lower:]')" = "true" ]; }
missing() {
  if in_ci; then fail "prerequisite missing under CI=true: $*"; fi
  say "skipped: $*"
}

shopt -s nullglob
wheels=("$dist"/context_engine-*.whl)
shopt -u nullglob
[ "${#wheels[@]}" -eq 1 ] || fail "expected one wheel in $dist (bash scripts/release.sh), found ${#wheels[@]}"
wheel="${wheels[0]}"
[ -x "$dist/ctx" ] || fail "$dist/ctx is missing (bash scripts/release.sh)"
work="$(mktemp -d)"
serve_pid=""
cleanup() {
  if [ -n "$serve_pid" ]; then kill "$serve_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== the wheel: tags and size"
name="$(basename "$wheel")"
echo "$name"
# One wheel for every CPython >= 3.9 (abi3), on glibc >= 2.17.
case "$name" in
  *-cp39-abi3-*manylinux_2_17_x86_64*.whl) ;;
  *) fail "$name is not tagged cp39-abi3 manylinux_2_17_x86_64" ;;
esac
python3 - "$wheel" "$work/wheel" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))
    tags = [l.split(":", 1)[1].strip() for l in z.read(meta).decode().splitlines() if l.startswith("Tag:")]
    print("tags:", ", ".join(tags))
    assert "cp39-abi3-manylinux_2_17_x86_64" in tags, tags
    names = z.namelist()
    for want in ("context_engine/_cli.py", "context_engine/hermes/__init__.py", "context_engine/py.typed"):
        assert want in names, f"{want} is not in the wheel"
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    scripts = z.read(entry).decode().replace(" ", "").splitlines()
    assert "ctx=context_engine._cli:main" in scripts, f"no ctx console script: {scripts}"
    so = [n for n in names if n.endswith(".so")]
    assert len(so) == 1, f"one native library expected (the extension), found {so}"
    z.extract(so[0], sys.argv[2])
    print(f"{so[0]}: {z.getinfo(so[0]).file_size / 1e6:.1f} MB ({z.getinfo(so[0]).compress_size / 1e6:.1f} MB compressed)")
EOF
size=$(stat -c %s "$wheel")
echo "wheel: $((size / 1000)) kB; dist/ctx: $(($(stat -c %s "$dist/ctx") / 1000)) kB"
[ "$size" -le 30000000 ] || fail "the wheel is $size bytes, over 30 MB"

echo "== glibc floor (at most GLIBC_2.28)"
for lib in "$work"/wheel/context_engine/*.so "$dist/ctx"; do
  highest="$(objdump -T "$lib" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -Vu | tail -n 1)"
  [ -n "$highest" ] || fail "$lib: no GLIBC_ symbol versions (objdump -T)"
  echo "$(basename "$lib"): highest GLIBC_$highest"
  [ "$(printf '%s\n' "$highest" 2.28 | sort -V | tail -n 1)" = "2.28" ] || fail "$lib needs GLIBC_$highest, above 2.28"
done

echo "== install into a fresh virtualenv"
start=$SECONDS
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel" "pytest>=7" "hermes-agent==0.19.0"
echo "installed in $((SECONDS - start)) s"

# From here on, the environment of someone without Rust: nothing but the
# virtualenv and the system's own directories on PATH, a home of its own.
mkdir -p "$work/home"
bare=(env -i "PATH=$venv/bin:/usr/bin:/bin" "HOME=$work/home" "LANG=C.UTF-8" "TMPDIR=${TMPDIR:-/tmp}"
  "CI=${CI:-}" "LOCAL_LLM_DIR=${LOCAL_LLM_DIR:-$root/.cache/local-llm}"
  "CTX_REQUIRE_LOCAL_LLM=${CTX_REQUIRE_LOCAL_LLM:-}")
if "${bare[@]}" bash -c 'command -v cargo || command -v rustc'; then
  fail "cargo or rustc is on the bare PATH"
fi
echo "no cargo, no rustc on PATH"

echo "== ctx --version (the console script)"
[ "$("${bare[@]}" bash -c 'command -v ctx')" = "$venv/bin/ctx" ] || fail "ctx is not the virtualenv's"
"${bare[@]}" ctx --version

echo "== the README's main job through the installed ctx"
"${bare[@]}" ctx replay examples/coding-session.json --context-length 16000 >"$work/replay.txt" ||
  fail "ctx replay exited $? ($(tail -n 5 "$work/replay.txt"))"
head -n 3 "$work/replay.txt"
grep -q "37 model calls replayed" "$work/replay.txt" || fail "ctx replay printed no report"

echo "== ctx serve answering"
port="$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
# No request goes upstream here: the port only has to be loopback.
"${bare[@]}" ctx serve --upstream http://127.0.0.1:9/v1 --listen "127.0.0.1:$port" >"$work/serve.log" 2>&1 &
serve_pid=$!
up=""
for _ in $(seq 1 300); do
  if curl -fsS --max-time 1 "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; then up=1 && break; fi
  kill -0 "$serve_pid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$up" ] || fail "ctx serve did not answer /healthz: $(tail -n 20 "$work/serve.log")"
curl -fsS "http://127.0.0.1:$port/metrics" | grep -m 3 '^ctx_' || fail "no ctx_ metrics"
kill -INT "$serve_pid"
rc=0
wait "$serve_pid" || rc=$?
serve_pid=""
[ "$rc" -eq 0 ] || fail "ctx serve exited $rc on SIGINT: $(tail -n 20 "$work/serve.log")"
! grep -q Traceback "$work/serve.log" || fail "a traceback in ctx serve's log"
echo "answered /healthz and /metrics; stopped on SIGINT (exit 0)"

echo "== import, and the first count after it"
# The tables are built at run time (compact-vocab), started at import on a
# background thread: a count at once waits for them, one a moment later
# does not.
(cd "$work" && "${bare[@]}" python - "$venv" "$root/examples/coding-session.json" <<'EOF'
import json, sys, time
t0 = time.perf_counter()
import context_engine as ce
t1 = time.perf_counter()
assert ce.__file__.startswith(sys.argv[1]), f"{ce.__file__} is not the installed package"
msgs = json.load(open(sys.argv[2], encoding="utf-8"))
def timed():
    start = time.perf_counter()
    n = ce.count_tokens(msgs)
    return n, (time.perf_counter() - start) * 1000
n1, first = timed()
n2, second = timed()
assert n1 == n2
print(f"import {1000 * (t1 - t0):.0f} ms; at once: first count {first:.1f} ms, second {second:.1f} ms ({n1} tokens)")
EOF
)
(cd "$work" && "${bare[@]}" python - "$root/examples/coding-session.json" <<'EOF'
import json, sys, time
import context_engine as ce
msgs = json.load(open(sys.argv[1], encoding="utf-8"))
time.sleep(3)
def timed():
    start = time.perf_counter()
    ce.count_tokens(msgs)
    return (time.perf_counter() - start) * 1000
first, second = timed(), timed()
print(f"3 s after import: first count {first:.1f} ms, second {second:.1f} ms")
EOF
)

echo "== the Python suite against the installed package"
# From a directory of its own: python/ is not on sys.path, so every
# `import context_engine` is the wheel's (python/tests itself is, for
# conftest.py and the scripted server).
set +e
(cd "$work" && "${bare[@]}" python -m pytest -q -rs -p no:cacheprovider "$root/python/tests" "$@")
rc=$?
set -e
[ "$rc" -ne 5 ] || fail "pytest collected no tests"
[ "$rc" -eq 0 ] || fail "pytest exited $rc"

echo "== the standalone binary"
"${bare[@]}" "$dist/ctx" --version
"${bare[@]}" "$dist/ctx" replay examples/coding-session.json --context-length 16000 >"$work/replay-bin.txt" ||
  fail "dist/ctx replay exited $?"
grep -q "37 model calls replayed" "$work/replay-bin.txt" || fail "dist/ctx replay printed no report"
# Same figures as the wheel's ctx (engine times aside).
diff <(grep -v 'engine time' "$work/replay.txt") <(grep -v 'engine time' "$work/replay-bin.txt") ||
  fail "dist/ctx and the wheel's ctx replay the session differently"
echo "same report as the wheel's ctx"

echo "== abi3: the same wheel in other CPython versions"
for version in ${ABI3_PYTHONS-3.9 3.13}; do
  # pyenv's versions first: its shims on PATH may name a version they do
  # not run.
  interp=""
  for candidate in "$HOME"/.pyenv/versions/"$version".*/bin/python3 "$(command -v "python$version" || true)"; do
    if [ -x "$candidate" ] && "$candidate" -c 'import venv' 2>/dev/null; then
      interp="$candidate"
      break
    fi
  done
  if [ -z "$interp" ]; then
    missing "no CPython $version (python$version, or pyenv) to install the wheel into"
    continue
  fi
  "$interp" -m venv "$work/venv-$version"
  "$work/venv-$version/bin/python" -m pip install -q --disable-pip-version-check "$wheel"
  (cd "$work" && env -i "PATH=$work/venv-$version/bin:/usr/bin:/bin" "HOME=$work/home" ctx --version >/dev/null)
  (cd "$work" && env -i "PATH=$work/venv-$version/bin:/usr/bin:/bin" "HOME=$work/home" python -c \
    'import sys, context_engine as ce; assert ce.count_tokens("hello world") == 2; print(sys.version.split()[0], "ok")')
done
echo "installed-tests: passed"
