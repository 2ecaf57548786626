#!/usr/bin/env bash
# Issue 33: a pinned llama.cpp source small enough to carry to the GPU machine, from the tree
# vendored in the llama-cpp-python 0.3.36 sdist (the package registry's), stripped to what the
# CUDA build of llama-bench, llama-completion and llama-fit-params needs plus gguf-py; written to
# .device/llama.cpp.tar.xz (ignored by git). Run here (it needs the registry); the GPU machine
# builds it (scripts/validate/h200.sh llama_build).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${LLAMA_WORK:-/tmp/vramtrace-llama}
VERSION=0.3.36
mkdir -p "$WORK" "$ROOT/.device"
cd "$WORK"
if [ ! -f "llama_cpp_python-$VERSION.tar.gz" ]; then
  # Preparing the sdist's metadata needs scikit-build-core and cmake importable.
  python3 -m pip install -q --target "$WORK/skb" scikit-build-core cmake
  PYTHONPATH=$WORK/skb PATH=$WORK/skb/bin:$PATH python3 -m pip download -q --no-deps \
    --no-binary :all: --no-build-isolation "llama-cpp-python==$VERSION" -d .
fi
rm -rf src && mkdir src && tar -C src -xzf "llama_cpp_python-$VERSION.tar.gz"
T=src/llama_cpp_python-$VERSION/vendor/llama.cpp
# Only the CPU and CUDA backends, three tools, no docs, models, tests, examples or web UI.
for d in "$T"/ggml/src/ggml-*/; do
  case $(basename "$d") in ggml-cpu|ggml-cuda) ;; *) rm -rf "$d" ;; esac
done
rm -rf "$T"/{docs,tests,examples,pocs,media,benches,app,ci,skills,scripts,conversion,grammars,requirements}
find "$T/models" -type f ! -name 'ggml-vocab-llama-spm.gguf' ! -name 'ggml-vocab-qwen2.gguf' -delete
for d in "$T"/tools/*/; do
  case $(basename "$d") in llama-bench|fit-params|completion|quantize) ;; *) rm -rf "$d" ;; esac
done
cat > "$T/tools/CMakeLists.txt" <<'CM'
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(completion)
add_subdirectory(fit-params)
add_subdirectory(quantize)
CM
tar -C "$(dirname "$T")" -cJf "$ROOT/.device/llama.cpp.tar.xz" llama.cpp
du -h "$ROOT/.device/llama.cpp.tar.xz"
