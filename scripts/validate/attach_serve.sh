#!/usr/bin/env bash
# Issue 21 on the H200: `vramtrace attach` on a `transformers serve` that is already serving.
#
# Starts the server (continuous batching, a random-weight dense model) WITHOUT vramtrace, measures
# its request rate, then attaches while steady requests run, records for $ATTACH_SECONDS, detaches,
# and measures the rate again. Also polls /health every 5 ms during the attach, so the pause is
# measured from the client's side too, and checks that the driver's code is byte for byte the
# same after detach. Then (issue 21's follow-up) that detach turned the Python probe off: the
# attach's last line, no record written after the detach (the trace file's hash and the tensor
# entries of its PyTorch export after the detach's wall-clock time), the rate after equal to the
# rate before; and that the state at attach is named: the summary's categories at the peak and
# the probe's naming mark; and whether it recorded natively (libc10's report hooked in place).
#
# Expects .device/bin/{vramtrace,libvramtrace_preload.so} and the helpers beside this script.
# Usage: scripts/validate/attach_serve.sh        (as root: ptrace on the H200 needs it)
# Environment: WORK (default /tmp/vramtrace-validation/w), SERVE_PORT (8766), ROUNDS (3),
#              ATTACH_SECONDS (60).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$ROOT/.device/bin
VT=$BIN/vramtrace
VAL=$ROOT/scripts/validate
W=${WORK:-/tmp/vramtrace-validation/w}
PORT=${SERVE_PORT:-8766}
ROUNDS=${ROUNDS:-3}
SECS=${ATTACH_SECONDS:-60}
M=$W/models/dense
D=$W/attach-serve
export PYTHONUNBUFFERED=1
# The Python probe that attach starts inside the server (its autostart directory).
export VRAMTRACE_PYTHON_PROBE=$ROOT/probes/python/autostart
mkdir -p "$W" "${HF_HUB_CACHE:-$HOME/.cache/huggingface/hub}"
rm -rf "$D" "$D".*

[ -f "$M/config.json" ] || timeout 300 python3 "$VAL/hf_models.py" "$W/models" dense || exit 1
TF=$(command -v transformers 2>/dev/null || echo "$(dirname "$(python3 -c 'import sys; print(sys.executable)')")/transformers")

load() { # $1: label, $2: rounds
  timeout 900 python3 "$VAL/serve_load.py" "$PORT" "$M" --requests 16 --prompt-tokens 1500 \
    --max-tokens 96 --rounds "$2" --wait 300 > "$D.load-$1" 2>&1
  local rc=$?
  echo "--- load $1 (exit $rc)"; cat "$D.load-$1"
}

driver_code_hash() { # the sha256 of libcuda's executable mappings in process $1
  python3 - "$1" <<'PY'
import hashlib, sys
pid = sys.argv[1]
h = hashlib.sha256()
with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
    for line in maps:
        f = line.split()
        if len(f) >= 6 and "libcuda.so" in f[5] and f[1] == "r-xp":
            a, b = (int(x, 16) for x in f[0].split("-"))
            mem.seek(a)
            h.update(mem.read(b - a))
print(h.hexdigest())
PY
}

echo "=== server ($(date +%T))"
"$TF" serve "$M" --port "$PORT" --continuous-batching > "$D.server" 2>&1 &
SERVER=$!
sleep 8
if ! kill -0 $SERVER 2>/dev/null; then
  echo "serve with a positional model exited early; starting it without:"; tail -5 "$D.server"
  "$TF" serve --port "$PORT" --continuous-batching > "$D.server" 2>&1 &
  SERVER=$!
fi
echo "server pid $SERVER"

echo "=== before ($(date +%T))"
load warmup 1
load before "$ROUNDS"
grep -q "libcuda" /proc/$SERVER/maps || { echo "the server has not loaded libcuda"; exit 1; }
HASH_BEFORE=$(driver_code_hash $SERVER)

echo "=== attached under load ($(date +%T))"
# Steady requests for longer than the attach, a /health poller, then the attach.
load during $((ROUNDS * 3)) &
LOADER=$!
python3 - "$PORT" "$((SECS + 20))" > "$D.health" <<'PY' &
import sys, time, urllib.request
port, secs = int(sys.argv[1]), float(sys.argv[2])
end = time.time() + secs
worst, n, fails = 0.0, 0, 0
while time.time() < end:
    t = time.perf_counter()
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).read()
    except Exception:
        fails += 1
    dt = time.perf_counter() - t
    worst, n = max(worst, dt), n + 1
    time.sleep(0.005)
print(f"health polls {n}, failures {fails}, slowest {worst * 1e3:.1f} ms")
PY
POLLER=$!
sleep 10
"$VT" attach $SERVER --out "$D" --duration "${SECS}s" --preload "$BIN/libvramtrace_preload.so" \
  2> "$D.attach"
echo "attach exit $?"
DETACHED_WALL_NS=$(date +%s%N)
TRACE_HASH_AT_DETACH=$(cat "$D"/*.vtr | sha256sum | cut -c1-16)
cat "$D.attach"; cat "$D/attach.json"
echo "--- how the probe recorded tensors while attached (native unless a note says why not)"
grep -a -o "native tensor capture off ([^;]*" "$D"/*.vtr | head -2
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('reportMemoryUsageToProfiler hooked:', any('reportMemoryUsageToProfiler' in h for h in r['hooked']), '; left alone:', r.get('left_alone'))" "$D/attach.json"
HASH_AFTER=$(driver_code_hash $SERVER)
echo "driver code before $HASH_BEFORE"
echo "driver code after  $HASH_AFTER"
[ "$HASH_BEFORE" = "$HASH_AFTER" ] && echo "driver code: restored byte for byte" || echo "!!! driver code differs"
wait $LOADER; wait $POLLER
echo "--- /health during the attach"; cat "$D.health"

echo "=== after ($(date +%T))"
load after "$ROUNDS"
kill -0 $SERVER && echo "server still running after detach"
echo "--- the Python probe at detach"
grep -a "Python probe" "$D.attach"
python3 -c "import json,sys; print('attach.json python_probe_at_detach:', json.load(open(sys.argv[1])).get('python_probe_at_detach'))" "$D/attach.json"
TRACE_HASH_AFTER=$(cat "$D"/*.vtr | sha256sum | cut -c1-16)
echo "trace files at detach $TRACE_HASH_AT_DETACH, after the load after it $TRACE_HASH_AFTER"
[ "$TRACE_HASH_AT_DETACH" = "$TRACE_HASH_AFTER" ] && echo "trace: nothing written after the detach" \
  || echo "!!! the trace files changed after the detach (a block sealed at a thread's exit, or records: the count below tells)"

echo "=== the trace ($(date +%T))"
"$VT" summary "$D" | head -60
"$VT" events "$D" > "$D.events.jsonl"
echo "events: $(wc -l < "$D.events.jsonl"); labelled before attach: $(grep -c '"label":"before attach"' "$D.events.jsonl")"
grep -a -o "before attach: device [^\"]*" "$D"/*.vtr | head -4
"$VT" export "$D" --format pytorch -o "$D.snapshot.pickle" 2>&1 | tail -1
echo "--- entries after the detach (wall clock) in the PyTorch export: there must be none"
python3 - "$D.snapshot.pickle" "$DETACHED_WALL_NS" <<'PY'
import collections, pickle, sys
snap = pickle.load(open(sys.argv[1], "rb"))
after_us = int(sys.argv[2]) // 1000
n = collections.Counter()
total = 0
for trace in snap.get("device_traces", []):
    for e in trace:
        total += 1
        if e.get("time_us", 0) > after_us:
            n[e.get("action")] += 1
print(f"entries {total}; after the detach: {sum(n.values())} {dict(n)}")
PY
echo "--- the state at attach, named (the probe's mark; the categories at the peak)"
grep -a -o "before attach: n[^\"]*" "$D"/*.vtr | head -2
grep -a -o "state at attach is not named[^\"]*" "$D"/*.vtr | head -2
"$VT" summary "$D" | sed -n '/what the memory holds/,/^ *total /p' | head -60

kill -INT $SERVER; sleep 5; kill -KILL $SERVER 2>/dev/null
wait $SERVER 2>/dev/null
echo "=== done ($(date +%T)): compare the rounds of load-before and load-after; load-during must show no failure"
