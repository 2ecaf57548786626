#!/usr/bin/env bash
# The PyTorch probe starts however torch is reached (issue 19 item 1), on the GPU machine
# (layout as scripts/validate/h200.sh: .device/bin from scripts/validate/prepare.sh).
#   bash scripts/validate/torch_activation.sh
# For each mode of torch_activation.py: the summary's per-process tensor line, and a check that
# every process that printed `tensor PID` recorded its five tensors (allocations; their frees at
# exit are recorded too).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VT=$ROOT/.device/bin/vramtrace
VAL=$ROOT/scripts/validate
W=${WORK:-/tmp/vramtrace-validation/w}/torch-activation
mkdir -p "$W"
export PYTHONUNBUFFERED=1 VRAMTRACE_PYTHON_PROBE=$ROOT/probes/python/autostart
for mode in plain find_spec transformers thread spawn fork torchrun; do
  echo "=== $mode"
  rm -rf "$W/$mode"
  if [ "$mode" = torchrun ]; then
    cmd=(torchrun --nproc-per-node 2 "$VAL/torch_activation.py" torchrun)
  else
    cmd=(python3 "$VAL/torch_activation.py" "$mode")
  fi
  $VT run --quiet --out "$W/$mode" -- "${cmd[@]}" > "$W/$mode.out" 2> "$W/$mode.err"
  grep -i "vramtrace" "$W/$mode.err" | head -5
  $VT summary "$W/$mode" | grep -E "^process|  note:|  tensors:"
  $VT summary --json "$W/$mode" > "$W/$mode.json"
  python3 - "$W/$mode.out" "$W/$mode.json" "$mode" <<'PY'
import json, sys
pids = {int(l.split()[1]) for l in open(sys.argv[1]) if l.startswith("tensor ")}
procs = {p["pid"]: p for p in json.load(open(sys.argv[2]))["processes"]}
def allocations(p):  # tensors handed out; their frees at exit are recorded too (native capture)
    return sum((d.get("tensors") or {}).get("allocations", 0) for d in p.get("devices", []))
def ok(pid):
    p = procs.get(pid) or {}
    status = (p.get("tensor_capture") or {}).get("status", "")
    return status.startswith("recorded:") and allocations(p) == 5
bad = {p: (procs.get(p) or {}).get("tensor_capture") for p in pids if not ok(p)}
print(f"{sys.argv[3]}: {len(pids)} allocating process(es);",
      "OK (5 tensors each)" if pids and not bad else f"FAILED {bad}")
PY
done
