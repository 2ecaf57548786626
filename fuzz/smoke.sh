#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 20) from seeds built out of the repository's own
# samples, and fails on the first crash. CI calls it as a smoke run; docs/reliability.md records
# a long run (`fuzz/smoke.sh 300`). Stable toolchains: RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass
# its -Z sanitizer flags.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-20}"
# Pinned, with its own lock file: a new release never changes what CI runs unannounced.
cargo_fuzz_version=0.13.2
cargo fuzz --version 2>/dev/null | grep " $cargo_fuzz_version\$" >/dev/null ||
  cargo install cargo-fuzz --version "$cargo_fuzz_version" --locked
export RUSTC_BOOTSTRAP=1

# Seeds: the sample traces (their first 64 KiB: header, first blocks, a torn tail), the sample
# configs, and the argument forms the CLI documents.
seeds=seeds
mkdir -p "$seeds/trace_reader" "$seeds/config" "$seeds/args"
for f in ../samples/h200/*/*.vtr; do
  head -c 65536 "$f" > "$seeds/trace_reader/$(basename "$(dirname "$f")")-$(basename "$f")"
done
for f in ../samples/models/*/config.json; do
  cp "$f" "$seeds/config/$(basename "$(dirname "$f")").json"
done
i=0
for a in 24GiB 23.5GiB "512 MiB" 80GB 1.5G 0 peak oom oom:3 0..1.5 1.5..2 1024..65536 1..1 nan..inf; do
  printf '%s' "$a" > "$seeds/args/$i"; i=$((i + 1))
done

for t in trace_reader config args; do
  mkdir -p "corpus/$t"
  cargo fuzz run -O "$t" "corpus/$t" "$seeds/$t" -- \
    -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
done
