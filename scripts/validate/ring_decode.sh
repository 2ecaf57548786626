#!/usr/bin/env bash
# Bytes per decode step, and a bounded trace (issue 19 item 4), on the GPU machine (layout as
# scripts/validate/h200.sh).   bash scripts/validate/ring_decode.sh [MODEL_TYPE | CONFIG.json]
# Two unbounded runs (64 and 192 decode steps): bytes per step = the difference in bytes of
# records over 128 steps, and tensor events per step likewise; then a budget (RING_BUDGET, default 8 MiB) on 192 steps: the
# file size, the lost range and the flight record (vramtrace snapshot while it runs is in
# tests/ring_cli.rs; here the budget only).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VT=$ROOT/.device/bin/vramtrace
VAL=$ROOT/scripts/validate
W=${WORK:-/tmp/vramtrace-validation/w}/ring-decode
MT=${1:-llama}
if [ -f "$MT" ]; then MODEL=(--config "$MT"); else MODEL=(--model-type "$MT"); fi
mkdir -p "$W"
export PYTHONUNBUFFERED=1 VRAMTRACE_PYTHON_PROBE=$ROOT/probes/python/autostart
for steps in 64 192; do
  rm -rf "$W/n$steps"
  $VT run --quiet --max-size 0 --out "$W/n$steps" -- python3 "$VAL/ring_decode.py" $steps "${MODEL[@]}" 2>&1 | tail -2
  du -b "$W/n$steps"/*.vtr
  $VT summary --json "$W/n$steps" > "$W/n$steps.json"
done
python3 - "$W" <<'PY'
import glob, json, os, sys
w = sys.argv[1]
def used(path):
    # Bytes of records in the file's blocks (the file itself is as long as its reservation).
    data = open(path, "rb").read()
    off, total = data.find(b"VTB2"), 0
    while off >= 0 and off + 32 <= len(data):
        blk = data[off:off + 65536]
        i = 32
        while blk[:4] == b"VTB2" and i < len(blk) and blk[i]:
            n, s, j = 0, 0, i + 1
            while True:
                c = blk[j]; j += 1; n |= (c & 0x7F) << s; s += 7
                if c < 0x80: break
            i = j + n
        total += i - 32 if blk[:4] == b"VTB2" else 0
        off += 65536
    return total
def size(n): return sum(used(f) for f in glob.glob(f"{w}/n{n}/*.vtr"))
def events(n): return sum((p.get("tensor_capture") or {}).get("events", 0) for p in json.load(open(f"{w}/n{n}.json"))["processes"])
db, de = size(192) - size(64), events(192) - events(64)
print(f"per decode step: {db / 128:,.0f} bytes, {de / 128:,.1f} tensor events, {db / max(de, 1):.1f} bytes per event")
PY
rm -rf "$W/budget"
$VT run --quiet --max-size "${RING_BUDGET:-8MiB}" --out "$W/budget" -- python3 "$VAL/ring_decode.py" 192 "${MODEL[@]}" 2>&1 | tail -2
du -b "$W/budget"/*.vtr
$VT summary "$W/budget" | grep -E "^process|note:|tensors:|lost" | head -20
