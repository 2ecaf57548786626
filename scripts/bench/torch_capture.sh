#!/usr/bin/env bash
# Per-tensor cost of the PyTorch probe on the stand-in (issue 19, item 3: native capture ≤ 1 µs
# per tensor over bare), side by side with today's callback path:
#   scripts/bench/torch_capture.sh [TENSORS] [ROUNDS]
# Builds the release preload and the stand-in libc10 / libc10_cuda (probes/python/tests), then
# runs probes/python/tests/bench_tensors.py (a 1 MiB block handed out and taken back per tensor,
# best of 5 loops) alternately, ROUNDS times (3 by default), one process per run:
#   bare       no preload
#   native     the preload and the probe as `vramtrace run` sets them up (its default 4 GiB
#              budget, so the live-tensor table, included)
#   paused     native, with capture paused (`vramtrace_torch.pause()`): what decode_alternate.py's
#              `toggled:off` turns still cost over bare
#   callbacks  native's set-up with VRAMTRACE_TORCH_CAPTURE=callbacks
# Prints each run and a table: the best run of each mode, its overhead over the best bare run,
# and that overhead against 1 µs.
# With EVICT_BYTES (as 2000000) each tensor's life and the gap after it copy that many bytes, as
# a model's work pushes the recorder out of the caches between two allocations; the figure is
# then the time inside the allocator's calls alone (bench_tensors.py's call_ns_per_tensor),
# DEPTH (default 24 then, 0 otherwise) frames down, and the callback path (whose callbacks run
# outside those calls) is left out. docs/performance.md, "Cold caches".
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
N=${1:-20000}
EVICT=${EVICT_BYTES:-0}
MODES="bare native paused callbacks"
if [ "$EVICT" != 0 ]; then MODES="bare native paused"; DEPTH=${DEPTH:-24}; else DEPTH=${DEPTH:-0}; fi
export EVICT_BYTES=$EVICT
ROUNDS=${2:-3}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$ROOT"
cargo build --release -q -p vramtrace-preload
PRELOAD=$TARGET/release/libvramtrace_preload.so
. "$ROOT/scripts/bench/fake_torch.sh"

run() {
  local mode=$1 out
  rm -rf "$W/trace"
  case $mode in
    bare) out=$(PYTHONPATH="$W/fake_torch" python3 "$T/bench_tensors.py" "$N" 5 "$DEPTH") ;;
    native|paused|callbacks)
      local capture=auto want=$mode paused=0
      [ "$mode" = callbacks ] && capture=callbacks
      [ "$mode" = paused ] && want=native paused=1
      out=$(PAUSE_CAPTURE=$paused PYTHONPATH="$ROOT/probes/python/autostart:$W/fake_torch" LD_PRELOAD="$PRELOAD" \
        VRAMTRACE_DIR="$W/trace" VRAMTRACE_MAX_SIZE=4294967296 VRAMTRACE_TORCH_CAPTURE=$capture VRAMTRACE_TORCH_PROBE_STATS=1 VRAMTRACE_SELF_TIME=${SELF_TIME:-0} \
        python3 "$T/bench_tensors.py" "$N" 5 "$DEPTH" 2> "$W/err") || { cat "$W/err"; exit 1; }
      grep -q "capture=$want" "$W/err" || { echo "$mode: the probe did not capture that way:"; cat "$W/err"; exit 1; } ;;
  esac
  [ "${SELF_TIME:-0}" = 1 ] && [ "$mode" = native ] && grep -o "self_ns.*" "$W/err" >&2
  case $out in
    *call_ns_per_tensor*) echo "$mode ${out##*call_ns_per_tensor }" ;;
    *) echo "$mode ${out#ns_per_tensor }" ;;
  esac
}

for r in $(seq "$ROUNDS"); do
  for mode in $MODES; do
    line=$(run $mode)
    echo "round $r $line"
    echo "$line" >> "$W/results"
  done
done
python3 - "$W/results" <<'PY'
import sys
best = {}
for line in open(sys.argv[1]):
    mode, ns = line.split()[:2]
    best[mode] = min(float(ns), best.get(mode, float("inf")))
bare = best["bare"]
print(f"\n| mode | ns per tensor (best) | over bare | over bare / 1 µs |")
print("| --- | ---: | ---: | ---: |")
for mode in best:
    over = best[mode] - bare
    print(f"| {mode} | {best[mode]:.0f} | {over:+.0f} ns | {over / 1000:.2f} |")
PY
