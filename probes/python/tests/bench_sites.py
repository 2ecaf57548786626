"""The stand-in bench of native capture's stack memo: N tensors, each a block of the stand-in
libc10_cuda.so's allocator handed out and taken back from one of SITES functions in turn (each
its own stack, as a model's layers allocate from some hundreds of lines), DEPTH Python frames
down; best of 5 loops. Run as scripts/bench/torch_capture.sh runs bench_tensors.py, with the
preload and the probe (VRAMTRACE_SELF_TIME=1 prints the memo's misses as `miss=NSxCOUNT`):

  python3 bench_sites.py N SITES DEPTH       (e.g. 30000 300 20)

prints `ns_per_tensor X tensors N`."""
import ctypes
import sys
import time

import torch

n, sites, depth = (int(a) for a in sys.argv[1:4])
torch.cuda._lazy_init()  # as torch.cuda.init(): the probe attaches and checks here
lib = torch.cuda._c10()
assert lib is not None, "the stand-in libc10_cuda.so is missing"
block, segment = ctypes.c_uint64(), ctypes.c_uint64()
scope = {"malloc": lib.fake_c10_malloc, "release": lib.fake_c10_free,
         "out": ctypes.byref(block), "seg": ctypes.byref(segment)}
# SITES distinct functions: each call site is its own code object, so its own stack.
exec("\n".join(f"def f{i}():\n    release(malloc(1 << 20, 0, 0x5150, out, seg), 0, 0x5150)\n"
               for i in range(sites)), scope)
calls = [scope[f"f{i}"] for i in range(sites)]


def loop():
    for k in range(n):
        calls[k % sites]()


def deep(k):
    return loop() if k <= 0 else deep(k - 1)


best = None
for _ in range(5):
    t0 = time.perf_counter_ns()
    deep(depth)
    dt = (time.perf_counter_ns() - t0) / n
    best = dt if best is None else min(best, dt)
print(f"ns_per_tensor {best:.1f} tensors {n * 5}")
