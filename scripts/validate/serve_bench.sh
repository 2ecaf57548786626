#!/usr/bin/env bash
# The cost of recording a real server (issue 19, item 3): `transformers serve --continuous-batching`
# with a random-weight dense Qwen3 (scripts/validate/hf_models.py), one batch of 16 concurrent
# chat completions of 1,500 prompt tokens and 96 new tokens, timed by serve_load.py after a
# small warm-up and WARMUP_BATCHES (2) untimed full-size batches: BATCHES such batches (default 3) one after the other per server, the server's
# figure being their median. Modes (MODES, default "bare recorder vramtrace"), alternated within
# each round, each a fresh server:
#   bare       no recorder
#   recorder   PyTorch's torch.cuda.memory._record_memory_history(stacks="python"), switched on
#              by a sitecustomize after `import torch` (as a user would, in-process)
#   vramtrace  `vramtrace run` (native tensor capture with Python lines)
#   noprobe    `vramtrace run --no-torch-probe` (driver level only)
# Usage (on the GPU machine, after scripts/validate/prepare.sh here):
#   bash scripts/validate/serve_bench.sh [ROUNDS]       (default 3; WORK= as h200.sh)
# Prints one line per server and a table; keeps the last vramtrace trace in $W/serve-bench-vt.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VT=$ROOT/.device/bin/vramtrace
VAL=$ROOT/scripts/validate
W=${WORK:-/tmp/vramtrace-validation/w}
ROUNDS=${1:-3}
PORT=${SERVE_PORT:-8771}
export PYTHONUNBUFFERED=1
mkdir -p "$W" "${HF_HUB_CACHE:-$HOME/.cache/huggingface/hub}"
[ -f "$W/models/dense/config.json" ] || python3 "$VAL/hf_models.py" "$W/models" dense || exit 1
M=$W/models/dense
TF=$(command -v transformers 2>/dev/null || echo "$(dirname "$(python3 -c 'import sys; print(sys.executable)')")/transformers")
# The recorder's switch: a sitecustomize that turns PyTorch's history on once torch is imported.
REC=$W/recorder-site
mkdir -p "$REC"
cat > "$REC/sitecustomize.py" <<'PY'
import torch
torch.cuda.memory._record_memory_history(stacks="python")
PY

one() { # MODE ROUND
  local mode=$1 r=$2 d=$W/serve-bench-$1 log=$W/serve-bench-$1-$2.log
  local -a pre=()
  rm -rf "$d"
  case $mode in
    bare) ;;
    recorder) export PYTHONPATH_SAVE=${PYTHONPATH:-}; export PYTHONPATH=$REC${PYTHONPATH:+:$PYTHONPATH} ;;
    vramtrace) pre=("$VT" run --quiet --out "$d" --) ;;
    noprobe) pre=("$VT" run --quiet --no-torch-probe --out "$d" --) ;;
  esac
  "${pre[@]}" "$TF" serve "$M" --port "$PORT" --continuous-batching > "$log" 2>&1 &
  local pid=$!
  [ "$mode" = recorder ] && export PYTHONPATH=$PYTHONPATH_SAVE
  python3 "$VAL/serve_load.py" "$PORT" "$M" --requests 4 --prompt-tokens 200 --max-tokens 8 --wait 240 > /dev/null
  # A fresh server's first two full-size batches are 2-3 times slower than the next ones in
  # every mode (docs/validation.md, 2026-12-01): WARMUP_BATCHES (2) of them are not timed.
  python3 "$VAL/serve_load.py" "$PORT" "$M" --requests 16 --prompt-tokens 1500 --max-tokens 96 \
    --rounds "${WARMUP_BATCHES:-2}" --wait 10 > /dev/null
  local line
  line=$(python3 "$VAL/serve_load.py" "$PORT" "$M" --requests 16 --prompt-tokens 1500 --max-tokens 96 \
    --rounds "${BATCHES:-3}" --wait 10 | grep round)
  echo "$line" | sed "s/^/$mode round $r: /"
  local times
  times=$(echo "$line" | sed -n 's/.* in \([0-9.]*\) s.*/\1/p' | sort -n | tr '\n' ' ')
  echo "$mode $r $(echo $times | awk '{print $(int((NF + 1) / 2))}') $times" >> "$W/serve-bench.tsv"
  pkill -INT -f "transformers serve"; sleep 3; pkill -KILL -f "transformers serve"
  wait $pid 2>/dev/null
  sleep 1
}

rm -f "$W/serve-bench.tsv"
for r in $(seq 1 "$ROUNDS"); do
  for mode in ${MODES:-bare recorder vramtrace}; do one $mode $r; done
done
python3 - "$W/serve-bench.tsv" <<'PY'
import sys, collections, statistics
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 3:
        t[f[0]].append(float(f[2]))
bare = t.get("bare")
print("| mode | per server: median batch (s), each round | best | median | best / best bare | median / median bare |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for m in ("bare", "recorder", "vramtrace", "noprobe"):
    v = t.get(m)
    if not v:
        continue
    rb = f"{min(v) / min(bare):.3f}" if bare else "?"
    rm = f"{statistics.median(v) / statistics.median(bare):.3f}" if bare else "?"
    print(f"| {m} | {', '.join(f'{x:.3f}' for x in v)} | {min(v):.3f} | {statistics.median(v):.3f} | {rb} | {rm} |")
PY
[ -d "$W/serve-bench-vramtrace" ] && cp -r "$W/serve-bench-vramtrace" "$W/serve-bench-vt"
