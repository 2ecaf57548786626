#!/usr/bin/env bash
# Cache lines native tensor capture touches per tensor, with cold caches, counted by cachegrind:
# a figure that a shared, noisy machine cannot blur, for comparing builds of the preload.
#   scripts/bench/torch_cachegrind.sh [PRELOAD.so ...]     (default: this tree's release build)
# Runs probes/python/tests/bench_tensors.py on the stand-in libc10 / libc10_cuda (as
# torch_capture.sh does) under `valgrind --tool=cachegrind`, with EVICT_BYTES (6000000) copied
# between the allocator's calls, so that each tensor finds the caches as a model's work leaves
# them (the simulated last level is 2 MiB, so nothing of the recorder's stays between two
# tensors), LIVE_TENSORS (200) kept live and DEPTH (24) Python frames down. Each preload runs
# twice, N1 (200) and N2 (600) tensors, and the difference divided by N2 - N1 is the figure per
# tensor, the start-up's cost cancelled.
# Counted: everything in Rust source (the preload is this process's only Rust), per tensor:
# instructions, first-level instruction and data misses (read, write) and last-level misses.
# Prints a table, one row per preload, then the functions with the most first-level misses per
# tensor (data, instructions) for the first, and those with the most instructions. Under valgrind
# the clock runs some fifty times slower, so the clock's anchor (`clock::anchor`, once per 2 ms) is
# taken far more often than in a real run: read its row apart. docs/performance.md, "Cold caches".
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
command -v valgrind >/dev/null || { echo "torch_cachegrind: needs valgrind (apt-get install valgrind)"; exit 1; }
N1=${N1:-200}
N2=${N2:-600}
[ "$N2" -gt "$N1" ] || { echo "torch_cachegrind: N2 ($N2) must be above N1 ($N1)"; exit 1; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$ROOT"
if [ $# -eq 0 ]; then
  cargo build --release -q -p vramtrace-preload
  set -- "${CARGO_TARGET_DIR:-$ROOT/target}/release/libvramtrace_preload.so"
fi
for so in "$@"; do [ -f "$so" ] || { echo "torch_cachegrind: no such preload: $so"; exit 1; }; done
. "$ROOT/scripts/bench/fake_torch.sh"
# The interpreter itself, not a shim script in front of it (valgrind does not follow exec).
PY=$(python3 -c 'import sys; print(sys.executable)')

i=0
for so in "$@"; do
  for n in "$N1" "$N2"; do
    echo "cachegrind: $so, $n tensors" >&2
    rm -rf "$W/trace"
    EVICT_BYTES=${EVICT_BYTES:-6000000} LIVE_TENSORS=${LIVE_TENSORS:-200} \
      PYTHONPATH="$ROOT/probes/python/autostart:$W/fake_torch" LD_PRELOAD="$so" \
      VRAMTRACE_DIR="$W/trace" VRAMTRACE_MAX_SIZE=4294967296 VRAMTRACE_TORCH_PROBE_STATS=1 \
      valgrind --tool=cachegrind --cache-sim=yes --I1=32768,8,64 --D1=49152,12,64 \
      --LL=2097152,16,64 --cachegrind-out-file="$W/cg.$i.$n" \
      "$PY" "$T/bench_tensors.py" "$n" 1 "${DEPTH:-24}" > "$W/out" 2> "$W/err" \
      || { echo "torch_cachegrind: the run failed:"; tail -5 "$W/err"; exit 1; }
    grep -q "capture=native" "$W/err" || { echo "torch_cachegrind: the probe did not capture natively:"; tail -5 "$W/err"; exit 1; }
  done
  i=$((i + 1))
done

python3 - "$W" "$N1" "$N2" "$@" <<'PY'
import collections, sys
w, n1, n2, preloads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]

def load(path):
    """Per function, the events summed over its Rust lines."""
    per_fn = collections.defaultdict(lambda: [0] * len(events))
    fl = fn = ""
    global events
    for line in open(path):
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("fl="):
            fl = line[3:].strip()
        elif line.startswith("fn="):
            fn = line[3:].strip()
        elif line[:1].isdigit() and fl.endswith(".rs"):
            v = per_fn[fn]
            for k, x in enumerate(line.split()[1:]):
                v[k] += int(x)
    return per_fn

events = []
rows = []
for i, so in enumerate(preloads):
    a, b = load(f"{w}/cg.{i}.{n1}"), load(f"{w}/cg.{i}.{n2}")
    per = {f: [(y - x) / (n2 - n1) for x, y in zip(a.get(f, [0] * len(events)), b[f])] for f in b}
    rows.append((so, per))
ix = {e: k for k, e in enumerate(events)}
def total(per, *names):
    return sum(v[ix[n]] for v in per.values() for n in names)
print(f"\nper tensor, {n2 - n1} tensors ({n1} to {n2}), the preload's Rust code only")
print("| preload | instructions | I1 misses | D1 read misses | D1 write misses | last-level misses |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for so, per in rows:
    print(f"| {so} | {total(per, 'Ir'):.0f} | {total(per, 'I1mr'):.1f} | {total(per, 'D1mr'):.1f} | "
          f"{total(per, 'D1mw'):.1f} | {total(per, 'ILmr', 'DLmr', 'DLmw'):.1f} |")
so, per = rows[0]
print(f"\nthe functions with the most first-level misses per tensor ({so}): data, instructions")
miss = lambda v: v[ix['D1mr']] + v[ix['D1mw']] + v[ix['I1mr']]
for f, v in sorted(per.items(), key=lambda kv: -miss(kv[1]))[:12]:
    print(f"  {v[ix['D1mr']] + v[ix['D1mw']]:6.1f} {v[ix['I1mr']]:6.1f}  {f[:100]}")
print(f"\nthe functions with the most instructions per tensor ({so})")
for f, v in sorted(per.items(), key=lambda kv: -kv[1][ix['Ir']])[:12]:
    print(f"  {v[ix['Ir']]:7.0f}  {f[:100]}")
PY
