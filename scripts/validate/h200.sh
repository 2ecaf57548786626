#!/usr/bin/env bash
# One whole validation run on a GPU machine (the H200 in docs/validation.md).
#
# Expects, relative to the repository root:
#   .device/bin/  vramtrace, vramtrace-workload, libvramtrace_preload.so, and the C probes
#                 procaddr, dlopen_dlsym, bench_loop (built by scripts/validate/prepare.sh)
#   .device/whl/  fla_core-0.6.0-py3-none-any.whl
# Writes every trace, log and comparison under $WORK (default /tmp/vramtrace-validation/w) and
# tars it into $OUT/results-<first step>.tar.gz.
# Each step runs on its own; a failing step is logged and the run goes on.
#
# Usage: scripts/validate/h200.sh [STEP...]   (default: every step; `pack` alone: only the tar)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$ROOT/.device/bin
VT=$BIN/vramtrace
WL=$BIN/vramtrace-workload
OUT=${OUT:-/tmp/vramtrace-validation}
W=${WORK:-/tmp/vramtrace-validation/w}
# llama.cpp's source, build and GGUFs (issue 33), outside what is packed.
LL=${LLAMA_DIR:-/tmp/vramtrace-llama}
mkdir -p "$W" "$OUT"
CFG=$ROOT/samples/models/Qwen3.6-27B/config.json
VAL=$ROOT/scripts/validate
export PYTHONUNBUFFERED=1
# Leave NVLink multicast off (shared machines).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

step() { echo; echo "=== $1 ($(date +%T))"; }
run_step() {
  local name=$1
  shift
  step "$name"
  if ! "$@"; then echo "!!! STEP $name FAILED"; fi
}

setup() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$ROOT"/.device/whl/*.whl
  export PYTHONPATH=/tmp/site
  python3 -c 'import fla; print("fla", fla.__version__)'
  $VT --version
}

preload_probes() {
  rm -rf "$W/procaddr"
  VRAMTRACE_DIR=$W/procaddr LD_PRELOAD=$BIN/libvramtrace_preload.so "$BIN/procaddr" | tee "$W/procaddr.out"
  echo "routed-by-name notes: $(cat "$W"/procaddr/*.vtr | grep -a -c 'routed by name')"
  $VT summary "$W/procaddr"
  $VT events "$W/procaddr" > "$W/procaddr.jsonl"
  rm -rf "$W/dlopen"
  VRAMTRACE_DIR=$W/dlopen LD_PRELOAD=$BIN/libvramtrace_preload.so "$BIN/dlopen_dlsym" | tee "$W/dlopen.out"
  $VT events "$W/dlopen" | head -20
}

torch_modes() {
  local mode env
  for mode in default expandable async nocache; do
    case $mode in
      default) env=() ;;
      expandable) env=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) ;;
      async) env=(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) ;;
      nocache) env=(PYTORCH_NO_CUDA_MEMORY_CACHING=1) ;;
    esac
    echo "--- torch mode $mode"
    env "${env[@]}" $VT run --out "$W/torch-$mode" -- python3 "$VAL/torch_capture.py" "$W/torch-$mode.json" 2> "$W/torch-$mode.stderr"
    echo "exit $?"; cat "$W/torch-$mode.stderr"
    $VT events "$W/torch-$mode" > "$W/torch-$mode.jsonl"
    python3 "$VAL/compare_snapshot.py" "$W/torch-$mode.json" "$W/torch-$mode.jsonl"
  done
  echo "--- summary with stacks (caching off)"
  $VT summary --frames 14 "$W/torch-nocache" | tee "$W/torch-nocache.summary"
  $VT summary --json "$W/torch-nocache" > "$W/torch-nocache.summary.json"
  $VT events --stacks "$W/torch-nocache" > "$W/torch-nocache.stacks.jsonl"
}

nvtx_and_processes() {
  cat > /tmp/nvtx_mp.py <<'EOF'
import os, sys, torch, torch.multiprocessing as mp
def worker(rank):
    torch.cuda.set_device(0)
    x = torch.empty((rank + 1) << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("worker", os.getpid(), "ppid", os.getppid(), x.numel(), flush=True)
if __name__ == "__main__":
    torch.cuda.nvtx.range_push("fwd")
    a = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.nvtx.range_push("attention")
    b = torch.empty(5 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_pop()
    c = torch.empty(7 << 20, dtype=torch.uint8, device="cuda")
    print("parent", os.getpid(), flush=True)
    mp.spawn(worker, nprocs=2, join=True)
EOF
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 $VT run --out "$W/nvtx-mp" -- python3 /tmp/nvtx_mp.py
  $VT events "$W/nvtx-mp" | python3 -c '
import json, sys
for l in sys.stdin:
    e = json.loads(l)
    if e["kind"] == "alloc" and e["size"] in (3<<20, 5<<20, 7<<20, 1<<20, 2<<20):
        print(e["pid"], e["api"], e["size"], e.get("label"))'
  $VT summary --json "$W/nvtx-mp" | python3 -c '
import json, sys
s = json.load(sys.stdin)
for p in s["processes"]:
    print("pid", p["pid"], "ppid", p["ppid"], " ".join(p["command"])[:80], [(d["device"], d["peak_bytes"]) for d in p["devices"]])'
}

fla_shapes() {
  export PYTHONPATH=/tmp/site
  local i=0 shape
  # name | model_vs_torch args | vramtrace model shape args
  while IFS='|' read -r name targs margs; do
    [ -z "$name" ] && continue
    echo "--- gdn $name"
    $VT model "$CFG" --variant fla-0.6.0 $margs --json > "$W/model-gdn-$name.json"
    timeout 300 python3 "$VAL/model_vs_torch.py" --kernel gdn $targs --compare "$W/model-gdn-$name.json" > "$W/snap-gdn-$name.jsonl"
    echo "snapshot verdict: $(tail -1 "$W/snap-gdn-$name.jsonl")"
    grep '"compare"' "$W/snap-gdn-$name.jsonl" | head -2
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 $VT run --quiet --out "$W/trace-gdn-$name" -- \
      python3 "$VAL/model_vs_torch.py" --kernel gdn $targs > /dev/null
    $VT compare "$W/trace-gdn-$name" --model "$CFG" --variant fla-0.6.0 $margs | tee "$W/compare-gdn-$name.txt"
    $VT compare "$W/trace-gdn-$name" --model "$CFG" --variant fla-0.6.0 $margs --json > "$W/compare-gdn-$name.json"
  done <<'EOF'
t4128|--seqlens 4128 --hk 16 --hv 48 --k 128 --v 128|--tokens 4128
t1000-kv|--seqlens 1000 --hk 8 --hv 24 --k 128 --v 64|--tokens 1000 --key-heads 8 --value-heads 24 --key-dim 128 --value-dim 64
varlen|--seqlens 1000,3000,128 --hk 8 --hv 16 --k 64 --v 128|--seqlens 1000,3000,128 --key-heads 8 --value-heads 16 --key-dim 64 --value-dim 128
t777-h4|--seqlens 777 --hk 4 --hv 4 --k 256 --v 128|--tokens 777 --key-heads 4 --value-heads 4 --key-dim 256 --value-dim 128
EOF
}

fa_shapes() {
  echo "--- fa, max_seqlen_k far above the real length"
  $VT model "$CFG" --variant pytorch --tokens 4128 --max-seqlen-k 262144 --json > "$W/model-fa.json"
  timeout 300 python3 "$VAL/model_vs_torch.py" --kernel fa --seqlens 4128 --heads 24 --kv-heads 4 --head-dim 256 \
    --max-seqlen-k 262144 --compare "$W/model-fa.json" > "$W/snap-fa.jsonl"
  echo "snapshot verdict: $(tail -1 "$W/snap-fa.jsonl")"
  grep '"compare"' "$W/snap-fa.jsonl"
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 $VT run --quiet --out "$W/trace-fa" -- \
    python3 "$VAL/model_vs_torch.py" --kernel fa --seqlens 4128 --heads 24 --kv-heads 4 --head-dim 256 --max-seqlen-k 262144 > /dev/null
  $VT compare "$W/trace-fa" --model "$CFG" --variant pytorch --tokens 4128 --max-seqlen-k 262144 | tee "$W/compare-fa.txt"
  echo "--- fa varlen, 3 sequences"
  $VT model "$CFG" --variant pytorch --seqlens 1000,3000,128 --max-seqlen-k 131072 --json > "$W/model-fa-varlen.json"
  timeout 300 python3 "$VAL/model_vs_torch.py" --kernel fa --seqlens 1000,3000,128 --heads 24 --kv-heads 4 --head-dim 256 \
    --max-seqlen-k 131072 --compare "$W/model-fa-varlen.json" > "$W/snap-fa-varlen.jsonl"
  echo "snapshot verdict: $(tail -1 "$W/snap-fa-varlen.jsonl")"
}

workload() {
  export PYTHONPATH=/tmp/site
  $WL selfcheck 2>&1 | tail -40
  $WL gdn --seqlens 100,300,64 --heads 8 --key-heads 4 --key-dim 64 --value-dim 128 --check 2>&1 | tail -15
  $WL fa --seqlens 100,300 --heads 8 --kv-heads 2 --head-dim 128 --check 2>&1 | tail -15
  timeout 300 python3 "$VAL/workload_vs_fla.py" --workload "$WL" gdn --tokens 4128 --heads 48 --key-heads 16 --key-dim 128 --value-dim 128 2>&1
  timeout 300 python3 "$VAL/workload_vs_fla.py" --workload "$WL" gdn --seqlens 1000,3000,128 --heads 16 --key-heads 8 --key-dim 64 --value-dim 128 2>&1
  timeout 300 python3 "$VAL/workload_vs_fla.py" --workload "$WL" fa --seqlens 4128 --heads 24 --kv-heads 4 --head-dim 256 2>&1
  timeout 300 python3 "$VAL/workload_vs_fla.py" --workload "$WL" fa --seqlens 1000,3000,128 --heads 24 --kv-heads 4 --head-dim 256 2>&1
  $VT run --out "$W/workload-gdn" -- $WL gdn --tokens 4128 --heads 48 --key-heads 16 --key-dim 128 --value-dim 128
  $VT summary "$W/workload-gdn" > "$W/workload-gdn.summary"
  $VT compare "$W/workload-gdn" --model "$CFG" --variant fla-0.6.0 --tokens 4128 | tee "$W/workload-gdn.compare"
  $VT run --out "$W/workload-fa" -- $WL fa --seqlens 4128 --heads 24 --kv-heads 4 --head-dim 256
  $VT summary "$W/workload-fa" > "$W/workload-fa.summary"
  $VT compare "$W/workload-fa" --model "$CFG" --variant pytorch --tokens 4128 | tee "$W/workload-fa.compare"
  $VT run --out "$W/workload-fa-padded" -- $WL fa --seqlens 4128 --heads 24 --kv-heads 4 --head-dim 256 --padded-lse --max-seqlen-q 65536
  $VT compare "$W/workload-fa-padded" --model "$CFG" --variant fa-2.5.9 --tokens 4128 | tee "$W/workload-fa-padded.compare"
}

write_empty_del() {
  cat > /tmp/empty_del.py <<'EOF'
import time, torch
torch.empty(1, device="cuda")
best = 1e9
for _ in range(5):
    t = time.perf_counter()
    for _ in range(2000):
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda"); del x
    best = min(best, (time.perf_counter() - t) / 2000)
print(f"{best*1e6:.2f} us")
EOF
}

costs() {
  echo "--- cuMemAlloc_v2 + cuMemFree_v2 of 1 MiB, ns per pair (best of 5 rounds of 2000)"
  echo "bare:            $($BIN/bench_loop 2000 5 0)"
  echo "preload, off:    $(LD_PRELOAD=$BIN/libvramtrace_preload.so $BIN/bench_loop 2000 5 0)"
  rm -rf "$W/bench"; echo "recording:       $(VRAMTRACE_DIR=$W/bench LD_PRELOAD=$BIN/libvramtrace_preload.so $BIN/bench_loop 2000 5 0)"
  rm -rf "$W/bench"; echo "recording, no stacks: $(VRAMTRACE_STACKS=0 VRAMTRACE_DIR=$W/bench LD_PRELOAD=$BIN/libvramtrace_preload.so $BIN/bench_loop 2000 5 0)"
  rm -rf "$W/bench"; echo "recording, +40 frames: $(VRAMTRACE_DIR=$W/bench LD_PRELOAD=$BIN/libvramtrace_preload.so $BIN/bench_loop 2000 5 40)"
  rm -rf "$W/bench"
  echo "--- torch.empty(1 MiB) + del, caching off, best of 5 x 2000"
  echo "bare:        $(PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 /tmp/empty_del.py)"
  rm -rf "$W/bench-torch"; echo "vramtrace:   $(PYTORCH_NO_CUDA_MEMORY_CACHING=1 $VT run --quiet --out "$W/bench-torch" -- python3 /tmp/empty_del.py)"
  rm -rf "$W/bench-torch"; echo "no stacks:   $(PYTORCH_NO_CUDA_MEMORY_CACHING=1 $VT run --quiet --no-stacks --out "$W/bench-torch" -- python3 /tmp/empty_del.py)"
  rm -rf "$W/bench-torch"
}

workload_h48() {
  # The issue's shapes: gdn and fa at T=4128 with 48 heads.
  $VT run --out "$W/workload-fa-h48" -- $WL fa --seqlens 4128 --heads 48 --kv-heads 8 --head-dim 128
  $VT summary "$W/workload-fa-h48" > "$W/workload-fa-h48.summary"
  $VT compare "$W/workload-fa-h48" --model "$CFG" --variant pytorch --tokens 4128 --attention-heads 48 --kv-heads 8 --head-dim 128 | tee "$W/workload-fa-h48.compare"
  timeout 300 python3 "$VAL/workload_vs_fla.py" --workload "$WL" fa --seqlens 4128 --heads 48 --kv-heads 8 --head-dim 128
  timeout 300 python3 "$VAL/workload_vs_fla.py" --workload "$WL" gdn --tokens 4128 --heads 48 --key-heads 16 --key-dim 128 --value-dim 128
}

demo_gpu() {
  # The README's main job on a real GPU: real kernels, a 24 GiB limit enforced by a ballast.
  timeout 500 $VT demo --out "$W/demo-gpu" 2>&1 | tee "$W/demo-gpu.txt"
  $VT summary --frames 8 "$W/demo-gpu" > "$W/demo-gpu.summary"
  tail -60 "$W/demo-gpu.summary"
}

prefill_sample() {
  # A real-kernel prefill small enough to keep under samples/: an 18 GiB limit makes it fail
  # in the first chunks.
  $VT run --out "$W/prefill-18gib" -- $WL prefill --config "$CFG" --prompt-tokens 65536 --capacity 18GiB 2>&1 | tail -25
  $VT summary --frames 6 "$W/prefill-18gib" > "$W/prefill-18gib.summary"
  head -40 "$W/prefill-18gib.summary"
  du -sh "$W/prefill-18gib"
}

costs_ab() {
  # Interleaved A/B: bare and traced alternate, so drift of the machine hits both alike.
  local i
  for i in 1 2 3 4 5; do
    echo "round $i bare:      $(PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 /tmp/empty_del.py)"
    rm -rf "$W/ab"; echo "round $i vramtrace: $(PYTORCH_NO_CUDA_MEMORY_CACHING=1 $VT run --quiet --out "$W/ab" -- python3 /tmp/empty_del.py)"
    rm -rf "$W/ab"; echo "round $i no stacks: $(PYTORCH_NO_CUDA_MEMORY_CACHING=1 $VT run --quiet --no-stacks --out "$W/ab" -- python3 /tmp/empty_del.py)"
    echo "round $i bench_loop bare: $($BIN/bench_loop 2000 3 0)"
    rm -rf "$W/ab"; echo "round $i bench_loop traced: $(VRAMTRACE_DIR=$W/ab LD_PRELOAD=$BIN/libvramtrace_preload.so $BIN/bench_loop 2000 3 0)"
  done
  rm -rf "$W/ab"
}

prefill_cost() {
  # A real PyTorch chunked prefill (fla GDN + PyTorch attention + MLP, Qwen3.6-27B shapes),
  # bare and traced in alternation; the caching allocator on (as servers run) and off (one
  # driver call per tensor: the recorder's worst case).
  local i caching env
  for caching in on off; do
    env=()
    [ "$caching" = off ] && env=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    for i in 1 2 3; do
      echo "caching $caching round $i bare:   $(env "${env[@]}" python3 "$VAL/torch_prefill.py" | tail -1)"
      rm -rf "$W/pc"; echo "caching $caching round $i traced: $(env "${env[@]}" $VT run --quiet --out "$W/pc" -- python3 "$VAL/torch_prefill.py" | tail -1)"
      echo "  trace: $(du -sb "$W/pc" | cut -f1) bytes, $($VT events "$W/pc" | wc -l) events"
    done
  done
  rm -rf "$W/pc"
}

live_tmux() {
  # The live view as a user sees it, against a PyTorch prefill being written: a chunked prefill
  # of 16 Qwen3.6-27B-shaped layers creeping toward a 24 GiB line, the view in tmux.
  rm -rf "$W/live"; mkdir -p "$W/live"
  tmux kill-server 2>/dev/null
  tmux new-session -d -s vt -x 150 -y 46 "$VT live $W/live --capacity 24GiB"
  sleep 2; tmux capture-pane -p -t vt > "$W/live-screen-0-waiting.txt"
  $VT run --quiet --out "$W/live" -- python3 "$VAL/torch_prefill.py" --layers 16 --tokens 65536 --passes 1 > "$W/live-job.txt" 2>&1 &
  local job=$! i
  for i in 1 2 3 4 5 6; do sleep 4; tmux capture-pane -p -t vt > "$W/live-screen-$i.txt"; done
  wait $job
  tmux send-keys -t vt p; sleep 1; tmux capture-pane -p -t vt > "$W/live-screen-peak.txt"
  tmux send-keys -t vt Enter; sleep 1; tmux capture-pane -p -t vt > "$W/live-screen-stack.txt"
  tmux send-keys -t vt q; sleep 1; tmux kill-server 2>/dev/null
  for f in "$W"/live-screen-*.txt; do echo "--- $f"; cat "$f"; done
}

report_torch() {
  # A real PyTorch OOM, as a user would file it: the prefill above on a 24 GiB allocator limit.
  rm -rf "$W/torch-oom" "$W/torch-oom-report"
  $VT run --out "$W/torch-oom" -- python3 "$VAL/torch_prefill.py" --layers 16 --tokens 262144 --passes 1 --capacity-gib 24 2>&1 | tail -5
  $VT report "$W/torch-oom" --model "$CFG" --variant fla-0.6.0 --layers 16 --json -o "$W/torch-oom-report" | tail -3
  $VT report "$W/torch-oom" --model "$CFG" --variant fla-0.6.0 --layers 16 --html -o "$W/torch-oom-report" | tail -1
  head -40 "$W/torch-oom-report/report.md"
}

export_memviz() {
  # Our PyTorch-snapshot export read by PyTorch's own memory_viz; PyTorch's own snapshot of a run
  # imported and set beside our record of the same run.
  local d="$W/torch-nocache"
  [ -d "$d" ] || { echo "run torch_modes first"; return 1; }
  $VT export "$d" --format pytorch -o "$W/export.pickle" --force
  python3 - "$W/export.pickle" <<'PY'
import pickle, sys
from torch.cuda import _memory_viz as mv
s = pickle.load(open(sys.argv[1], "rb"))
print("segments", len(s["segments"]), "device traces", [len(t) for t in s["device_traces"]])
print("trace_plot html bytes", len(mv.trace_plot(s)))
print("segment_plot html bytes", len(mv.segment_plot(s)))
print(mv.segsum(s)[:400])
PY
  rm -rf "$W/own-snap" "$W/imported"
  $VT run --quiet --out "$W/own-snap" -- python3 -c '
import pickle, torch
torch.cuda.memory._record_memory_history(max_entries=100000)
keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (4096, 512000, 3145728, 52428800)]
del keep[1]
pickle.dump(torch.cuda.memory._snapshot(), open("/tmp/own.pickle", "wb"))
'
  $VT import /tmp/own.pickle -o "$W/imported"
  echo "--- ours"; $VT summary "$W/own-snap" | head -30
  echo "--- imported from PyTorch's snapshot"; $VT summary "$W/imported" | head -30
}

replay_check() {
  # An uncapped prefill on real kernels, replayed against 18 GiB, beside the same prefill run
  # with an 18 GiB limit (samples/h200/prefill-18gib): the same failing allocation?
  rm -rf "$W/wl-uncapped"
  $VT run --quiet --out "$W/wl-uncapped" -- $WL prefill --config "$CFG" --prompt-tokens 16512 2>&1 | tail -3
  $VT replay "$W/wl-uncapped" --capacity 18GiB --frames 4 | head -20
  rm -rf "$W/wl-18"
  $VT run --quiet --out "$W/wl-18" -- $WL prefill --config "$CFG" --prompt-tokens 16512 --capacity 18GiB 2>&1 | tail -4
}

wheel() {
  # The wheel in a fresh venv traces the fla run with no flags and no environment.
  local whl
  whl=$(ls "$ROOT"/.device/wheel/vramtrace-*.whl 2>/dev/null | head -1)
  [ -n "$whl" ] || { echo "no wheel under .device/wheel"; return 1; }
  rm -rf /tmp/vtvenv && python3 -m venv /tmp/vtvenv && /tmp/vtvenv/bin/pip install -q --no-index "$whl"
  rm -rf "$W/wheel"
  env -u VRAMTRACE_PRELOAD /tmp/vtvenv/bin/vramtrace run --out "$W/wheel" -- python3 "$VAL/model_vs_torch.py" --kernel gdn --seqlens 4128 --hk 16 --hv 48 --k 128 --v 128 2>&1 | tail -12
}

nccl() {
  # Handles obtained elsewhere (issue 13): under torchrun on 2 GPUs, NCCL imports its peers'
  # buffers (cuMemImportFromShareableHandle) and retains handles (cuMemRetainAllocationHandle).
  # Every cuMemRelease must pair; per rank, device bytes are what it created, imported bytes
  # their own pool. Compare per-process device bytes with NVML's per-process used memory
  # (sampled while the ranks hold their buffers) minus the context (NVML's figure for a process
  # that only initialised CUDA: the "context" line below).
  rm -rf "$W/nccl" "$W/ctx"
  command -v torchrun >/dev/null || { echo "no torchrun"; return 1; }
  $VT run --quiet --out "$W/ctx" -- python3 -c 'import torch, time; torch.zeros(1, device="cuda"); time.sleep(6)' &
  local ctxpid=$!
  sleep 4; echo "--- context (NVML, a process that only initialised CUDA)"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  wait $ctxpid
  ( for _ in $(seq 1 40); do nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; sleep 0.5; done ) > "$W/nccl-nvml.csv" &
  local sampler=$!
  HOLD_S=8 $VT run --out "$W/nccl" -- torchrun --nproc-per-node 2 "$VAL/nccl_allreduce.py" 2>&1 | tail -40
  kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
  echo "--- NVML per process, highest sample"
  sort -t, -k1,1 -k2,2n "$W/nccl-nvml.csv" | awk -F, '{m[$1]=$2} END {for (p in m) print p "," m[p]}'
  echo "--- per rank: calls and pairing"
  for f in "$W"/nccl/*.vtr; do
    echo "$f"
    $VT events "$f" | python3 -c '
import collections, json, sys
c = collections.Counter(); unmatched = 0
for line in sys.stdin:
    e = json.loads(line)
    c[(e["api"], e["kind"])] += 1
    unmatched += bool(e.get("unmatched"))
for k, n in sorted(c.items()):
    if "Mem" in k[0]:
        print("  ", k[0], k[1], n)
print("   unmatched releases", unmatched)
'
  done
  $VT summary "$W/nccl" | head -60
  $VT summary --json "$W/nccl" > "$W/nccl-summary.json"
}

attribution() {
  # Issue 11's done-when: real fla and PyTorch's FlashAttention, with the caching allocator on and
  # off. The report names each tensor with its shape and the line that allocated it; with caching
  # on, PyTorch's own snapshot of the measured call, imported, is the same tensor set as ours.
  local mode kern d vargs variant margs
  local -a env
  for mode in cache nocache; do
    env=()
    [ "$mode" = nocache ] && env=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    for kern in gdn fa; do
      if [ "$kern" = gdn ]; then
        vargs="--kernel gdn --seqlens 4128 --hk 16 --hv 48 --k 128 --v 128"
        variant=fla-0.6.0; margs="--tokens 4128"
      else
        vargs="--kernel fa --seqlens 4128 --heads 24 --kv-heads 4 --head-dim 256 --max-seqlen-k 262144"
        variant=pytorch; margs="--tokens 4128 --max-seqlen-k 262144"
      fi
      d=$W/att-$kern-$mode
      rm -rf "$d" "$d-report" "$d-imported"
      echo "--- $kern, caching $mode"
      env "${env[@]}" timeout 300 $VT run --quiet --out "$d" -- \
        python3 "$VAL/model_vs_torch.py" $vargs --snapshot-out "$d.pickle" > "$d.stdout" 2>&1
      echo "exit $?"; grep -v '"event"' "$d.stdout" | tail -3 | cut -c1-300
      $VT compare "$d" --model "$CFG" --variant $variant $margs | tee "$d.compare"
      $VT report "$d" --model "$CFG" --variant $variant $margs -o "$d-report" | tail -1
      grep -n -B2 -A24 "^| tensor" "$d-report/report.md" | head -60
      if [ "$mode" = cache ]; then
        $VT import "$d.pickle" -o "$d-imported" | tail -2
        $VT events "$d" > "$d.jsonl"; $VT events "$d-imported" > "$d-imported.jsonl"
        python3 "$VAL/same_tensors.py" "$d.jsonl" "$d-imported.jsonl"
      fi
    done
  done
  echo "--- gdn, caching on, --torch-shapes"
  d=$W/att-gdn-shapes; rm -rf "$d"
  timeout 300 $VT run --quiet --torch-shapes --out "$d" -- \
    python3 "$VAL/model_vs_torch.py" --kernel gdn --seqlens 4128 --hk 16 --hv 48 --k 128 --v 128 > "$d.stdout" 2>&1
  echo "exit $?"
  $VT compare "$d" --model "$CFG" --variant fla-0.6.0 --tokens 4128 | tee "$d.compare"
  echo "--- fa, caching on, --torch-shapes"
  d=$W/att-fa-shapes; rm -rf "$d"
  timeout 300 $VT run --quiet --torch-shapes --out "$d" -- \
    python3 "$VAL/model_vs_torch.py" --kernel fa --seqlens 4128 --heads 24 --kv-heads 4 --head-dim 256 --max-seqlen-k 262144 > "$d.stdout" 2>&1
  echo "exit $?"
  $VT compare "$d" --model "$CFG" --variant pytorch --tokens 4128 --max-seqlen-k 262144 | tee "$d.compare"
}

not_fla() {
  # A GDN layer that is not fla (plain PyTorch, fla's buffer shapes): fla's tensors must not be
  # reported as matched, in either caching mode.
  local mode d
  local -a env
  timeout 300 python3 "$VAL/naive_gdn.py" --check-fla
  for mode in cache nocache; do
    env=()
    [ "$mode" = nocache ] && env=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    d=$W/naive-gdn-$mode; rm -rf "$d" "$d-report"
    echo "--- naive gdn, caching $mode"
    env "${env[@]}" timeout 300 $VT run --quiet --out "$d" -- python3 "$VAL/naive_gdn.py"
    $VT compare "$d" --model "$CFG" --variant fla-0.6.0 --tokens 4128 | tee "$d.compare"
    $VT report "$d" --model "$CFG" --variant fla-0.6.0 --tokens 4128 -o "$d-report" | tail -1
    grep -n -B2 -A24 "^| tensor" "$d-report/report.md" | head -50
  done
}

nccl_stages() {
  # Where each rank's memory goes under NCCL, stage by stage: NVML per process beside the traced
  # live device bytes (issue 13: NVML minus the context exceeded the traced peak by ~359 MiB per
  # rank). Once with lazy module loading (CUDA's default), once eager.
  command -v torchrun >/dev/null || { echo "no torchrun"; return 1; }
  local ml d
  for ml in LAZY EAGER; do
    d=$W/nccl-stages-$ml; rm -rf "$d"
    echo "--- CUDA_MODULE_LOADING=$ml"
    CUDA_MODULE_LOADING=$ml timeout 300 $VT run --quiet --out "$d" -- \
      torchrun --nproc-per-node 2 "$VAL/nccl_stages.py" > "$d.stdout" 2>&1
    echo "exit $?"; grep -v STAGE "$d.stdout" | tail -5
    $VT events "$d" > "$d.jsonl"
    python3 "$VAL/nccl_stages_report.py" "$d.stdout" "$d.jsonl"
    $VT summary "$d" | grep -E "^(process|  cuda|  device|pid)|unmatched|imported" | head -30
  done
}

hf_bin() {
  # The transformers CLI of the Python that holds torch (the venv's bin may not be on PATH).
  command -v transformers 2>/dev/null || echo "$(dirname "$(python3 -c 'import sys; print(sys.executable)')")/transformers"
}

hf_models() {
  # Random-weight models with a word-level tokenizer (no hub there): a dense Qwen3 to serve and a
  # hybrid Qwen3.5 text model (Gated DeltaNet + attention) for the prefill.
  [ -f "$W/models/hybrid/config.json" ] && [ -f "$W/models/dense/config.json" ] && return 0
  timeout 300 python3 "$VAL/hf_models.py" "$W/models" dense hybrid
}

hf_prefill() {
  # Issue 18: a transformers Qwen3.5 prefill with fla's kernels, traced with the caching allocator
  # on; then what summary and report conclude from it.
  hf_models || return 1
  local t=${HF_TOKENS:-16384} d=$W/hf-prefill
  rm -rf "$d" "$d-report"
  timeout 300 python3 "$VAL/hf_prefill.py" "$W/models/hybrid" --tokens "$t"
  timeout 300 $VT run --quiet --out "$d" -- python3 "$VAL/hf_prefill.py" "$W/models/hybrid" --tokens "$t"
  echo "exit $?"
  $VT summary "$d" | head -60
  $VT report "$d" --model "$W/models/hybrid/config.json" --tokens "$t" -o "$d-report" | tail -2
  head -60 "$d-report/report.md"
}

exports_equal() {
  # Issue 20 item 1: our PyTorch snapshot of a caching-on run against PyTorch's own of the same
  # run (fla's GDN, and a transformers Qwen3.5 prefill), and the run's bytes by Python line from
  # the Parquet export. For each: export the whole run, find the moment PyTorch took its snapshot
  # (snapshot_equal.py --locate), export as of then, compare; then PyTorch's own viewers on both.
  hf_models || return 1
  local name d at
  for name in fla-gdn hf-prefill; do
    d=$W/exports-$name
    rm -rf "$d" "$d-tables" "$d-viz"
    if [ "$name" = fla-gdn ]; then
      timeout 300 $VT run --quiet --out "$d" -- python3 "$VAL/model_vs_torch.py" --kernel gdn \
        --seqlens 4128 --hk 16 --hv 48 --k 128 --v 128 --snapshot-out "$d.theirs.pickle" > "$d.stdout" 2>&1
    else
      timeout 300 $VT run --quiet --out "$d" -- python3 "$VAL/hf_prefill.py" "$W/models/hybrid" \
        --tokens ${HF_TOKENS:-4128} --chunks 2 --snapshot-out "$d.theirs.pickle" > "$d.stdout" 2>&1
    fi
    echo "--- $name: exit $?"; tail -3 "$d.stdout"
    $VT export "$d" --format pytorch --max-entries 0 --force -o "$d.whole.pickle"
    at=$(python3 "$VAL/snapshot_equal.py" --locate "$d.whole.pickle" "$d.theirs.pickle") || { echo "$at"; continue; }
    echo "PyTorch's snapshot was taken at $at"
    $VT export "$d" --format pytorch --max-entries 0 --force --until "$at" -o "$d.ours.pickle"
    python3 "$VAL/snapshot_equal.py" "$d.ours.pickle" "$d.theirs.pickle" | tee "$d.equal.txt" | tail -25
    $VT import "$d.theirs.pickle" -o "$d-imported" | tail -1
    $VT export "$d-imported" --format pytorch --max-entries 0 --force -o "$d.back.pickle"
    python3 "$VAL/snapshot_equal.py" "$d.back.pickle" "$d.theirs.pickle" | tail -3
    "$VAL/snapshot_plots.sh" "$d.ours.pickle" "$d.theirs.pickle" "$d-viz"
    $VT export "$d" --format parquet -o "$d-tables"
    python3 - "$d-tables/tensors.parquet" <<'EOF'
import sys
q = ("SELECT line, count(*) AS tensors, sum(size) AS bytes FROM '%s' WHERE kind = 'alloc' "
     "GROUP BY line ORDER BY bytes DESC LIMIT 12" % sys.argv[1])
try:
    import duckdb
    for r in duckdb.sql(q).fetchall():
        print(*r, sep="\t")
except ImportError:
    try:
        import pyarrow.parquet as pq
        t = pq.read_table(sys.argv[1]).to_pylist()
        by = {}
        for r in t:
            if r["kind"] == "alloc":
                n, b = by.get(r["line"], (0, 0))
                by[r["line"]] = (n + 1, b + r["size"])
        for line, (n, b) in sorted(by.items(), key=lambda x: -x[1][1])[:12]:
            print(line, n, b, sep="\t")
    except ImportError:
        print("neither duckdb nor pyarrow here: carry a duckdb wheel to group the bytes by line")
EOF
  done
}

serve_cb() {
  # Issue 18/19: transformers serve, continuous batching (paged KV cache), under vramtrace run,
  # with 16 concurrent chat completions of 1,500 prompt tokens and 96 new tokens.
  hf_models || return 1
  local tf port=${SERVE_PORT:-8765} d=$W/serve-cb m=$W/models/dense
  tf=$(hf_bin)
  rm -rf "$d" "$d-report"
  # /v1/models scans the hub cache, which must exist (there is no hub there).
  mkdir -p "${HF_HUB_CACHE:-$HOME/.cache/huggingface/hub}"
  # The model as a positional argument where this transformers takes one; else it loads on the
  # first request naming it.
  local -a pos=("$m")
  "$tf" serve --help 2>&1 | grep -qiE "^ *(model|model_id|MODEL)\b|\[MODEL\]|force.model" || pos=()
  $VT run --quiet --out "$d" -- "$tf" serve "${pos[@]}" --port "$port" --continuous-batching \
    ${SERVE_ARGS:-} > "$d.stdout" 2>&1 &
  local pid=$!
  sleep 8
  if ! kill -0 $pid 2>/dev/null; then
    echo "serve exited early:"; tail -20 "$d.stdout"; rm -rf "$d"
    $VT run --quiet --out "$d" -- "$tf" serve --port "$port" --continuous-batching \
      ${SERVE_ARGS:-} > "$d.stdout" 2>&1 &
    pid=$!
  fi
  timeout 400 python3 "$VAL/serve_load.py" "$port" "$m" --requests 16 --prompt-tokens 1500 \
    --max-tokens 96 --rounds ${SERVE_ROUNDS:-2} --wait 240
  echo "load exit $?"
  pkill -INT -f "transformers serve"
  for _ in $(seq 20); do pgrep -f "transformers serve" >/dev/null || break; sleep 1; done
  pkill -KILL -f "transformers serve"
  wait $pid; echo "run exit $?"
  tail -30 "$d.stdout" | cut -c1-300
  $VT summary "$d" | head -80
  $VT report "$d" --model "$m/config.json" -o "$d-report" | tail -2
  head -60 "$d-report/report.md"
}

soak_serve() {
  # Issue 34: growth over a run: a server with no leak, the same with a planted leak, a decode
  # loop whose reserve settles (scripts/validate/soak_serve.sh).
  hf_models || return 1
  VT=$VT W=$W VAL=$VAL TF=$(hf_bin) bash "$VAL/soak_serve.sh"
}

soak_variants() {
  # Issue 34, item 3: the planted leak recorded through a ring that drops tensor detail, and
  # by attaching to a server already running (scripts/validate/soak_variants.sh).
  hf_models || return 1
  VT=$VT BIN=$BIN W=$W VAL=$VAL ROOT=$ROOT TF=$(hf_bin) bash "$VAL/soak_variants.sh"
}

attach_serve() {
  # Issue 21: vramtrace attach / detach on a transformers serve under steady requests (pause,
  # request rate before and after, the trace seeded from PyTorch's snapshot).
  WORK=$W bash "$VAL/attach_serve.sh"
}

torch_symbols() {
  # What libc10_cuda exports for the caching allocator's trace trackers (issue 19's native path).
  local lib
  lib=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so"))')
  nm -DC "$lib" | grep -iE "tracker|recordHistory|TraceEntry|attachOutOfMemory|getDeviceStats| allocator$" | head -40
}

whole_step() {
  # Issue 18 item 3: the whole-step model against a real transformers Qwen3.5 prefill with fla
  # (8 layers of Qwen3.6-27B, random bf16 weights, 2 chunks of 4128), traced with the PyTorch
  # probe and kept as a sample. Compare each chunk's peak_allocated with
  #   cargo run -p vramtrace-models --example step -- samples/models/Qwen3.6-27B/config.json \
  #     --runtime transformers --layers 8 --chunk 4128 --context <4128|8256>
  python3 -c 'import transformers; print("transformers", transformers.__version__)' || return 1
  local d=$W/transformers-prefill
  rm -rf "$d"
  timeout 600 $VT run --out "$d" -- python3 "$VAL/whole_step_transformers.py" --layers 8 \
    --chunk 4128 --chunks 2 | tee "$d.stdout"
  $VT summary "$d" > "$d.summary" 2>&1; head -20 "$d.summary"
}

report_versions() {
  # Issue 18 item 4: the versions block `vramtrace run` gathers at start (versions.json: the
  # driver from /proc/driver/nvidia/version, torch, its CUDA, triton, fla, transformers from the
  # packages' metadata) on the real machine, and the report's first screen of the torch OOM
  # rerun with it. Compare versions.json with `setup`'s nvidia-smi and python lines.
  local d=$W/report-versions
  rm -rf "$d" "$d-report"
  PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.9 timeout 600 $VT run --out "$d" -- \
    python3 "$VAL/torch_prefill.py" --layers 16 --tokens 262144 --passes 1 --capacity-gib 24
  cat "$d/versions.json"
  $VT report "$d" --model "$CFG" --layers 16 --json -o "$d-report" | tail -2
  head -30 "$d-report/report.md"
}

decode_bench() {
  # Issue 19 item 3: the decode case (transformers hybrid, 8 layers, 1,024-token prompt, 128 new
  # tokens), bare / PyTorch's recorder / vramtrace alternated, 3 rounds.
  DECODE_CONFIG=${DECODE_CONFIG:-$ROOT/.device/hybrid-config.json} \
    DECODE_MODES=${DECODE_MODES:-bare history vramtrace} WORK=$W bash "$VAL/torch_native.sh" decode
}

decode_alternate() {
  # Issue 19 item 3, the decode case alternated finely: DECODE_PROCS (3) processes per mode kept
  # alive, each in turn timing one generate, ROUNDS (10) rounds, no round started after
  # DECODE_BUDGET_S, every process on BENCH_CPUS (scripts/validate/decode_alternate.py). Six
  # modes of one process each took 112 s to start (2026-12-02); three each take longer. The mode
  # `toggled` (with bare, the default DECODE_MODES) is one `vramtrace run` process taking turns
  # paused, on and with PyTorch's recorder: ratios a process's own speed does not blur
  # (docs/validation.md, 2026-12-02 morning).
  python3 "$VAL/decode_alternate.py" --rounds "${ROUNDS:-10}" --vt "$VT" --out "$W/decode-alternate" \
    --modes "${DECODE_MODES:-bare,toggled}" \
    --procs "${DECODE_PROCS:-3}" ${BENCH_CPUS:+--cpus "$BENCH_CPUS"} \
    ${DECODE_BUDGET_S:+--budget-s "$DECODE_BUDGET_S"} \
    -- --config "${DECODE_CONFIG:-$ROOT/.device/hybrid-config.json}"
}

ring_decode() {
  # Issue 19 item 4: bytes per decode step, and a 64 MiB budget on 192 decode steps.
  WORK=$W bash "$VAL/ring_decode.sh" "${RING_MODEL:-$ROOT/.device/hybrid-config.json}"
}

serve_bench() {
  # Issue 19 item 3: transformers serve batches, one server per mode alive at once, alternated.
  WORK=$W bash "$VAL/serve_bench.sh" "${SERVE_ROUNDS:-6}"
}

live_serve() {
  # Issue 20 items 2 and 3: the live view under tmux on a running transformers serve.
  WORK=$W bash "$VAL/live_serve.sh"
}

generate_chunked() {
  # Issue 31: transformers' own chunked prefill, generate(prefill_chunk_size=C), run until PyTorch's
  # per-process fraction refuses, at GEN_CHUNKS x GEN_CAPS on the planner's validation model
  # (hf_models.py hybrid12); each case once bare (the observed failing chunk) and the cases in
  # GEN_TRACED under vramtrace (traces for the report). The predictions were committed first
  # (docs/validation.md, "transformers generate(prefill_chunk_size)").
  [ -f "$W/models/hybrid12/config.json" ] || timeout 300 python3 "$VAL/hf_models.py" "$W/models" hybrid12 || return 1
  cp "$W/models/hybrid12/config.json" "$W/hybrid12-config.json"
  local c cap d
  for cap in ${GEN_CAPS:-6 10}; do
    for c in ${GEN_CHUNKS:-2048 4096 8192}; do
      echo "--- chunk $c, cap $cap GiB"
      timeout 240 python3 "$VAL/hf_generate_chunked.py" "$W/models/hybrid12" --chunk "$c" --cap "$cap" 2>&1 |
        grep -E "^(RESULT|OOM|held)" | tee "$W/gen-c$c-cap$cap.txt"
    done
  done
  for c in ${GEN_TRACED-4096:6}; do
    cap=${c#*:} c=${c%:*} d=$W/gen-trace-c$c-cap$cap
    rm -rf "$d"
    echo "--- traced: chunk $c, cap $cap GiB"
    # shellcheck disable=SC2086  # GEN_FLAGS (e.g. --expandable) is a list of flags
    timeout 240 $VT run --quiet --out "$d" -- python3 "$VAL/hf_generate_chunked.py" "$W/models/hybrid12" \
      --chunk "$c" --cap "$cap" ${GEN_FLAGS:-} 2>&1 | grep -E "^(RESULT|OOM|held)" | tee "$d.txt"
    $VT summary "$d" | head -40
  done
}

generate_reports() {
  # Issue 31: the report on every traced generate run of this call (the step, the planner met
  # with the trace's segments at the step's start, the shortfall), beside its trace.
  local d
  for d in "$W"/gen-trace-c*; do
    [ -d "$d" ] || continue
    cp "$W/models/hybrid12/config.json" "$d/config.json"
    $VT report "$d" --model "$d/config.json" --json > "$d.report.json" 2> "$d.report.err" || cat "$d.report.err"
    python3 - "$d.report.json" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
m, s = r.get("model") or {}, r.get("step") or {}
print(sys.argv[1], "chunk", s.get("chunk_index"), "context", s.get("context_tokens"),
      "fits", m.get("failure_fits"), "before", m.get("before_fits"), "basis", m.get("fits_basis"),
      "config", m.get("failure_fits_config"), "headroom", m.get("headroom"), "shortfall", r.get("shortfall"))
PY
  done
}

gguf_tensors() {
  # The tensor list of each GGUF (name, type, shape, bytes), read with the tree's gguf-py
  # (`gguf_tensors TREE FILE...`); with several files, each list under a "# FILE" line.
  python3 - "$@" <<'PY'
import sys
sys.path.insert(0, sys.argv[1] + "/gguf-py")
import gguf
paths = sys.argv[2:]
for path in paths:
    if len(paths) > 1:
        print("#", path)
    for t in gguf.GGUFReader(path).tensors:
        print(t.name, t.tensor_type.name, list(map(int, t.shape)), int(t.n_bytes))
PY
}

llama_build() {
  # Issue 33: llama.cpp from the source prepare_llama.sh packed (llama-cpp-python 0.3.36's
  # vendored tree), CUDA for sm_90, only the tools the runs use.
  local L=$LL/llama.cpp
  [ -x "$L/build/bin/llama-bench" ] && return 0
  mkdir -p "$LL" && rm -rf "$L" && tar -C "$LL" -xJf "$ROOT/.device/llama.cpp.tar.xz" || return 1
  nvcc --version | tail -2
  cmake -S "$L" -B "$L/build" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    > "$W/llama-cmake.log" 2>&1 || { tail -30 "$W/llama-cmake.log"; return 1; }
  time cmake --build "$L/build" -j "$(nproc)" --target llama-bench llama-completion \
    llama-fit-params llama-quantize > "$W/llama-build.log" 2>&1 || { tail -40 "$W/llama-build.log"; return 1; }
  ls -la "$L/build/bin"
}

llama_heldout() {
  # Issue 33: llama.cpp's compute buffer at settings no model term was checked on (predictions
  # committed before the call, docs/validation.md): llama-bench (-n 0, so -p is the context) on
  # the f16 GGUF, its own log line of the CUDA0 compute buffer for each.
  local L=$LL/llama.cpp B=$LL/llama.cpp/build/bin case name flags
  [ -f "$LL/llama-f16.gguf" ] || timeout 300 python3 "$VAL/llama_gguf.py" "$L" "$LL/llama-f16.gguf" || return 1
  for case in "p8k-ub256-fa1:-p 8192 -ub 256 -fa 1" "p24k-ub1024-fa0:-p 24576 -ub 1024 -fa 0" \
      "p20000-ub384-fa1-q80:-p 20000 -ub 384 -fa 1 -ctk q8_0 -ctv q8_0" \
      "p12k-ub128-fa1-q40:-p 12288 -ub 128 -fa 1 -ctk q4_0 -ctv q4_0"; do
    name=${case%%:*} flags=${case#*:}
    # shellcheck disable=SC2086  # flags is a list
    timeout 120 "$B/llama-bench" -m "$LL/llama-f16.gguf" -ngl 99 -n 0 -r 1 $flags -o md -v \
      > "$W/llama-heldout-$name.log" 2>&1
    echo "$name ($flags): $(grep -m1 'CUDA0 compute buffer size is' "$W/llama-heldout-$name.log")"
  done
}

llama_runs() {
  # Issue 33: a random-weight llama GGUF (Llama-3.2-1B's shapes, f16, and its Q4_K_M), run by
  # llama-bench under vramtrace at LLAMA_CASES (name:model:flags), llama-fit-params' projection
  # beside each model; every trace, log and summary under $W/llama-*.
  local L=$LL/llama.cpp B=$LL/llama.cpp/build/bin case name m flags d
  [ -f "$LL/llama-f16.gguf" ] || timeout 300 python3 "$VAL/llama_gguf.py" "$L" "$LL/llama-f16.gguf" || return 1
  [ -f "$LL/llama-q4km.gguf" ] || timeout 300 "$B/llama-quantize" "$LL/llama-f16.gguf" "$LL/llama-q4km.gguf" Q4_K_M \
    > "$W/llama-quantize.log" 2>&1 || tail -20 "$W/llama-quantize.log"
  gguf_tensors "$L" "$LL/llama-f16.gguf" "$LL/llama-q4km.gguf" > "$W/llama-gguf-headers.txt"
  for m in f16 q4km; do
    for c in 16384 131072; do
      timeout 120 "$B/llama-fit-params" -m "$LL/llama-$m.gguf" -c "$c" -ngl 99 -fitp on \
        > "$W/llama-fit-$m-c$c.txt" 2>&1; tail -5 "$W/llama-fit-$m-c$c.txt"
    done
  done
  for case in ${LLAMA_CASES:-"f16-p16k-fa1-ub512:f16:-p 16384 -ub 512 -fa 1" \
      "f16-p16k-fa0-ub512:f16:-p 16384 -ub 512 -fa 0" "f16-p64k-fa1-ub2048:f16:-p 65536 -ub 2048 -fa 1" \
      "q4km-p32k-fa1-q40:q4km:-p 32768 -ub 512 -fa 1 -ctk q4_0 -ctv q4_0"}; do
    name=${case%%:*} m=${case#*:} flags=${m#*:} m=${m%%:*} d=$W/llama-$name
    rm -rf "$d"
    echo "--- llama-bench $name: $flags"
    # shellcheck disable=SC2086  # flags is a list
    timeout 240 $VT run --quiet --out "$d" -- "$B/llama-bench" -m "$LL/llama-$m.gguf" -ngl 99 -n 0 -r 1 \
      $flags -o md -v > "$d.log" 2>&1; tail -6 "$d.log"
    $VT summary "$d" > "$d.summary.txt" 2>&1; head -30 "$d.summary.txt"
    $VT report "$d" > "$d.report.md" 2>&1; head -12 "$d.report.md"
  done
}

llama_fill() {
  # Issue 33: the fill ceiling, predicted on the card as the ballast leaves it and then
  # observed (scripts/validate/llama_fill.py): two architectures (Llama-3.2-1B's shapes, f16 and
  # Q4_K_M; a 24-layer, 12-head model of 128-wide heads), without flash attention (where the
  # VMM pool grows with the fill) at three -ub, and with it over a q4_0 cache.
  local L=$LL/llama.cpp B=$LL/llama.cpp/build/bin
  [ -f "$LL/llama-f16.gguf" ] || timeout 300 python3 "$VAL/llama_gguf.py" "$L" "$LL/llama-f16.gguf" || return 1
  [ -f "$LL/llama-q4km.gguf" ] || timeout 300 "$B/llama-quantize" "$LL/llama-f16.gguf" "$LL/llama-q4km.gguf" Q4_K_M \
    > "$W/llama-quantize.log" 2>&1 || tail -20 "$W/llama-quantize.log"
  [ -f "$LL/llama-b.gguf" ] || timeout 300 python3 "$VAL/llama_gguf.py" "$L" "$LL/llama-b.gguf" \
    --layers 24 --hidden 1536 --ffn 4096 --heads 12 --kv-heads 2 || return 1
  gguf_tensors "$L" "$LL/llama-b.gguf" > "$W/llama-b-gguf-header.txt"
  rm -rf "$W/llama-fill"
  timeout 560 python3 "$VAL/llama_fill.py" --vt "$VT" --bin "$B" --out "$W/llama-fill" \
    ${LLAMA_FILL_CASES:-"a-f16-c32k-ub512:$LL/llama-f16.gguf:32768:512:off" \
    "a-f16-c32k-ub1024:$LL/llama-f16.gguf:32768:1024:off" \
    "a-q4km-c32k-ub512:$LL/llama-q4km.gguf:32768:512:off" \
    "b-f16-c64k-ub512:$LL/llama-b.gguf:65536:512:off" \
    "b-f16-c64k-ub256:$LL/llama-b.gguf:65536:256:off" \
    "a-f16-c64k-ub512-fa-q40:$LL/llama-f16.gguf:65536:512:on:q4_0"}
  for t in "$W"/llama-fill/*.trace; do
    [ -d "$t" ] && $VT summary "$t" > "$t.summary.txt" 2>&1
  done
  ls -la "$W/llama-fill" | head -50
}

llama_hybrid() {
  # Issue 33: a hybrid GGUF (llama.cpp's qwen35: Qwen3.6-27B's shapes, 8 of its 64 layers, two
  # of them full attention; scripts/validate/qwen35_gguf.py, f16 zeros, and its Q4_K_M): the
  # buffers made at start at three settings against the model's predictions (committed before
  # the call, docs/validation.md), then the fill ceiling without flash attention.
  local L=$LL/llama.cpp B=$LL/llama.cpp/build/bin g=$LL/qwen35-h8 case name m flags
  [ -f "$g-f16.gguf" ] || timeout 120 python3 "$VAL/qwen35_gguf.py" "$L" "$CFG" "$g-f16.gguf" --layers 8 || return 1
  [ -f "$g-q4km.gguf" ] || { time timeout 300 "$B/llama-quantize" "$g-f16.gguf" "$g-q4km.gguf" Q4_K_M \
    > "$W/qwen35-h8-quantize.log" 2>&1 || tail -20 "$W/qwen35-h8-quantize.log"; }
  for m in f16 q4km; do
    gguf_tensors "$L" "$g-$m.gguf" > "$W/qwen35-h8-$m-header.txt"
  done
  echo "hello hello hello hello hello hello hello hello" > "$W/qwen35-prompt.txt"
  for case in "f16-c16k-ub512-fa0:f16:-c 16384 -ub 512 -b 512 -fa off" \
      "f16-c64k-ub256-fa1-q80:f16:-c 65536 -ub 256 -b 256 -fa on -ctk q8_0 -ctv q8_0" \
      "q4km-c32k-ub512-fa1-q40:q4km:-c 32768 -ub 512 -b 512 -fa on -ctk q4_0 -ctv q4_0"; do
    name=${case%%:*} m=${case#*:} flags=${m#*:} m=${m%%:*}
    # shellcheck disable=SC2086  # flags is a list
    timeout 180 "$B/llama-completion" -m "$g-$m.gguf" -ngl 99 $flags -f "$W/qwen35-prompt.txt" \
      -n 4 -no-cnv --temp 0 -v > "$W/qwen35-h8-$name.log" 2>&1
    echo "$name: rc $?"
    grep -E "CUDA0 (model|KV|RS|compute) buffer size" "$W/qwen35-h8-$name.log"
  done
  rm -rf "$W/qwen35-fill"
  timeout 400 python3 "$VAL/llama_fill.py" --vt "$VT" --bin "$B" --out "$W/qwen35-fill" \
    "h8-f16-c32k-ub512:$g-f16.gguf:32768:512:off" "h8-q4km-c32k-ub256:$g-q4km.gguf:32768:256:off"
  for t in "$W"/qwen35-fill/*.trace; do
    [ -d "$t" ] && $VT summary "$t" > "$t.summary.txt" 2>&1
  done
}

llama_attach() {
  # Issue 33: vramtrace attach on a running llama-completion (interactive, no warm-up, waiting
  # for its first line), then a 16,000-token prompt fed to it while attached (without flash
  # attention the VMM pool grows with it), then EOF: llama.cpp frees everything and exits
  # while attached.
  local B=$LL/llama.cpp/build/bin d=$W/llama-attach pid apid i
  [ -f "$LL/llama-f16.gguf" ] || timeout 300 python3 "$VAL/llama_gguf.py" "$LL/llama.cpp" "$LL/llama-f16.gguf" || return 1
  rm -rf "$d" "$d.trace" && mkdir -p "$d"
  python3 -c 'print("hello" + " hello" * 15999)' > "$d/prompt.txt"
  mkfifo "$d/in"
  "$B/llama-completion" -m "$LL/llama-f16.gguf" -ngl 99 -c 32768 -ub 512 -b 512 -fa off -i -if \
    --no-warmup -n 8 --temp 0 -v < "$d/in" > "$d/llama.log" 2>&1 &
  pid=$!
  exec 7> "$d/in"
  for i in $(seq 90); do grep -q "Running in interactive mode" "$d/llama.log" && break; sleep 1; done
  grep -E "CUDA0 (model|KV|compute) buffer size" "$d/llama.log"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  # The attach must not inherit the FIFO's writing end (fd 7): while any writer holds it,
  # closing ours is no EOF for llama-completion (both calls of 2026-12-04 waited on it).
  $VT attach "$pid" --out "$d.trace" --duration 45s > "$d/attach.log" 2>&1 7>&- &
  apid=$!
  sleep 8
  cat "$d/prompt.txt" >&7
  # The prompt's prefill and 8 tokens take a few seconds; then EOF ends it, still attached.
  sleep 20
  exec 7>&-
  wait "$pid"; echo "llama-completion rc $?"
  wait "$apid"; echo "attach rc $?"
  cat "$d/attach.log"
  grep -c "n_past = " "$d/llama.log"
  $VT summary "$d.trace" > "$d.summary.txt" 2>&1; head -40 "$d.summary.txt"
  $VT report "$d.trace" --model "$LL/llama-f16.gguf" > "$d.report.md" 2>&1; head -60 "$d.report.md"
}

llama_27b() {
  # Issue 33: the seed's llama.cpp ladder on an emulated 24 GB card: Qwen3.6-27B's exact
  # architecture in Q4_K_M, a q4_0 cache, -ub 512, flash attention, the card's 25,438,126,080 B
  # (a 3090's total) free when llama.cpp starts; the model's prediction printed before the one
  # rung, the longest prompt. The GGUF is written sparse (zeros) at the types and sizes
  # llama-quantize gave each tensor on 2026-12-04 (samples/h200/llama-27b/): the same bytes
  # without 50 GiB of f16 and 109 s of quantizing. One llama_fill.py per context in
  # LLAMA_27B_CTXS, each packed as it ends (PACK_EACH=1) so a machine taken back mid-call
  # loses only the case it was on.
  local L=$LL/llama.cpp B=$LL/llama.cpp/build/bin g=$LL/qwen36-27b ctx
  [ -f "$g-q4km.gguf" ] || timeout 120 python3 "$VAL/qwen35_gguf.py" "$L" "$CFG" "$g-q4km.gguf" \
    --types "$ROOT/samples/h200/llama-27b/qwen36-27b-q4km-header.txt" --file-type 15 || return 1
  gguf_tensors "$L" "$g-q4km.gguf" > "$W/qwen36-27b-q4km-header.txt"
  for ctx in ${LLAMA_27B_CTXS:-262144 200000}; do
    rm -rf "$W/qwen36-27b-fill-c$ctx"
    LLAMA_FILL_TIMEOUT=${LLAMA_27B_TIMEOUT:-400} timeout 560 python3 "$VAL/llama_fill.py" --vt "$VT" \
      --bin "$B" --out "$W/qwen36-27b-fill-c$ctx" "q27-c$ctx:$g-q4km.gguf:$ctx:512:on:q4_0:card=25438126080"
    [ "${PACK_EACH:-0}" = 1 ] && PACK_NAME=27b-c$ctx "$0" pack > /dev/null
  done
}

generate_modes() {
  # Issue 31, item 2: the planner's expandable segments and eager attention, each case bare
  # (cap:chunk lists; the predictions were committed first: docs/validation.md, "transformers
  # generate(prefill_chunk_size)", "Expandable segments and eager attention").
  [ -f "$W/models/hybrid12/config.json" ] || timeout 300 python3 "$VAL/hf_models.py" "$W/models" hybrid12 || return 1
  local case c cap
  for case in ${GEN_EXPANDABLE-6:4096 10:4096 6:8192 8:3072}; do
    cap=${case%:*} c=${case#*:}
    echo "--- expandable: chunk $c, cap $cap GiB"
    timeout 240 python3 "$VAL/hf_generate_chunked.py" "$W/models/hybrid12" --chunk "$c" --cap "$cap" \
      --expandable 2>&1 | grep -E "^(RESULT|OOM|held)" | tee "$W/gen-exp-c$c-cap$cap.txt"
  done
  for case in ${GEN_EAGER-6:1024 6:2048 10:2048 10:4096 14:3072}; do
    cap=${case%:*} c=${case#*:}
    echo "--- eager: chunk $c, cap $cap GiB"
    timeout 240 python3 "$VAL/hf_generate_chunked.py" "$W/models/hybrid12" --chunk "$c" --cap "$cap" \
      --attn eager 2>&1 | grep -E "^(RESULT|OOM|held)" | tee "$W/gen-eager-c$c-cap$cap.txt"
  done
}

cb_plan() {
  # Issue 31: the paged pool and batch of transformers' continuous batching at CB_PERCENTS, as
  # transformers logs them, on the dense model (the predictions were committed first:
  # docs/validation.md, "transformers continuous batching").
  [ -f "$W/models/dense/config.json" ] || timeout 300 python3 "$VAL/hf_models.py" "$W/models" dense || return 1
  cp "$W/models/dense/config.json" "$W/dense-config.json"
  timeout 300 python3 "$VAL/hf_cb_plan.py" "$W/models/dense" ${CB_PERCENTS:-0.15 0.5 0.9} 2>&1 |
    grep -E "^RESULT|Error|error" | tee "$W/cb-plan.txt"
}

generate_repeat() {
  # Issue 31: does recording move the refusal? GEN_REPEAT_CASE (chunk:cap) bare GEN_REPEAT
  # times, then as many times under vramtrace run.
  [ -f "$W/models/hybrid12/config.json" ] || timeout 300 python3 "$VAL/hf_models.py" "$W/models" hybrid12 || return 1
  local case=${GEN_REPEAT_CASE:-4096:6} n=${GEN_REPEAT:-3} i c cap d
  c=${case%:*} cap=${case#*:}
  for i in $(seq "$n"); do
    echo "--- bare $i: chunk $c, cap $cap GiB"
    timeout 200 python3 "$VAL/hf_generate_chunked.py" "$W/models/hybrid12" --chunk "$c" --cap "$cap" 2>&1 | grep -E "^OOM|^held"
  done
  for i in $(seq "$n"); do
    d=$W/gen-repeat-$i
    rm -rf "$d"
    echo "--- traced $i: chunk $c, cap $cap GiB"
    timeout 200 $VT run --quiet --out "$d" -- python3 "$VAL/hf_generate_chunked.py" "$W/models/hybrid12" \
      --chunk "$c" --cap "$cap" 2>&1 | grep -E "^OOM|^held"
    rm -rf "$d"
  done
}

STEPS=${*:-setup preload_probes torch_modes nvtx_and_processes fla_shapes fa_shapes workload costs}
export PYTHONPATH=/tmp/site
write_empty_del
for s in $STEPS; do [ "$s" = pack ] || run_step "$s" "$s"; done
# PACK=0 leaves the packing to a later `h200.sh pack` (steps run one by one under `timeout`);
# PACK_NAME names the tar (default: the first step).
[ "${PACK:-1}" = 0 ] && [ "$STEPS" != pack ] && exit 0
step "pack"
first=${PACK_NAME:-${STEPS%% *}}
# Files over PACK_MAX (default 6M) are gzipped beside themselves (a trace file is mostly space
# reserved ahead, zeros); those still over it stay behind, listed in left-out.txt: what comes
# back from the machine is limited in size.
(cd "$(dirname "$W")" && find "$(basename "$W")" -path '*/models' -prune -o -type f -size +"${PACK_MAX:-6M}" ! -name '*.gz' -print) |
  while read -r f; do gzip -1 -c "$(dirname "$W")/$f" > "$(dirname "$W")/$f.gz"; done
(cd "$(dirname "$W")" && find "$(basename "$W")" -path '*/models' -prune -o -type f -size +"${PACK_MAX:-6M}" -print) > "$W/left-out.txt"
sed 's/^/left out (size): /' "$W/left-out.txt"
tar -C "$(dirname "$W")" -czf "$OUT/results-$first.tar.gz" --exclude=models -X "$W/left-out.txt" "$(basename "$W")"
# One file back is at most 16 MiB: without the gzipped traces when they make it larger.
if [ "$(stat -c %s "$OUT/results-$first.tar.gz")" -gt $((15 << 20)) ]; then
  echo "the tar is over 15 MiB: packed again without the gzipped traces"
  tar -C "$(dirname "$W")" -czf "$OUT/results-$first.tar.gz" --exclude=models --exclude='*.vtr.gz' \
    -X "$W/left-out.txt" "$(basename "$W")"
fi
ls -la "$OUT/results-$first.tar.gz"
