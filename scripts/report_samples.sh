#!/bin/sh
# Regenerates the stored reports of the samples (report.md, report.json, report.html and the
# plots) with the vramtrace built here; no GPU is needed, the traces are read as recorded.
#   scripts/report_samples.sh            # uses target/debug/vramtrace (cargo build first)
#   VT=target/release/vramtrace scripts/report_samples.sh
set -eu
VT=${VT:-target/debug/vramtrace}
CFG=samples/models/Qwen3.6-27B/config.json

one() { # OUT TRACE ARGS...
  out=$1; trace=$2; shift 2
  rm -rf "$out"
  "$VT" report "$trace" --model "$CFG" --variant fla-0.6.0 "$@" --json -o "$out" >/dev/null
  "$VT" report "$trace" --model "$CFG" --variant fla-0.6.0 "$@" --html -o "$out" >/dev/null
  echo "$out: $(grep -m1 '^\*\*Verdict' "$out/report.md" | cut -c1-100)..."
}

D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
"$VT" demo --simulate --out "$D/demo" >/dev/null 2>&1
one samples/demo-report "$D/demo"
one samples/h200/torch-oom/report samples/h200/torch-oom --layers 16
one samples/h200/prefill-18gib/report samples/h200/prefill-18gib --capacity 18GiB --hide other
