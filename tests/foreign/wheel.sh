#!/usr/bin/env bash
# The wheel as a user gets it: installed into a fresh venv, with no flags and no vramtrace
# environment variables.
#
#   tests/foreign/wheel.sh WHEEL
#
# Checks, in order:
#   - every ELF file in the wheel needs no glibc above its platform tag nor above 2.28
#     (scripts/check_glibc_floor.sh);
#   - `vramtrace run -- <C program linked with -lcuda>` records on the stand-in driver (put on
#     LD_LIBRARY_PATH by hand: the wheel does not ship it), finding the preload in the venv;
#   - `vramtrace run -- python -m vllm.entrypoints.openai.api_server` (a stand-in vLLM that
#     spawns a worker, tests/foreign/stand_in_vllm) records the server and its worker;
#   - the docker-compose / systemd way (docs/deploy.md): LD_PRELOAD=$(python -m vramtrace
#     --preload) and VRAMTRACE_DIR in the environment, no CLI: the same server is recorded;
#   - the preload in programs that never touch CUDA (sh, python3, the venv's own pip): a silent
#     pass-through (same output, nothing on stderr, exit 0, no trace);
#   - the Python probe imports (`from vramtrace import probe`) and is a no-op without the preload;
#   - a damaged install (the preload deleted) gets a message naming the missing file;
#   - `--preload` of another architecture's library is refused with the reason.
# Needs python3 with venv, cc, and the stand-in driver built (cargo build -p vramtrace-fakecuda).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
wheel=$(realpath "$1")
fail=0
ok() { echo "ok    $*"; }
bad() { echo "FAIL  $*" >&2; fail=1; }

scripts/check_glibc_floor.sh --max 2.28 "$wheel"

work=$(mktemp -d "${TMPDIR:-/tmp}/vramtrace-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index "$wheel"
vt=$work/venv/bin/vramtrace
py=$work/venv/bin/python
# Nothing of the build: not the source tree's preload, not its variables.
unset VRAMTRACE_PRELOAD VRAMTRACE_PYTHON_PROBE VRAMTRACE_DIR LD_PRELOAD

# The stand-in driver, from the cargo build, under its soname.
cargo build -q -p vramtrace-fakecuda --lib
mkdir -p "$work/driver"
ln -s "$root/target/debug/libcuda.so" "$work/driver/libcuda.so.1"
ln -s "$root/target/debug/libcuda.so" "$work/driver/libcuda.so"
export LD_LIBRARY_PATH=$work/driver${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

preload=$("$py" -m vramtrace --preload)
case "$preload" in
  "$work"/venv/lib/python*/site-packages/vramtrace/libvramtrace_preload.so) ok "python -m vramtrace --preload: $preload" ;;
  *) bad "python -m vramtrace --preload gave $preload" ;;
esac

# A C program on the stand-in driver, under `vramtrace run` with no flags.
cc -O1 -o "$work/linked" tests/c/linked.c -I probes/preload/tests/c -L "$work/driver" -lcuda -ldl -lpthread
(cd "$work" && "$vt" run --out trace-c -- ./linked) >"$work/c.out" 2>"$work/c.err" || { cat "$work/c.err" >&2; bad "vramtrace run -- ./linked failed"; }
n=$("$vt" events "$work/trace-c" | grep -c '"kind":"alloc"' || true)
[ "$n" -gt 0 ] && ok "vramtrace run -- ./linked: $n allocations recorded" || bad "vramtrace run -- ./linked recorded no allocation"

# The stand-in vLLM server under `vramtrace run`: the server and its spawned worker.
export PYTHONPATH=$root/tests/foreign/stand_in_vllm
"$vt" run --out "$work/trace-run" -- "$py" -m vllm.entrypoints.openai.api_server --model stand-in \
  --kv-bytes 123456789 >"$work/run.out" 2>"$work/run.err" || { cat "$work/run.err" >&2; bad "vramtrace run -- python -m vllm... failed"; }
if "$vt" events "$work/trace-run" | grep -q '"size":123456789'; then
  ok "vramtrace run -- python -m vllm.entrypoints.openai.api_server: the worker's KV cache recorded"
else
  bad "vramtrace run -- python -m vllm...: no 123456789-byte allocation"
fi

# The compose / systemd way: the environment only.
LD_PRELOAD=$preload VRAMTRACE_DIR=$work/trace-env "$py" -m vllm.entrypoints.openai.api_server \
  --kv-bytes 98765432 >"$work/env.out" 2>"$work/env.err" || { cat "$work/env.err" >&2; bad "LD_PRELOAD server failed"; }
files=$(ls "$work/trace-env" | grep -c '\.vtr$' || true)
if "$vt" events "$work/trace-env" | grep -q '"size":98765432'; then
  ok "LD_PRELOAD + VRAMTRACE_DIR: the server recorded ($files trace files)"
else
  bad "LD_PRELOAD + VRAMTRACE_DIR: no 98765432-byte allocation"
fi
unset PYTHONPATH

# Programs that never touch CUDA: a silent pass-through.
passthrough() { # NAME CMD...
  local name=$1
  shift
  local want got
  want=$("$@" 2>&1)
  got=$(LD_PRELOAD=$preload VRAMTRACE_DIR=$work/trace-none "$@" 2>"$work/pt.err")
  if [ "$got" = "$want" ] && [ ! -s "$work/pt.err" ] && [ ! -e "$work/trace-none" ]; then
    ok "$name with the preload: same output, nothing on stderr, no trace"
  else
    bad "$name with the preload: output differs or stderr: $(cat "$work/pt.err")"
  fi
}
passthrough "sh" sh -c 'echo hello; ls / >/dev/null'
passthrough "python3" "$py" -c 'import ctypes, ssl, sqlite3; print(ctypes.CDLL(None).getpid() > 0)'
passthrough "pip" "$py" -m pip --version

# The Python probe.
out=$("$py" -c 'from vramtrace import probe as vt; print(vt.loaded()); import vramtrace_probe; print(vramtrace_probe is vt)')
[ "$out" = $'False\nTrue' ] && ok "from vramtrace import probe: imports, a no-op without the preload" || bad "the probe: $out"
out=$(LD_PRELOAD=$preload "$py" -c 'from vramtrace import probe as vt; print(vt.loaded())')
[ "$out" = True ] && ok "the probe sees the preload when it is loaded" || bad "the probe under the preload: $out"

# Another architecture's library for --preload: refused with the reason.
foreign=$work/foreign.so
"$py" - "$foreign" <<'PY'
import struct, sys, platform
machine = 62 if platform.machine() == "aarch64" else 183
h = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9) + struct.pack("<HH", 3, machine) + bytes(44)
open(sys.argv[1], "wb").write(h)
PY
if err=$("$vt" run --out "$work/trace-x" --preload "$foreign" -- true 2>&1); then
  bad "--preload of another architecture was accepted"
elif grep -q "is built for" <<<"$err" && grep -q "e_machine" <<<"$err"; then
  ok "--preload of another architecture refused: $(tail -n1 <<<"$err")"
else
  bad "--preload of another architecture: $err"
fi

# A damaged install: the preload deleted from the venv.
mv "$preload" "$preload.gone"
if err=$("$vt" run --out "$work/trace-d" -- true 2>&1); then
  bad "a damaged install ran"
elif grep -qF "$preload" <<<"$err" && grep -q "damaged" <<<"$err"; then
  ok "damaged install: $(tail -n1 <<<"$err")"
else
  bad "damaged install: $err"
fi
err=$("$py" -m vramtrace --preload 2>&1) && bad "python -m vramtrace --preload with no preload" || true
grep -qF "$preload" <<<"$err" && ok "python -m vramtrace --preload names the missing file" || bad "python -m vramtrace --preload: $err"
mv "$preload.gone" "$preload"

[ $fail = 0 ] && echo "wheel: all checks passed" || { echo "wheel: some checks failed" >&2; exit 1; }
