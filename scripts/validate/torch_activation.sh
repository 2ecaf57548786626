#!/usr/bin/env bash
# The PyTorch probe starts however torch is reached (issue 19 item 1), on the GPU machine
# (layout as scripts/validate/h200.sh: .device/bin from scripts/validate/prepare.sh).
#   bash scripts/validate/torch_activation.sh
# For each mode of torch_activation.py: the summary's per-process tensor line, and a check that
# every process that printed `tensor PID` has `recorded: 5 tensor events`.
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
s = {p["pid"]: (p.get("tensor_capture") or {}).get("status") for p in json.load(open(sys.argv[2]))["processes"]}
bad = {p: s.get(p) for p in pids if s.get(p) != "recorded: 5 tensor events"}
print(f"{sys.argv[3]}: {len(pids)} allocating process(es);", "OK" if pids and not bad else f"FAILED {bad}")
PY
done
