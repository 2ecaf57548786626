#!/usr/bin/env bash
# Python frames and the PyTorch probe on the GPU machine (see scripts/validate/h200.sh for the
# layout: .device/bin from scripts/validate/prepare.sh, the fla wheel under .device/whl).
#   scripts/validate/prepare.sh            # here
#   bash scripts/validate/torch_probe.sh   # there (after h200.sh setup has installed fla)
# Steps: frames (caching-on fla prefill: Python lines on the driver's segments), probe (the
# same run's tensor events, counted by the probe), oom (set_per_process_memory_fraction),
# shapes (--torch-shapes), cost (per tensor, beside _record_memory_history).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VT=$ROOT/.device/bin/vramtrace
VAL=$ROOT/scripts/validate
W=${WORK:-/tmp/vramtrace-validation/w}/torch-probe
mkdir -p "$W"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export VRAMTRACE_PYTHON_PROBE=$ROOT/probes/python/autostart VRAMTRACE_TORCH_PROBE_STATS=1
GDN="--kernel gdn --seqlens 4128 --hk 16 --hv 48 --k 128 --v 128"

frames() {
  rm -rf "$W/fla"
  $VT run --quiet --out "$W/fla" -- python3 "$VAL/model_vs_torch.py" $GDN > "$W/fla.out" 2> "$W/fla.err"
  tail -3 "$W/fla.err"
  $VT summary "$W/fla" --frames 12 | tee "$W/fla-summary.txt" | head -60
  $VT events --stacks "$W/fla" > "$W/fla-events.jsonl"
  python3 - "$W/fla-events.jsonl" <<'PY'
import json, sys
n = py = 0
for l in open(sys.argv[1]):
    e = json.loads(l)
    if e["kind"] != "alloc":
        continue
    n += 1
    fr = [f for f in e.get("frames") or [] if f.get("module") == "python"]
    py += bool(fr)
    if fr and n <= 10:
        print(e["size"], " <- ".join(f"{f['file'].rsplit('/', 1)[-1]}:{f.get('line')} {f['function']}" for f in fr[:4]))
print(f"allocations {n}, with Python frames {py}")
PY
  grep -c chunk_o.py "$W/fla-summary.txt"
}

oom() {
  rm -rf "$W/oom"
  $VT run --quiet --out "$W/oom" -- python3 -c '
import torch
torch.cuda.set_per_process_memory_fraction(0.05)
keep = [torch.empty(1 << 30, dtype=torch.uint8, device="cuda") for _ in range(4)]
try:
    big = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError as e:
    print("raised:", str(e).splitlines()[0])
' 2>&1 | tail -3
  $VT summary "$W/oom" | head -20
  ls -la "$W/oom"
}

shapes() {
  rm -rf "$W/shapes"
  $VT run --quiet --torch-shapes --out "$W/shapes" -- python3 "$VAL/model_vs_torch.py" $GDN > /dev/null 2> "$W/shapes.err"
  tail -3 "$W/shapes.err"
  $VT summary "$W/shapes" | head -30
}

cost() {
  local m
  for m in bare gpu_trace history_python history_all; do
    python3 "$VAL/torch_probe_cost.py" $m
  done
  local shapes
  for m in probe probe_shapes; do
    shapes=""
    [ $m = probe_shapes ] && shapes=--torch-shapes
    rm -rf "$W/cost"
    $VT run --quiet --no-stacks $shapes --out "$W/cost" -- python3 "$VAL/torch_probe_cost.py" $m
    rm -rf "$W/cost"
    $VT run --quiet $shapes --out "$W/cost" -- python3 "$VAL/torch_probe_cost.py" $m | sed 's/$/ (native stacks on)/'
  done
  rm -rf "$W/cost"
}

cost_sizes() {
  # The probe's two size sources side by side, alternating: the allocator's own statistics
  # (native, the default where they check out) and torch._C._cuda_memoryStats (dict).
  local lib
  lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so"))')
  echo "exported: $(nm -D --defined-only "$lib" | grep -c -e getDeviceStats -e 20CUDACachingAllocator9allocatorE) symbols"
  readelf -Ws --wide "$lib" | grep -e getDeviceStats -e 20CUDACachingAllocator9allocatorE | cut -c1-220 | head -8
  local r m
  for r in 1 2 3; do
    for m in native dict; do
      rm -rf "$W/cost"
      if [ $m = dict ]; then export VRAMTRACE_TORCH_SIZES=dict; else unset VRAMTRACE_TORCH_SIZES; fi
      echo "round $r sizes $m: $($VT run --quiet --no-stacks --out "$W/cost" -- python3 "$VAL/torch_probe_cost.py" probe 2>&1 | tr '\n' ' ')"
    done
  done
  unset VRAMTRACE_TORCH_SIZES
  for m in bare gpu_trace history_python history_all; do python3 "$VAL/torch_probe_cost.py" $m; done
  rm -rf "$W/cost"
}

for s in ${*:-frames oom shapes cost}; do
  echo; echo "=== $s ($(date +%T))"
  "$s" || echo "!!! STEP $s FAILED"
done
