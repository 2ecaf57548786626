#!/usr/bin/env bash
# The CPython offsets of the preload's frame walk are the same on x86-64 and aarch64: compiles
# python_offsets.c against each given Python's headers with cc and with aarch64-linux-gnu-gcc,
# runs both (the second under qemu-aarch64) and compares what they print.
#
#   tests/foreign/python_offsets.sh [PYTHON...]     (default: python3)
set -euo pipefail
cd "$(dirname "$0")"
sysroot=${AARCH64_SYSROOT:-/usr/aarch64-linux-gnu}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for py in "${@:-python3}"; do
  inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  cc -o "$work/x86" python_offsets.c -I "$inc" -I "$inc/internal" 2>"$work/err" || { cat "$work/err"; exit 1; }
  aarch64-linux-gnu-gcc -o "$work/a64" python_offsets.c -I "$inc" -I "$inc/internal" 2>"$work/err" || { cat "$work/err"; exit 1; }
  "$work/x86" >"$work/x86.out"
  qemu-aarch64 -L "$sysroot" "$work/a64" >"$work/a64.out"
  if diff "$work/x86.out" "$work/a64.out"; then
    echo "ok    $(head -n1 "$work/x86.out"): $(($(wc -l <"$work/x86.out") - 1)) offsets, the same on x86-64 and aarch64"
  else
    echo "FAIL  $(head -n1 "$work/x86.out"): offsets differ (above: x86-64 <, aarch64 >)" >&2
    status=1
  fi
done
exit $status
