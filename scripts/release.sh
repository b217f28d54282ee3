#!/usr/bin/env bash
# Builds what people install without a Rust toolchain into dist/:
#
#   dist/context_engine-<version>-cp39-abi3-manylinux_2_17_x86_64.whl
#       one wheel for CPython 3.9 to 3.13 (abi3), glibc >= 2.17: the
#       extension, the Hermes plugin and the `ctx` command (a console script
#       that runs the command line inside the extension, not a second
#       binary); vocabularies as text, tables built at run time
#       (`compact-vocab`), so that it stays under 30 MB
#   dist/ctx
#       the `ctx` binary alone, x86-64 Linux, glibc >= 2.17, with the
#       precomputed tables (starts at once, some 50 MB)
#   dist/SHA256SUMS
#
#   bash scripts/release.sh            # build (installs the tools first)
#   bash scripts/release.sh install    # the tools' virtualenv only
#
# The glibc floor comes from zig as the C compiler and linker (through
# cargo-zigbuild's `zig cc`); zig, cargo-zigbuild and maturin all come from
# the Python Package Index into a virtualenv under .cache/: no Docker, no
# manylinux image, no system cross toolchain. scripts/installed-tests.sh
# checks the result.
#
# Environment: RELEASE_PROFILE (`dist`, the default: cargo profile `dist`,
# fat LTO and one codegen unit; `ci`: cargo profile `ci-release`, the same
# code optimized less, the build CI can afford, and a binary with the
# wheel's run-time tables, so that it shares the wheel's build),
# RELEASE_VENV (default .cache/release-venv), PYTHON (interpreter for the
# venv, default python3), CARGO_TARGET_DIR (default target/), DIST (default
# dist/).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv="${RELEASE_VENV:-$root/.cache/release-venv}"
dist="${DIST:-$root/dist}"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
# glibc 2.17 (manylinux2014): what every maintained x86-64 distribution has.
glibc=2.17

if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  "maturin==1.16.0" "ziglang==0.17.1" "cargo-zigbuild==0.24.1"
if [ "${1:-}" = "install" ]; then
  exit 0
fi

# The same cargo profile for both (python/Cargo.toml and the root's have
# it): the dependencies they share are built once, in one target directory.
case "${RELEASE_PROFILE:-dist}" in
  dist) profile=dist bin_features=() bin_build=(-p ctx) ;;
  # CI's binary has the wheel's tables too, built in the wheel's workspace
  # with its features: it then shares every crate with the wheel's build
  # and costs a link.
  ci)
    profile=ci-release bin_features=(compact-vocab)
    bin_build=(--manifest-path python/Cargo.toml -p context-engine-python -p ctx)
    ;;
  *)
    echo "release: RELEASE_PROFILE is dist or ci, not ${RELEASE_PROFILE}" >&2
    exit 2
    ;;
esac

export PATH="$venv/bin:$PATH"
export CARGO_TARGET_DIR="$target_dir"
export PYO3_PYTHON="$venv/bin/python"
# zig as the C compiler and linker, through cargo-zigbuild's `zig cc` (it
# adapts the linker's arguments to zig), targeting glibc $glibc. One pair of
# wrappers, set for both builds, rather than `maturin --zig`'s and `cargo
# zigbuild`'s own: cargo fingerprints every crate with the linker's path,
# so two wrappers would rebuild every shared dependency a second time.
zig_version="$("$venv/bin/python" -m ziglang version)"
wrap="$venv/zig-wrappers-$glibc"
mkdir -p "$wrap"
for tool in cc c++; do
  cat >"$wrap/zig$tool" <<WRAPPER
#!/bin/sh
export CARGO_ZIGBUILD_ZIG_VERSION=$zig_version
export CARGO_ZIGBUILD_ZIG_COMMAND="$venv/bin/python3"
export CARGO_ZIGBUILD_ZIG_COMMAND_ARGS='-m ziglang'
exec "$venv/bin/cargo-zigbuild" zig $tool -- -g '-fno-sanitize=all' -target x86_64-linux-gnu.$glibc "\$@"
WRAPPER
  chmod +x "$wrap/zig$tool"
done
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER="$wrap/zigcc"
export CC_x86_64_unknown_linux_gnu="$wrap/zigcc"
export CXX_x86_64_unknown_linux_gnu="$wrap/zigc++"
rm -rf "$dist"
mkdir -p "$dist"

start=$SECONDS
echo "release: the wheel (cargo profile $profile)" >&2
# maturin checks the extension against the manylinux_2_17 policy (its
# symbol versions) before it writes the wheel.
maturin build --locked --profile "$profile" --compatibility "manylinux_${glibc//./_}" \
  --target x86_64-unknown-linux-gnu -m python/Cargo.toml --out "$dist"
wheel_secs=$((SECONDS - start))

start=$SECONDS
echo "release: the ctx binary (cargo profile $profile${bin_features[*]:+, features }${bin_features[*]})" >&2
cargo build --locked --profile "$profile" "${bin_build[@]}" --bin ctx --target x86_64-unknown-linux-gnu
cp "$target_dir/x86_64-unknown-linux-gnu/$profile/ctx" "$dist/ctx"
bin_secs=$((SECONDS - start))

(cd "$dist" && sha256sum -- *.whl ctx >SHA256SUMS)
echo "release: built in $((wheel_secs + bin_secs)) s (wheel $wheel_secs s, binary $bin_secs s):" >&2
ls -l "$dist" >&2
