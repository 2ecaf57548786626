#!/usr/bin/env bash
# Builds what scripts/validate/h200.sh needs into .device/ (ignored by git): the release
# binaries, the preload, the C probes and the fla wheel. Run here, then carry .device.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build --release --workspace
mkdir -p .device/bin .device/whl
cp "$TARGET/release/vramtrace" "$TARGET/release/vramtrace-workload" "$TARGET/release/libvramtrace_preload.so" .device/bin/
# The CLI loses its debug info (the carry limit is 64 MiB; nothing symbolises the CLI). The
# preload and the workload are not stripped: the traces they record are symbolised from these
# very files.
strip --strip-debug .device/bin/vramtrace
# The C probes, linked against the stand-in only for its soname (libcuda.so.1): there they load
# the real driver.
lib=$(mktemp -d)
ln -sf "$TARGET/release/libcuda.so" "$lib/libcuda.so"
inc=(-I probes/preload/tests/c -I probes/preload/include)
cc -O2 -g "${inc[@]}" -o .device/bin/procaddr probes/preload/tests/c/procaddr.c -ldl
cc -O2 -g "${inc[@]}" -o .device/bin/dlopen_dlsym probes/preload/tests/c/dlopen_dlsym.c -ldl
cc -O2 -g "${inc[@]}" -o .device/bin/bench_loop probes/preload/tests/c/bench_loop.c -L "$lib" -lcuda -ldl
rm -rf "$lib"
if ! ls .device/whl/fla_core-0.6.0-*.whl >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform any -d .device/whl fla-core==0.6.0
fi
du -sh .device
