#!/usr/bin/env bash
# PyTorch's own viewers on our snapshot and on PyTorch's, side by side (needs torch; no GPU).
#
# Usage: scripts/validate/snapshot_plots.sh OURS.pickle THEIRS.pickle OUTDIR
# OURS is `vramtrace export TRACE --format pytorch [--until @TIME_US]`, THEIRS PyTorch's own
# `_snapshot()` of the same run. Writes into OUTDIR, for each of ours and theirs:
#   *-trace.html     python3 -m torch.cuda._memory_viz trace_plot    (the memory_viz timeline)
#   *-segments.html  python3 -m torch.cuda._memory_viz segment_plot  (the segments and blocks)
#   *-stats.txt      python3 -m torch.cuda._memory_viz stats         (the totals, as text)
#   *-trace.txt      python3 -m torch.cuda._memory_viz trace         (every entry, as text)
# and compare.txt, PyTorch's own comparison of the two snapshots' segments
# (`_memory_viz.compare` on their `segments`: segments only in one of them; none when the
# pictures agree; its command line, `_memory_viz compare`, fails on dict snapshots in torch
# 2.11, so the function is called directly).
# The HTML files open in any browser; pytorch.org/memory_viz takes the pickles themselves.
set -uo pipefail
[ $# -eq 3 ] || { sed -n '2,13p' "$0"; exit 2; }
ours=$1 theirs=$2 out=$3
mkdir -p "$out"
viz() { python3 -m torch.cuda._memory_viz "$@"; }
status=0
for who in ours theirs; do
  f=${!who}
  viz trace_plot "$f" -o "$out/$who-trace.html" || status=1
  viz segment_plot "$f" -o "$out/$who-segments.html" || status=1
  viz stats "$f" > "$out/$who-stats.txt" 2>&1 || status=1
  viz trace "$f" > "$out/$who-trace.txt" 2>&1 || status=1
done
python3 - "$ours" "$theirs" > "$out/compare.txt" 2>&1 <<'PY' || status=1
import pickle, sys
from torch.cuda import _memory_viz
ours, theirs = (pickle.load(open(f, "rb")) for f in sys.argv[1:3])
print(_memory_viz.compare(ours["segments"], theirs["segments"]))
PY
diff "$out/ours-stats.txt" "$out/theirs-stats.txt" > "$out/stats.diff" && echo "stats: the same" ||
  echo "stats differ: $out/stats.diff"
ls -la "$out"
cat "$out/compare.txt"
exit $status
