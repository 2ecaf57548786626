#!/usr/bin/env bash
# Builds the published wheels: the `vramtrace` CLI, the preload and the Python probe, linked with
# zig against glibc 2.17 (manylinux_2_17, which pip installs on any glibc 2.17+ Linux), for
# x86-64, aarch64 or both, into target/wheels/, and checks each with check_glibc_floor.sh.
#
#   scripts/build_wheel.sh [x86_64|aarch64|all]     (default: this machine's architecture)
#
# Needs maturin and zig (`pip install maturin ziglang`) and the Rust targets
# (`rustup target add x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu`). Each architecture
# builds in its own target directory (target/zig for x86-64, target/zig-aarch64), away from the
# workspace's target/.
# A plain `maturin build --release` also works; it links against this machine's glibc and tags
# the wheel with what that needs.
set -euo pipefail
cd "$(dirname "$0")/.."
compat=${VRAMTRACE_MANYLINUX:-manylinux_2_17}
archs=${1:-$(uname -m)}
[ "$archs" = all ] && archs="x86_64 aarch64"
for arch in $archs; do
  triple=$arch-unknown-linux-gnu
  rustup target list --installed 2>/dev/null | grep -qx "$triple" || rustup target add "$triple"
  before=$(date +%s)
  dir=target/zig
  [ "$arch" = x86_64 ] || dir=target/zig-$arch
  maturin build --release --zig --compatibility "$compat" --target "$triple" \
    --target-dir "$dir" -o target/wheels
  echo "build_wheel: $arch built in $(($(date +%s) - before)) s"
  wheel=$(ls -t target/wheels/vramtrace-*"${compat}"*"$arch".whl | head -n1)
  scripts/check_glibc_floor.sh --max "$(sed 's/manylinux_\([0-9]*\)_\([0-9]*\)/\1.\2/' <<<"$compat")" "$wheel"
  echo "build_wheel: $wheel"
done
