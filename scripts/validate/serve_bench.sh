#!/usr/bin/env bash
# The cost of recording a real server (issue 19, item 3): `transformers serve --continuous-batching`
# with a random-weight dense Qwen3 (scripts/validate/hf_models.py), batches of 16 concurrent chat
# completions of 1,500 prompt tokens and 96 new tokens, timed by serve_load.py.
#
# One server per mode, all started at once (each given --cb-max-memory-percent CB_MEM, 0.15, so
# that they fit on one card together) and warmed up (a small batch, then WARMUP_BATCHES (2)
# full-size ones: a fresh server's first two are 2-3 times slower in every mode, docs/validation.md,
# 2026-12-01); then ROUNDS rounds in which each server in turn serves one batch while the others
# idle. The order rotates from round to round, and each traced batch is compared with the bare
# batch of its own round, so a machine whose speed drifts during the call moves both alike
# (sequential servers, one after another, could not resolve 3%). Every prompt of the call is
# distinct (serve_load.py --tag), so no server answers from a prefix it cached earlier.
# Modes (MODES, default "bare recorder vramtrace noprobe"):
#   bare       no recorder
#   recorder   PyTorch's torch.cuda.memory._record_memory_history(stacks="python"), switched on
#              by a sitecustomize after `import torch` (as a user would, in-process)
#   vramtrace  `vramtrace run` (native tensor capture with Python lines)
#   noprobe    `vramtrace run --no-torch-probe` (driver level only)
#   toggled    `vramtrace run`, one server serving three batches per round: toggled:off (tensor
#              capture paused, `vramtrace_torch.pause()`), toggled:on, toggled:history (paused,
#              PyTorch's recorder on), switched between batches by a thread of its sitecustomize
#              that follows a control file; its on and history batches are also divided by its
#              off batch of the same round (one server's own speed cancels out of that ratio,
#              docs/validation.md)
#              (TOGGLE_TURNS, as "off on", takes fewer turns: more rounds of vramtrace against
#              paused in the same time, once the recorder has been measured)
#   toggled2 ...  more toggled servers, each a process of its own: one server's ratio differs
#              from another's (medians 0.990 to 1.064 in three calls, docs/validation.md,
#              2026-12-02, day), so servers are drawn as well as rounds
# The tables at the end are serve_pool.py's (several calls' serve-bench.tsv pool the same way).
# SERVE_ARGS are added to every server's command line (as --no-cb-use-cuda-graph: the batches'
# two speeds are not CUDA graphs, docs/validation.md, 2026-12-02 morning).
# SERVE_CB_DEBUG=1 turns transformers' own "ContinuousBatchingLogger" to DEBUG in every server
# (`--log-level` does not reach it: it has its own handler and does not propagate): a line per
# step, `Scheduled: N, Waiting: W, Active: A. cum Q: q. cum KV: kv, free blocks: f`, whose
# timestamps give the step times and whose (q, kv) the step's shapes; each batch then prints its
# steps: their number, the median and 90th-percentile gap between them, and the time in gaps over
# 100 ms (a slow batch whose steps are all slower, or a few that stall).
# SERVE_ENV (NAME=VALUE ...) is added to every server's environment; by default
# TORCH_CUDNN_SDPA_DEPRIORITIZED=1 (SERVE_ENV= for none). Paged SDPA calls torch's
# scaled_dot_product_attention with a mask, which on sm90 with a recent cuDNN goes to cuDNN
# first, whose plan cache builds a plan for every (query, key) length pair not seen before. With
# cuDNN first, 15 of the morning's 68 batches (and a fresh server's first ones) took 2.5 times as
# long, in every mode; with it last, none of 288 did (docs/validation.md, 2026-12-02, day). A
# slow batch finished all its 16 requests together (serve_load.py prints when each finished):
# the whole batch ran slower, not in waves. The GPU's SM clock, power and utilisation are
# sampled every 200 ms during the rounds (nvidia-smi) and each batch's medians printed beside
# it, with the machine's CPU time by kind over the batch (/proc/stat; steal: the hypervisor's).
# With BENCH_CPUS (as 2-9) every server runs on those CPUs (only one works at a time) and the
# client on CLIENT_CPUS (as 10-15): unpinned, a process the scheduler placed on a slower core
# stays slower for rounds (docs/validation.md, 2026-12-02).
# Usage (on the GPU machine, after scripts/validate/prepare.sh here):
#   bash scripts/validate/serve_bench.sh [ROUNDS]       (default 6; WORK= as h200.sh)
# Prints each batch, serve_pool.py's tables and, with SERVE_CB_DEBUG=1, each recording server's
# tensors a step (its trace's blocks over the steps it took while recording: what a step's cost
# is divided by to give a cost per tensor); keeps the vramtrace server's trace in
# $W/serve-bench-vt.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VT=$ROOT/.device/bin/vramtrace
VAL=$ROOT/scripts/validate
W=${WORK:-/tmp/vramtrace-validation/w}
ROUNDS=${1:-6}
PORT=${SERVE_PORT:-8771}
MODES=(${MODES:-bare recorder vramtrace noprobe})
TURNS=(${TOGGLE_TURNS:-off on history})
for t in "${TURNS[@]}"; do
  case $t in off | on | history) ;; *) echo "serve_bench: TOGGLE_TURNS: no turn '$t' (off, on, history)"; exit 2 ;; esac
done
export PYTHONUNBUFFERED=1
mkdir -p "$W" "${HF_HUB_CACHE:-$HOME/.cache/huggingface/hub}"
[ -f "$W/models/dense/config.json" ] || python3 "$VAL/hf_models.py" "$W/models" dense || exit 1
M=$W/models/dense
TF=$(command -v transformers 2>/dev/null || echo "$(dirname "$(python3 -c 'import sys; print(sys.executable)')")/transformers")
if ! "$TF" serve --help 2>/dev/null | grep -q -- --cb-max-memory-percent; then
  echo "serve_bench: this transformers serve has no --cb-max-memory-percent: the servers cannot share the card"
  exit 1
fi
# The recorder's switch: a sitecustomize that turns PyTorch's history on once torch is imported.
# Every server's sitecustomize starts with BASE_SITE; bare, vramtrace and noprobe get it alone.
BASE_SITE='import logging, os
if os.environ.get("SERVE_CB_DEBUG") == "1":
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.DEBUG)'
export SERVE_CB_DEBUG=${SERVE_CB_DEBUG:-0}
BASE=$W/base-site
mkdir -p "$BASE"
echo "$BASE_SITE" > "$BASE/sitecustomize.py"
REC=$W/recorder-site
mkdir -p "$REC"
{ echo "$BASE_SITE"; cat <<'PY'
import torch
torch.cuda.memory._record_memory_history(stacks="python")
PY
} > "$REC/sitecustomize.py"

# A toggled server's switch: a thread of its sitecustomize that follows the file `turn` beside
# it (off, on or history, as bench_turns.py defines them) and acknowledges each change in
# `turn.ack`. Each toggled server (toggled, toggled2, ...) has a directory of its own.
TOG_SITE=$(cat <<PYHEAD
$BASE_SITE
VAL = '$VAL'
PYHEAD
cat <<'PY'
import os
import sys
import threading
import time

import torch

sys.path.insert(0, VAL)
import bench_turns  # noqa: E402

sys.path.remove(VAL)
CTL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "turn")


def follow():
    now = "on"
    while True:
        try:
            with open(CTL) as f:
                want = f.read().strip() or now
        except OSError:
            want = now
        if want != now:
            if "vramtrace_torch" not in sys.modules:
                raise SystemExit("serve_bench: the toggled server has no PyTorch probe to pause")
            bench_turns.leave(now)
            bench_turns.enter(want, f"serve_bench: a batch {want}")
            now = want
            with open(CTL + ".ack", "w") as f:
                f.write(now)
        time.sleep(0.02)


threading.Thread(target=follow, daemon=True, name="serve_bench toggle").start()
PY
)
tog_dir() { echo "$W/toggle-site-$1"; } # MODE: where that toggled server's sitecustomize is
turn() { # MODE off|on|history: switch that toggled server and wait for its acknowledgement
  local d; d=$(tog_dir "$1")
  echo "$2" > "$d/turn"
  for _ in $(seq 500); do
    [ "$(cat "$d/turn.ack" 2>/dev/null)" = "$2" ] && return 0
    [ "$2" = on ] && [ ! -f "$d/turn.ack" ] && return 0
    sleep 0.02
  done
  echo "serve_bench: the $1 server did not switch to $2"; return 1
}

gpu_during() { # T0 T1 (seconds since the epoch): the GPU's median SM clock, power, use between them
  python3 - "$W/serve-bench-gpu.csv" "$1" "$2" <<'PY'
import datetime, statistics, sys
t0, t1 = float(sys.argv[2]), float(sys.argv[3])
rows = []
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(",")]
    try:
        t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        if t0 <= t <= t1:
            rows.append([float(x) for x in f[1:4]])
    except (ValueError, IndexError):
        continue
if rows:
    sm, w, use = (statistics.median(c) for c in zip(*rows))
    print(f"SM {sm:.0f} MHz, {w:.0f} W, {use:.0f}% busy ({len(rows)} samples)")
else:
    print("not sampled")
PY
}

cpu_during() { # two `cpu` lines of /proc/stat: the machine's CPU time between them, by kind
  python3 - "$1" "$2" <<'PY'
import sys
a, b = ([int(x) for x in line.split()[1:9]] for line in sys.argv[1:3])
d = [y - x for x, y in zip(a, b)]
total = sum(d) or 1
user, nice, system, idle, iowait, irq, softirq, steal = (100 * x / total for x in d)
print(f"user {user + nice:.0f}%, system {system + irq + softirq:.0f}%, idle {idle + iowait:.0f}%, "
      f"steal {steal:.1f}%")
PY
}

steps_during() { # LOG T0 T1: transformers' step lines (SERVE_CB_DEBUG=1) between T0 and T1, timed
  python3 - "$1" "$2" "$3" <<'PY'
import datetime, statistics, sys
t0, t1 = float(sys.argv[2]), float(sys.argv[3])
ts = []
for line in open(sys.argv[1], errors="replace"):
    if "Scheduled: " not in line:
        continue
    try:  # logging's asctime: "2026-12-02 06:55:01,123"
        t = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        continue
    if t0 <= t <= t1:
        ts.append(t)
gaps = [1000 * (b - a) for a, b in zip(ts, ts[1:])]
if len(gaps) > 1:
    q = statistics.quantiles(gaps, n=10, method="inclusive")
    print(f"{len(ts)} steps, gap median {statistics.median(gaps):.1f} ms, p90 {q[-1]:.1f} ms, "
          f"max {max(gaps):.0f} ms, {sum(g for g in gaps if g > 100) / 1000:.2f} s in gaps over 100 ms")
else:
    print("no steps logged")
PY
}

declare -A port pid
pin=(); client=(python3)
[ -n "${BENCH_CPUS:-}" ] && pin=(taskset -c "$BENCH_CPUS")
[ -n "${CLIENT_CPUS:-}" ] && client=(taskset -c "$CLIENT_CPUS" python3)
i=0
for mode in "${MODES[@]}"; do
  port[$mode]=$((PORT + i)); i=$((i + 1))
  d=$W/serve-bench-$mode
  rm -rf "$d"
  pre=(); env=(PYTHONPATH=$BASE${PYTHONPATH:+:$PYTHONPATH})
  case $mode in
    bare) ;;
    recorder) env=(PYTHONPATH=$REC${PYTHONPATH:+:$PYTHONPATH}) ;;
    vramtrace) pre=("$VT" run --quiet --out "$d" --) ;;
    noprobe) pre=("$VT" run --quiet --no-torch-probe --out "$d" --) ;;
    toggled*)
      tog=$(tog_dir "$mode"); rm -rf "$tog"; mkdir -p "$tog"
      echo "$TOG_SITE" > "$tog/sitecustomize.py"; echo on > "$tog/turn"
      pre=("$VT" run --quiet --out "$d" --); env=(PYTHONPATH=$tog${PYTHONPATH:+:$PYTHONPATH}) ;;
    *) echo "serve_bench: unknown mode $mode"; exit 1 ;;
  esac
  env "${env[@]}" ${SERVE_ENV-TORCH_CUDNN_SDPA_DEPRIORITIZED=1} VRAMTRACE_TORCH_PROBE_STATS=1 "${pin[@]}" "${pre[@]}" "$TF" serve "$M" --port "${port[$mode]}" \
    --continuous-batching --cb-max-memory-percent "${CB_MEM:-0.15}" ${SERVE_ARGS:-} > "$W/serve-bench-$mode.log" 2>&1 &
  pid[$mode]=$!
done
tag=0
warm() { # MODE
  local m=$1
  "${client[@]}" "$VAL/serve_load.py" "${port[$m]}" "$M" --requests 4 --prompt-tokens 200 --max-tokens 8 \
    --wait 300 --tag $((tag++)) | grep -v round
  "${client[@]}" "$VAL/serve_load.py" "${port[$m]}" "$M" --requests 16 --prompt-tokens 1500 --max-tokens 96 \
    --rounds "${WARMUP_BATCHES:-2}" --wait 10 --tag $((tag++)) | sed "s/^/  $m warm-up: /"
}
records() { case $1 in vramtrace|toggled*) return 0 ;; esac; return 1; } # MODE: a recording server
# The steps each recording server took while it recorded tensors (its warm-up, then its
# vramtrace or toggled:on batches), for the tensors a step at the end.
declare -A onsteps
add_steps() { # MODE STEPS (a line of steps_during): add its steps to onsteps[MODE]
  case $2 in *" steps,"*) onsteps[$1]=$(( ${onsteps[$1]:-0} + ${2%% steps,*} )) ;; esac
}
for mode in "${MODES[@]}"; do
  t0=$(date +%s.%N)
  warm "$mode" || { echo "serve_bench: the $mode server did not serve (log: $W/serve-bench-$mode.log)"; tail -5 "$W/serve-bench-$mode.log"; }
  if [ "$SERVE_CB_DEBUG" = 1 ] && records "$mode"; then
    add_steps "$mode" "$(steps_during "$W/serve-bench-$mode.log" "$t0" "$(date +%s.%N)")"
  fi
done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
rm -f "$W/serve-bench.tsv"
# A slot: a mode's batch, or one of a toggled server's three.
SLOTS=()
for mode in "${MODES[@]}"; do
  case $mode in
    toggled*) for t in "${TURNS[@]}"; do SLOTS+=("$mode:$t"); done ;;
    *) SLOTS+=("$mode") ;;
  esac
done
n=${#SLOTS[@]}
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv,noheader,nounits \
  -lms 200 > "$W/serve-bench-gpu.csv" 2>/dev/null &
smi=$!
for r in $(seq 1 "$ROUNDS"); do
  for k in $(seq 0 $((n - 1))); do
    slot=${SLOTS[$(((k + r - 1) % n))]}
    mode=${slot%%:*}
    case $slot in toggled*) turn "$mode" "${slot#*:}" || break 2 ;; esac
    t0=$(date +%s.%N); cpu0=$(head -1 /proc/stat)
    line=$("${client[@]}" "$VAL/serve_load.py" "${port[$mode]}" "$M" --requests 16 --prompt-tokens 1500 \
      --max-tokens 96 --wait 10 --tag $((tag++)) | grep round)
    t1=$(date +%s.%N)
    echo "round $r $slot: $line; GPU $(gpu_during "$t0" "$t1"); CPUs $(cpu_during "$cpu0" "$(head -1 /proc/stat)")"
    if [ "$SERVE_CB_DEBUG" = 1 ]; then
      steps=$(steps_during "$W/serve-bench-$mode.log" "$t0" "$t1")
      echo "  steps: $steps"
      case $slot in vramtrace|*:on) add_steps "$mode" "$steps" ;; esac
    fi
    t=$(echo "$line" | sed -n 's/.* in \([0-9.]*\) s.*/\1/p')
    case "$line" in *" 0 failed"*) ;; *) t="" ;; esac
    echo "$slot $r ${t:-nan}" >> "$W/serve-bench.tsv"
  done
done
kill "$smi" 2>/dev/null
for mode in "${MODES[@]}"; do kill -INT "${pid[$mode]}" 2>/dev/null; done
sleep 5
for mode in "${MODES[@]}"; do kill -KILL "${pid[$mode]}" 2>/dev/null; wait "${pid[$mode]}" 2>/dev/null; done
pkill -KILL -f "transformers serve" 2>/dev/null
python3 "$VAL/serve_pool.py" --rounds "$W/serve-bench.tsv"
for mode in "${MODES[@]}"; do
  records "$mode" || continue
  [ -f "$W/serve-bench-$mode.log" ] && grep -h "torch probe\|VRAMTRACE_TORCH_PROBE_STATS" "$W/serve-bench-$mode.log" | tail -3
done
for mode in "${MODES[@]}"; do
  echo "$mode: steps logged (SERVE_CB_DEBUG=1): $(grep -c "Scheduled: " "$W/serve-bench-$mode.log")"
done
# Tensors a step, from the trace: every block the caching allocator handed out while the server
# recorded, over the steps it took then (an upper bound: its start-up's blocks are among them).
for mode in "${!onsteps[@]}"; do
  [ -d "$W/serve-bench-$mode" ] && [ "${onsteps[$mode]}" -gt 0 ] || continue
  n=$("$VT" summary "$W/serve-bench-$mode" 2>/dev/null |
    sed -n "s/.*tensors (PyTorch's caching allocator.*): \([0-9]*\) allocations.*/\1/p" |
    awk '{s += $1} END {print s + 0}')
  echo "$mode: $n tensors handed out while recording, over ${onsteps[$mode]} steps:" \
    "$((n / onsteps[$mode])) a step (at most)"
done
[ -d "$W/serve-bench-vramtrace" ] && rm -rf "$W/serve-bench-vt" && cp -r "$W/serve-bench-vramtrace" "$W/serve-bench-vt"
true
