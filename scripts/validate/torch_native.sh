#!/usr/bin/env bash
# Native tensor capture on the GPU (issue 19, items 2 and 3). Layout as scripts/validate/h200.sh:
# .device/bin from scripts/validate/prepare.sh (here), then, on the GPU machine:
#   bash scripts/validate/torch_native.sh [check] [cost] [decode]     (default: all three)
# Steps:
#   check   torch_native_check.py under `vramtrace run`: every tensor's block and requested
#           bytes and Python line against PyTorch's own figures (allocated_bytes moves, the
#           _record_memory_history snapshot), one thread then two at once; prints OK/FAILED.
#   cost    per tensor (`torch.empty(1 MiB); del`, best of 5 × 20,000): bare,
#           _record_memory_history(stacks="python"), vramtrace with the callbacks
#           (VRAMTRACE_TORCH_CAPTURE=callbacks), vramtrace native; 3 alternating rounds.
#   decode  decode_bench.py (transformers, random weights, 8 layers, 1,024-token prompt, 128 new
#           tokens; wall time of generate, best of 3 after a same-shape warm-up): bare, _record_memory_history(stacks="python"),
#           `vramtrace run` (native), `vramtrace run` with the callbacks, `vramtrace run
#           --no-torch-probe`; 3 alternating rounds, then a table. DECODE_CONFIG=path/config.json
#           uses that model's shape (8 layers) instead of the built-in Llama one.
# Each vramtrace run prints the probe's own line (VRAMTRACE_TORCH_PROBE_STATS=1): `capture=native`
# or `capture=callbacks (why)`; a run whose capture is not the one asked for is marked WRONG.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VT=$ROOT/.device/bin/vramtrace
VAL=$ROOT/scripts/validate
W=${WORK:-/tmp/vramtrace-validation/w}/torch-native
mkdir -p "$W"
export PYTHONUNBUFFERED=1 VRAMTRACE_PYTHON_PROBE=$ROOT/probes/python/autostart VRAMTRACE_TORCH_PROBE_STATS=1
ROUNDS=${ROUNDS:-3}
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'

# traced MODE OUT CMD...: CMD under vramtrace run; MODE native|callbacks|off.
traced() {
  local mode=$1 out=$2
  shift 2
  rm -rf "$out"
  local capture=auto flag=()
  [ "$mode" = callbacks ] && capture=callbacks
  [ "$mode" = off ] && flag=(--no-torch-probe)
  VRAMTRACE_TORCH_CAPTURE=$capture $VT run --quiet "${flag[@]}" --out "$out" -- "$@" 2> "$out.err"
  local rc=$?
  grep "torch probe" "$out.err" | sed 's/^/  /'
  if [ "$mode" != off ] && ! grep -q "capture=$mode" "$out.err"; then echo "  WRONG: asked for $mode capture"; fi
  return $rc
}

check() {
  traced native "$W/check" python3 "$VAL/torch_native_check.py" "$W/check-truth.json" || return 1
  $VT events --stacks "$W/check" | python3 "$VAL/torch_native_compare.py" "$W/check-truth.json"
}

cost() {
  local r m
  for r in $(seq "$ROUNDS"); do
    echo "round $r"
    python3 "$VAL/torch_probe_cost.py" bare
    python3 "$VAL/torch_probe_cost.py" history_python
    traced callbacks "$W/cost" python3 "$VAL/torch_probe_cost.py" probe | sed 's/probe/probe_callbacks/'
    traced native "$W/cost" python3 "$VAL/torch_probe_cost.py" probe | sed 's/probe/probe_native/'
  done
  rm -rf "$W/cost"
}

decode() {
  local r m t cfg=()
  [ -n "${DECODE_CONFIG:-}" ] && cfg=(--config "$DECODE_CONFIG")
  : > "$W/decode.txt"
  for r in $(seq "$ROUNDS"); do
    for m in ${DECODE_MODES:-bare history vramtrace callbacks no_torch_probe}; do
      case $m in
        bare) t=$(python3 "$VAL/decode_bench.py" "${cfg[@]}") ;;
        history) t=$(python3 "$VAL/decode_bench.py" --history "${cfg[@]}") ;;
        vramtrace) t=$(traced native "$W/decode-$m" python3 "$VAL/decode_bench.py" "${cfg[@]}") ;;
        # Native capture without the Python lines: what the frame walk costs of the above.
        vramtrace_nopy) t=$(VRAMTRACE_PYTHON=0 traced native "$W/decode-$m" python3 "$VAL/decode_bench.py" "${cfg[@]}") ;;
        # Native capture timing its own steps (the stats line's self_ns: tracker, libc10's
        # report, the preload's report, of which the Python frames; mean ns and count).
        vramtrace_selftime) t=$(VRAMTRACE_SELF_TIME=1 traced native "$W/decode-$m" python3 "$VAL/decode_bench.py" "${cfg[@]}") ;;
        callbacks) t=$(traced callbacks "$W/decode-$m" python3 "$VAL/decode_bench.py" "${cfg[@]}") ;;
        no_torch_probe) t=$(traced off "$W/decode-$m" python3 "$VAL/decode_bench.py" "${cfg[@]}") ;;
      esac
      local size=""
      [ -d "$W/decode-$m" ] && size=" trace_bytes $(du -sb "$W/decode-$m" | cut -f1)"
      echo "round $r $m $(echo "$t" | tr '\n' ' ')$size" | tee -a "$W/decode.txt"
    done
  done
  python3 - "$W/decode.txt" <<'PY'
import re, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.search(r"round (\d+) (\S+) .*generate_s ([\d.]+)", line)
    if m:
        runs.setdefault(m.group(2), []).append(float(m.group(3)))
import statistics
bare = min(runs.get("bare", [float("nan")]))
mbare = statistics.median(runs.get("bare", [float("nan")]))
print("\n| mode | generate (s), best of each round's repeats | best | best / best bare | median / median bare |")
print("| --- | --- | ---: | ---: | ---: |")
for mode, ts in runs.items():
    print(f"| {mode} | {', '.join(f'{t:.2f}' for t in ts)} | {min(ts):.2f} | {min(ts) / bare:.3f} "
          f"| {statistics.median(ts) / mbare:.3f} |")
PY
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(check cost decode)
for s in "${steps[@]}"; do
  echo; echo "=== $s ($(date +%T))"
  "$s" || echo "!!! STEP $s FAILED"
done
