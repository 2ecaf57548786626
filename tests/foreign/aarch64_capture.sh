#!/usr/bin/env bash
# The preload's capture tests on aarch64, under qemu-user, on this x86-64 machine:
#   - cross-builds the preload and the stand-in driver (testbed/fakecuda) for
#     aarch64-unknown-linux-gnu into target/aarch64 (its own target directory),
#   - compiles the preload's C test programs (probes/preload/tests/c) with aarch64-linux-gnu-gcc,
#   - runs each under `qemu-aarch64 -L /usr/aarch64-linux-gnu` with the aarch64 preload and
#     driver, and checks what it printed against its trace, read by the x86-64 CLI (the trace
#     format is the same little-endian bytes on both): tests/foreign/check_capture.py.
# Needs: rustup target aarch64-unknown-linux-gnu; Debian's gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross and qemu-user (or qemu-user-static). `.ci/run` installs them.
#
#   tests/foreign/aarch64_capture.sh [VRAMTRACE_CLI]
#
# With VRAMTRACE_AARCH64_WHEEL set to an aarch64 wheel (scripts/build_wheel.sh aarch64), also:
# the wheel's preload (linked by zig against glibc 2.17) records every_api under qemu, and the
# wheel's aarch64 CLI, under qemu, reads the traces exactly as the x86-64 CLI does.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
triple=aarch64-unknown-linux-gnu
sysroot=${AARCH64_SYSROOT:-/usr/aarch64-linux-gnu}
cc=${AARCH64_CC:-aarch64-linux-gnu-gcc}
qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)
[ -n "$qemu" ] || { echo "aarch64: no qemu-aarch64 (apt-get install qemu-user)" >&2; exit 1; }
command -v "$cc" >/dev/null || { echo "aarch64: no $cc (apt-get install gcc-aarch64-linux-gnu)" >&2; exit 1; }

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER:-$cc}
cargo build --release -p vramtrace-preload -p vramtrace-fakecuda --lib --target "$triple" \
  --target-dir target/aarch64
lib=target/aarch64/$triple/release
cli=${1:-}
if [ -z "$cli" ]; then
  cargo build -p vramtrace --bin vramtrace
  cli=target/debug/vramtrace
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/vramtrace-aarch64.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/driver"
cp "$lib/libcuda.so" "$work/driver/libcuda.so.1"
ln -s libcuda.so.1 "$work/driver/libcuda.so"
preload=$root/$lib/libvramtrace_preload.so

# compile NAME [link-cuda] [extra flags...]
compile() {
  local name=$1 link=$2
  shift 2
  local src=probes/preload/tests/c/$name.c
  [ -f "$src" ] || src=tests/foreign/$name.c
  local args=("$@" -O1 -g -Wall -o "$work/$name" "$src" -I probes/preload/tests/c -I probes/preload/include)
  [ "$link" = 1 ] && args+=(-L "$work/driver" -lcuda)
  "$cc" "${args[@]}" -ldl -lpthread
}

# run NAME [VAR=VALUE...]: runs the program under qemu with the preload, tracing into
# $work/NAME.trace; its stdout goes to $work/NAME.out.
run() {
  local name=$1
  shift
  local envs=(-E "LD_PRELOAD=$preload" -E "LD_LIBRARY_PATH=$work/driver" -E "VRAMTRACE_DIR=$work/$name.trace")
  for kv in "$@"; do envs+=(-E "$kv"); done
  (cd "$work" && "$qemu" -L "$sysroot" "${envs[@]}" "./$name") >"$work/$name.out"
}

compile every_api 1
compile dlopen_dlsym 0
compile procaddr 0
compile threads 1
compile no_cuda 0
compile rtld_next 0
compile fork 1
compile stacks 1 -fomit-frame-pointer -fno-optimize-sibling-calls

run every_api VRAMTRACE_FAKE_DEVICES=2 VRAMTRACE_FAKE_CAPACITY=1073741824
run dlopen_dlsym
run procaddr VRAMTRACE_FAKE_CAPACITY=1073741824
run threads
run no_cuda
run rtld_next
run fork
run stacks

file "$work/every_api" "$preload" "$work/driver/libcuda.so.1" | sed "s|$work/||"
python3 tests/foreign/check_capture.py "$cli" "$work"

if [ -n "${VRAMTRACE_AARCH64_WHEEL:-}" ]; then
  python3 -m zipfile -e "$VRAMTRACE_AARCH64_WHEEL" "$work/wheel"
  a64cli=$(echo "$work"/wheel/*.data/scripts/vramtrace)
  chmod +x "$a64cli"
  preload=$work/wheel/vramtrace/libvramtrace_preload.so
  rm -rf "$work/every_api.trace"
  run every_api VRAMTRACE_FAKE_DEVICES=2 VRAMTRACE_FAKE_CAPACITY=1073741824
  python3 tests/foreign/check_capture.py "$cli" "$work" >/dev/null ||
    { echo "FAIL  the aarch64 wheel's preload: see check_capture.py $cli $work" >&2; exit 1; }
  echo "ok    the aarch64 wheel's preload records every_api under qemu"
  for name in every_api stacks fork; do
    if diff <("$cli" events "$work/$name.trace") \
      <("$qemu" -L "$sysroot" "$a64cli" events "$work/$name.trace") >/dev/null; then
      echo "ok    the aarch64 wheel's CLI reads $name's trace as the x86-64 CLI does"
    else
      echo "FAIL  the aarch64 wheel's CLI reads $name's trace differently" >&2
      exit 1
    fi
  done
  "$qemu" -L "$sysroot" "$a64cli" summary "$work/every_api.trace" | head -n 5
fi
