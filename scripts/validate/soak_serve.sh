#!/usr/bin/env bash
# Issue 34 on the GPU: growth over a run (docs/validation.md, "Growth over days").
#   serve-steady  transformers serve --continuous-batching, steady load, no leak
#   serve-leak    the same server with a planted leak (leak_site/sitecustomize.py: every chat
#                 completion keeps an 8 MiB CUDA tensor), its kept tensors logged
#   decode        a decode loop whose reserve settles (decode_soak.py)
# all three at once on one card, each under `vramtrace run`, for SOAK_SECONDS (120); then each
# trace's report --json growth, summary's line, report.md's growth section and the growth plot.
# Needs $VT, $W, $VAL, hf_models' dense model at $W/models/dense and the transformers CLI ($TF).
set -uo pipefail
S=${SOAK_SECONDS:-120}
m=$W/models/dense
mkdir -p "${HF_HUB_CACHE:-$HOME/.cache/huggingface/hub}"
rm -rf "$W"/soak-* "$W/leak.log"
start_server() { # NAME PORT [ENV...]
  local name=$1 port=$2
  shift 2
  env "$@" $VT run --quiet --out "$W/soak-$name" -- "$TF" serve "$m" --port "$port" \
    --continuous-batching --cb-max-memory-percent 0.2 > "$W/soak-$name.stdout" 2>&1 &
}
start_server steady 8771
start_server leak 8772 PYTHONPATH="$VAL/leak_site${PYTHONPATH:+:$PYTHONPATH}" LEAK_LOG="$W/leak.log"
$VT run --quiet --out "$W/soak-decode" -- python3 "$VAL/decode_soak.py" "$m" "$S" > "$W/soak-decode.stdout" 2>&1 &
decode=$!
. "$VAL/soak_load.sh"
load 8771 1 > "$W/soak-steady.load" 2>&1 &
l1=$!
load 8772 2 > "$W/soak-leak.load" 2>&1 &
l2=$!
wait $l1 $l2
pkill -INT -f "transformers serve"
for _ in $(seq 30); do pgrep -f "transformers serve" >/dev/null || break; sleep 1; done
pkill -KILL -f "transformers serve"
wait $decode
sleep 2
echo "leak log: $(wc -l < "$W/leak.log") kept tensors"
python3 - "$W/leak.log" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
t = [float(r[0]) for r in rows]
b = [int(r[1]) for r in rows]
if len(t) > 1:
    print(f"planted: {sum(b[1:])} bytes over {t[-1]-t[0]:.3f} s = {sum(b[1:])/(t[-1]-t[0])*3600:.0f} B/h")
PY
for name in steady leak decode; do
  d=$W/soak-$name
  echo "=== $name: $(du -sh "$d" | cut -f1)"
  tail -3 "$d.stdout" | cut -c1-300
  tail -2 "$d.load" 2>/dev/null
  $VT report "$d" --json > "$d.json" && python3 - "$d.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))["growth"]
print("verdict", g["verdict"], "rate", round(g["rate_bytes_per_hour"]), "+-", round(g["rate_uncertainty_bytes_per_hour"]),
      "steady from", g["steady_from_s"], "of", round(g["duration_s"], 1))
for l in g["lines"][:6]:
    print("  ", l["verdict"], round(l["bytes_per_hour"]), l["live_bytes"], l["level"], l["where"])
for r in g["reserve"]:
    print("  reserve", r)
for e in g["evidence"]:
    print("  evidence:", e)
PY
  $VT report "$d" -o "$d-report" > /dev/null && sed -n '/^## Growth over the run/,/^## /p' "$d-report/report.md" | head -40 > "$d.growth.md"
  $VT plot "$d" --kind growth -o "$d.growth.png"
done
