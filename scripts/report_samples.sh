#!/bin/sh
# Regenerates every stored output of the samples (compare.txt, summary.txt, report/ with
# report.md, report.json, report.html and the plots, the plots of prefill-18gib) with the
# vramtrace built here, from the commands listed in samples/outputs.tsv (one per output; the
# test tests/samples_outputs.rs runs the same commands and compares). No GPU is needed: the
# traces are read as recorded.
#   scripts/report_samples.sh            # uses target/debug/vramtrace (cargo build first)
#   VT=target/release/vramtrace scripts/report_samples.sh
set -eu
VT=${VT:-target/debug/vramtrace}
LIST=samples/outputs.tsv

D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
"$VT" demo --simulate --out "$D/demo" >/dev/null 2>&1

grep -v '^#' "$LIST" | while IFS="$(printf '\t')" read -r out args; do
  [ -n "$out" ] || continue
  # shellcheck disable=SC2086 # the arguments are words without spaces
  set -- $args
  a=""
  for w in "$@"; do
    case $w in
      @demo) w="$D/demo" ;;
      @out) w="$out" ;;
    esac
    a="$a $w"
  done
  # shellcheck disable=SC2086
  set -- $a
  case $out in
    */)
      rm -rf "$out"
      "$VT" "$@" --json -o "$out" >/dev/null
      "$VT" "$@" --html -o "$out" >/dev/null
      echo "$out: $(grep -m1 '^\*\*' "$out/report.md" | cut -c1-100)..."
      ;;
    *.png)
      "$VT" "$@" >/dev/null
      echo "$out"
      ;;
    *)
      "$VT" "$@" >"$out"
      echo "$out: $(wc -l <"$out") lines"
      ;;
  esac
done
