# Sourced by soak_serve.sh and soak_variants.sh: the steady load of the growth runs (issue 34).
# load PORT TAG: one warm-up round, then rounds of 4 concurrent chat completions (400 prompt
# tokens, 24 new) one after another for $S seconds, against the model at $m; each call's
# prompts start with words of its own (TAG), so no server answers from a cached prefix.
load() {
  local t_end=$((SECONDS + S)) r=0
  python3 "$VAL/serve_load.py" "$1" "$m" --requests 4 --prompt-tokens 400 --max-tokens 24 \
    --rounds 1 --wait 240 --tag "$2" > /dev/null || true
  while [ $SECONDS -lt $t_end ]; do
    python3 "$VAL/serve_load.py" "$1" "$m" --requests 4 --prompt-tokens 400 --max-tokens 24 \
      --rounds 5 --wait 10 --tag $(( $2 * 1000 + r )) | tail -1
    r=$((r + 1))
  done
}
