#!/usr/bin/env bash
# The live view at the tensor level on a running server (issue 20, items 2 and 3):
# `transformers serve --continuous-batching` with the random-weight dense Qwen3 of
# scripts/validate/hf_models.py, recorded by `vramtrace run`, followed by `vramtrace live` under
# tmux with --model (the forecast line) while serve_load.py sends requests; the screens are
# captured with `tmux capture-pane -p` at each step into $W/live-serve/*.txt:
#   01-follow.txt        following, the largest-live table (tensors, their Python lines)
#   02-by-line.txt       `t`: the live tensors grouped by Python line
#   03-model.txt         `t` again: the whole-step model beside the observed categories
#   03b-tensors.txt      `t` again: the modelled step's tensors beside the live ones (the
#                        serving path's tensors are not the prefill step's: expect `unmatched`)
#   04-peak.txt          `t` (back to the largest-live table) and `p`: paused at the peak of
#                        the bytes in use
#   04b-peak-tensors.txt `t` three times: the tensors table at that peak
#   05-exited.txt        after the server stopped: the process marked exited, NVML's panel
#                        without an untraced figure
#   06-fla-loop.txt      an fla loop with caching on (scripts/validate/model_vs_torch.py): the
#                        view keeps moving after the segments are cached
# Usage (on the GPU machine, after scripts/validate/prepare.sh here):
#   bash scripts/validate/live_serve.sh            (WORK= as h200.sh)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VT=$ROOT/.device/bin/vramtrace
VAL=$ROOT/scripts/validate
W=${WORK:-/tmp/vramtrace-validation/w}
PORT=${SERVE_PORT:-8772}
OUT=$W/live-serve
export PYTHONUNBUFFERED=1
command -v tmux > /dev/null || { echo "live_serve.sh needs tmux"; exit 1; }
mkdir -p "$W" "$OUT"
[ -f "$W/models/dense/config.json" ] || python3 "$VAL/hf_models.py" "$W/models" dense || exit 1
M=$W/models/dense
TF=$(command -v transformers 2>/dev/null || echo "$(dirname "$(python3 -c 'import sys; print(sys.executable)')")/transformers")
D=$W/live-serve-trace
rm -rf "$D"
"$VT" run --quiet --out "$D" -- "$TF" serve "$M" --port "$PORT" --continuous-batching > "$OUT/serve.log" 2>&1 &
SERVER=$!
cap() { sleep "${2:-3}"; tmux capture-pane -p -t vtlive > "$OUT/$1"; echo "captured $OUT/$1"; }
tmux kill-session -t vtlive 2> /dev/null
tmux new-session -d -s vtlive -x 160 -y 48 \
  "VRAMTRACE_LIVE_LOG=$OUT/live-polls.log $VT live $D --model $M/config.json --runtime transformers --chunk 1500 --kv-block-size 256; sleep 600"
python3 "$VAL/serve_load.py" "$PORT" "$M" --requests 4 --prompt-tokens 200 --max-tokens 8 --wait 240 > /dev/null
python3 "$VAL/serve_load.py" "$PORT" "$M" --requests 16 --prompt-tokens 1500 --max-tokens 96 --rounds 4 --wait 10 > "$OUT/load.txt" &
LOAD=$!
# The client takes seconds to import its tokenizer: the screens are taken once it sends (the
# first call of 2026-12-01 took them all before it did, of a server with nothing to do).
for _ in $(seq 600); do grep -q "ready after" "$OUT/load.txt" 2> /dev/null && break; sleep 0.1; done
# The trace's size each second beside the view's log of its reads (live-polls.log).
( while kill -0 $LOAD 2> /dev/null; do echo "$(date +%s.%N) $(du -b "$D"/*.vtr 2> /dev/null | tr '\n' ' ')"; sleep 1; done ) > "$OUT/trace-sizes.log" &
cap 01-follow.txt 3
tmux send-keys -t vtlive t; cap 02-by-line.txt 2
tmux send-keys -t vtlive t; cap 03-model.txt 2
tmux send-keys -t vtlive t; cap 03b-tensors.txt 2
tmux send-keys -t vtlive t p; cap 04-peak.txt 3
tmux send-keys -t vtlive t t t; cap 04b-peak-tensors.txt 2
wait $LOAD
# Stop the server itself (the recorder's child): interrupted, then killed if it lingers.
SERVE_PID=$(pgrep -f "serve $M --port $PORT" | grep -vx "$SERVER" | head -1)
kill -INT $SERVER ${SERVE_PID:-} 2> /dev/null
for _ in $(seq 20); do kill -0 ${SERVE_PID:-$SERVER} 2> /dev/null || break; sleep 1; done
kill -KILL $SERVER ${SERVE_PID:-} 2> /dev/null
tmux send-keys -t vtlive f; cap 05-exited.txt 4
cap 05b-exited-later.txt 8
tmux kill-session -t vtlive
"$VT" summary "$D" > "$OUT/summary.txt" 2>&1
# The trace itself, when it is small enough to come back (a view that fell behind is read here).
for f in "$D"/*.vtr; do
  gzip -1 -c "$f" > "$OUT/$(basename "$f").gz"
  [ "$(stat -c %s "$OUT/$(basename "$f").gz")" -le $((14 << 20)) ] || { echo "left out: $f (gzipped over 14 MiB)"; rm "$OUT/$(basename "$f").gz"; }
done
# fla with caching on, followed while it runs (LIVE_FLA=0 skips it).
[ "${LIVE_FLA:-1}" = 0 ] && { echo "screens in $OUT"; exit 0; }
D2=$W/live-fla-trace
rm -rf "$D2"
"$VT" run --quiet --out "$D2" -- python3 "$VAL/model_vs_torch.py" --kernel gdn --seqlens 4128 --warmup 40 > "$OUT/fla.log" 2>&1 &
FLA=$!
tmux new-session -d -s vtlive -x 160 -y 48 "$VT live $D2; sleep 600"
cap 06-fla-loop-a.txt 8
cap 06-fla-loop-b.txt 4
wait $FLA
tmux kill-session -t vtlive
echo "screens in $OUT"
