#!/usr/bin/env bash
# Issue 34, item 3 on the GPU: the planted-leak server (leak_site/sitecustomize.py) recorded as
# people record long runs (docs/validation.md, "Growth over days"):
#   ring    `vramtrace run --max-size RING_SIZE` (24MiB): the ring drops early tensor detail
#   attach  started bare, loaded, then `vramtrace attach --duration ATTACH_SECONDS` (60)
# both at once under steady load for SOAK_SECONDS (100); then each trace's growth.
# Needs $VT, $BIN, $W, $VAL, $ROOT, hf_models' dense model and the transformers CLI ($TF).
set -uo pipefail
S=${SOAK_SECONDS:-100}
m=$W/models/dense
export VRAMTRACE_PYTHON_PROBE=$ROOT/probes/python/autostart
mkdir -p "${HF_HUB_CACHE:-$HOME/.cache/huggingface/hub}"
rm -rf "$W"/soakv-* "$W"/leakv-*.log
LEAKPATH="$VAL/leak_site${PYTHONPATH:+:$PYTHONPATH}"
env PYTHONPATH="$LEAKPATH" LEAK_LOG="$W/leakv-ring.log" $VT run --quiet --max-size "${RING_SIZE:-24MiB}" \
  --out "$W/soakv-ring" -- "$TF" serve "$m" --port 8781 --continuous-batching \
  --cb-max-memory-percent 0.2 > "$W/soakv-ring.stdout" 2>&1 &
env PYTHONPATH="$LEAKPATH" LEAK_LOG="$W/leakv-attach.log" "$TF" serve "$m" --port 8782 \
  --continuous-batching --cb-max-memory-percent 0.2 > "$W/soakv-attach.stdout" 2>&1 &
server=$!
. "$VAL/soak_load.sh"
load 8781 3 > "$W/soakv-ring.load" 2>&1 &
l1=$!
load 8782 4 > "$W/soakv-attach.load" 2>&1 &
l2=$!
sleep 30
pid=$(pgrep -f "serve $m --port 8782" | head -1)
echo "attaching to $pid"
$VT attach "$pid" --out "$W/soakv-attach" --duration "${ATTACH_SECONDS:-60}s" \
  --preload "$BIN/libvramtrace_preload.so" 2> "$W/soakv-attach.attach"
echo "attach exit $?"; tail -3 "$W/soakv-attach.attach"
wait $l1 $l2
pkill -INT -f "serve $m"
for _ in $(seq 30); do pgrep -f "serve $m" >/dev/null || break; sleep 1; done
pkill -KILL -f "serve $m"
sleep 2
for name in ring attach; do
  d=$W/soakv-$name
  echo "=== $name: $(du -sh "$d" | cut -f1)"
  python3 - "$W/leakv-$name.log" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
t = [float(r[0]) for r in rows]; b = [int(r[1]) for r in rows]
if len(t) > 1:
    print(f"planted: {len(t)} kept, {sum(b[1:])/(t[-1]-t[0])*3600:.0f} B/h over the whole run")
PY
  $VT summary "$d" | grep -E "^growth:|dropped|lost" | head -5
  $VT report "$d" --json > "$d.json" && python3 - "$d.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))["growth"]
print("verdict", g["verdict"], "rate", round(g["rate_bytes_per_hour"]), "steady from", g["steady_from_s"], "of", round(g["duration_s"], 1))
print("rests on:", g["rests_on"])
for l in g["lines"][:4]:
    print("  ", l["verdict"], round(l["bytes_per_hour"]), "+-", round(l["uncertainty_bytes_per_hour"]), l["live_bytes"], l["level"], l["where"], l["oldest"][:1])
for e in g["evidence"]:
    print("  evidence:", e)
PY
  $VT plot "$d" --kind growth -o "$d.growth.png"
done
