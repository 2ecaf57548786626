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
# SERVE_ARGS are added to every server's command line (as --no-cb-use-cuda-graph: the batches'
# two speeds are not CUDA graphs, docs/validation.md, 2026-12-02 morning).
# SERVE_CB_DEBUG=1 turns transformers' own "ContinuousBatchingLogger" to DEBUG in every server
# (`--log-level` does not reach it: it has its own handler and does not propagate): a line per
# step, `Scheduled: N, Waiting: W, Active: A. cum Q: q. cum KV: kv, free blocks: f`, whose
# timestamps give the step times and whose (q, kv) the step's shapes.
# SERVE_ENV (NAME=VALUE ...) is added to every server's environment. The likeliest cause of the
# slow batches, from reading transformers 5.17 and PyTorch 2.11 (not yet run): paged SDPA calls
# torch's scaled_dot_product_attention with a mask, which on sm90 with a recent cuDNN goes to
# cuDNN first, whose plan cache builds a new plan (tens of ms) for every (query, key) length
# pair not seen before, each decode step of a batch whose arrival pattern is new meeting new
# pairs; SERVE_ENV="TORCH_CUDNN_SDPA_DEPRIORITIZED=1" puts cuDNN last, for every mode alike.
# A batch takes 3 s or 7-10 s, and a slow batch finishes all its 16 requests together
# (serve_load.py prints when each finished; docs/validation.md, 2026-12-02 morning): the whole
# batch runs slower, not in waves. So the GPU's SM clock, power and utilisation are sampled
# every 200 ms during the rounds (nvidia-smi) and each batch's medians printed beside it, with
# the machine's CPU time by kind over the batch (/proc/stat; steal: the hypervisor's).
# With BENCH_CPUS (as 2-9) every server runs on those CPUs (only one works at a time) and the
# client on CLIENT_CPUS (as 10-15): unpinned, a process the scheduler placed on a slower core
# stays slower for rounds (docs/validation.md, 2026-12-02).
# Usage (on the GPU machine, after scripts/validate/prepare.sh here):
#   bash scripts/validate/serve_bench.sh [ROUNDS]       (default 6; WORK= as h200.sh)
# Prints each batch, a table, and the vramtrace server's probe line; keeps its trace in
# $W/serve-bench-vt.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VT=$ROOT/.device/bin/vramtrace
VAL=$ROOT/scripts/validate
W=${WORK:-/tmp/vramtrace-validation/w}
ROUNDS=${1:-6}
PORT=${SERVE_PORT:-8771}
MODES=(${MODES:-bare recorder vramtrace noprobe})
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

# The toggled server's switch: a thread that follows $TOG/turn (off, on or history, as
# bench_turns.py defines them) and acknowledges each change in $TOG/turn.ack.
TOG=$W/toggle-site
mkdir -p "$TOG"
echo on > "$TOG/turn"
rm -f "$TOG/turn.ack"
{ echo "$BASE_SITE"; echo "VAL = '$VAL'"; cat <<'PY'
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
} > "$TOG/sitecustomize.py"
turn() { # off|on|history: switch the toggled server and wait for its acknowledgement
  echo "$1" > "$TOG/turn"
  for _ in $(seq 500); do
    [ "$(cat "$TOG/turn.ack" 2>/dev/null)" = "$1" ] && return 0
    [ "$1" = on ] && [ ! -f "$TOG/turn.ack" ] && return 0
    sleep 0.02
  done
  echo "serve_bench: the toggled server did not switch to $1"; return 1
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
    toggled) pre=("$VT" run --quiet --out "$d" --); env=(PYTHONPATH=$TOG${PYTHONPATH:+:$PYTHONPATH}) ;;
    *) echo "serve_bench: unknown mode $mode"; exit 1 ;;
  esac
  env "${env[@]}" ${SERVE_ENV:-} VRAMTRACE_TORCH_PROBE_STATS=1 "${pin[@]}" "${pre[@]}" "$TF" serve "$M" --port "${port[$mode]}" \
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
for mode in "${MODES[@]}"; do
  warm "$mode" || { echo "serve_bench: the $mode server did not serve (log: $W/serve-bench-$mode.log)"; tail -5 "$W/serve-bench-$mode.log"; }
done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
rm -f "$W/serve-bench.tsv"
# A slot: a mode's batch, or one of the toggled server's three.
SLOTS=()
for mode in "${MODES[@]}"; do
  if [ "$mode" = toggled ]; then SLOTS+=(toggled:off toggled:on toggled:history); else SLOTS+=("$mode"); fi
done
n=${#SLOTS[@]}
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv,noheader,nounits \
  -lms 200 > "$W/serve-bench-gpu.csv" 2>/dev/null &
smi=$!
for r in $(seq 1 "$ROUNDS"); do
  for k in $(seq 0 $((n - 1))); do
    slot=${SLOTS[$(((k + r - 1) % n))]}
    mode=${slot%%:*}
    [ "$mode" = toggled ] && { turn "${slot#toggled:}" || break 2; }
    t0=$(date +%s.%N); cpu0=$(head -1 /proc/stat)
    line=$("${client[@]}" "$VAL/serve_load.py" "${port[$mode]}" "$M" --requests 16 --prompt-tokens 1500 \
      --max-tokens 96 --wait 10 --tag $((tag++)) | grep round)
    echo "round $r $slot: $line; GPU $(gpu_during "$t0" "$(date +%s.%N)"); CPUs $(cpu_during "$cpu0" "$(head -1 /proc/stat)")"
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
python3 - "$W/serve-bench.tsv" <<'PY'
import collections, math, statistics, sys
t = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    mode, r, s = line.split()
    t[mode][int(r)] = float(s)
bare = t.get("bare", {})
print(f"\nseconds per batch of 16; ratio: the mode over bare of the same round")
print("| mode | each round (s) | median (s) | median ratio | ratio range |")
print("| --- | --- | ---: | ---: | --- |")
for m, byround in t.items():
    v = [byround[r] for r in sorted(byround)]
    ok = [x for x in v if not math.isnan(x)]
    ratios = [byround[r] / bare[r] for r in sorted(byround)
              if r in bare and not math.isnan(byround[r]) and not math.isnan(bare[r])]
    rs = (f"{statistics.median(ratios):.3f} | {min(ratios):.3f} – {max(ratios):.3f}"
          if ratios else "? | ?")
    print(f"| {m} | {', '.join(f'{x:.3f}' for x in v)} | "
          f"{statistics.median(ok) if ok else float('nan'):.3f} | {rs} |")
off = t.get("toggled:off")


def over_paused(m, keep):
    """The toggled server's turn `m` over its paused batch, in each round where `keep(turn's
    time, paused's time)`."""
    return [t[m][r] / off[r] for r in sorted(t.get(m, {})) if r in off and keep(t[m][r], off[r])]


if off:
    print("\nthe toggled server's batches over its paused batch of the same round")
    print("| turn | each round | median ratio | rounds below 1 |")
    print("| --- | --- | ---: | ---: |")
    for m in ("toggled:on", "toggled:history"):
        ratios = over_paused(m, lambda a, b: not (math.isnan(a) or math.isnan(b)))
        if ratios:
            print(f"| {m} | {', '.join(f'{x:.3f}' for x in ratios)} | "
                  f"{statistics.median(ratios):.3f} | {sum(x < 1 for x in ratios)}/{len(ratios)} |")
# A batch takes about 3 s or 2.5 times that, in every mode (docs/validation.md, 2026-12-02
# morning): a batch over 1.5 times the median of all the call's batches counts as slow, and the
# fast ones are compared apart.
every = [x for byround in t.values() for x in byround.values() if not math.isnan(x)]
if every:
    cut = 1.5 * statistics.median(every)
    print(f"\nthe fast batches (under {cut:.2f} s, 1.5 times the median of all batches)")
    print("| mode | fast batches | median (s) | range (s) |")
    print("| --- | ---: | ---: | --- |")
    for m, byround in t.items():
        fast = [x for x in byround.values() if x < cut]
        if fast:
            print(f"| {m} | {len(fast)} of {len(byround)} | {statistics.median(fast):.3f} | "
                  f"{min(fast):.3f} – {max(fast):.3f} |")
    if off:
        print("\nthe toggled server, rounds whose two batches were both fast")
        print("| turn | rounds | median ratio to paused | rounds below 1 |")
        print("| --- | ---: | ---: | ---: |")
        for m in ("toggled:on", "toggled:history"):
            ratios = over_paused(m, lambda a, b: a < cut and b < cut)
            if ratios:
                print(f"| {m} | {len(ratios)} | {statistics.median(ratios):.3f} | "
                      f"{sum(x < 1 for x in ratios)}/{len(ratios)} |")
PY
for mode in vramtrace toggled; do
  [ -f "$W/serve-bench-$mode.log" ] && grep -h "torch probe\|VRAMTRACE_TORCH_PROBE_STATS" "$W/serve-bench-$mode.log" | tail -3
done
for mode in "${MODES[@]}"; do
  echo "$mode: steps logged (SERVE_CB_DEBUG=1): $(grep -c "Scheduled: " "$W/serve-bench-$mode.log")"
done
[ -d "$W/serve-bench-vramtrace" ] && rm -rf "$W/serve-bench-vt" && cp -r "$W/serve-bench-vramtrace" "$W/serve-bench-vt"
true
