"""The stand-in bench of the PyTorch probe (scripts/bench/torch_capture.sh): N tensors, each a
block of the stand-in libc10_cuda.so's allocator handed out and taken back, called from Python
as `torch.empty` and a tensor's release reach PyTorch's allocator (one call each into the
library), with the `torch.cuda._gpu_trace` callbacks dispatched around them as PyTorch does
when any are registered (the callback path registers them; bare and native capture do not).
Best of ROUNDS loops, run DEPTH Python frames deep (a third argument, default 0: a model's
forward under `generate` allocates some 30-50 frames down); prints `ns_per_tensor X tensors N`."""
import ctypes
import sys
import time

import torch
from torch.cuda import _gpu_trace

n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
depth = int(sys.argv[3]) if len(sys.argv) > 3 else 0
torch.cuda._lazy_init()  # as torch.cuda.init(): the probe attaches and checks here
lib = torch.cuda._c10()
assert lib is not None, "the stand-in libc10_cuda.so is missing"
malloc, release = lib.fake_c10_malloc, lib.fake_c10_free
on_alloc, on_free = _gpu_trace.alloc_callbacks, _gpu_trace.free_callbacks
size, stream = 1 << 20, 0x5150
block, segment = ctypes.c_uint64(), ctypes.c_uint64()
out, seg = ctypes.byref(block), ctypes.byref(segment)


def loop():
    for _ in range(n):
        ptr = malloc(size, 0, stream, out, seg)
        for cb in on_alloc:
            cb(ptr)
        for cb in on_free:
            cb(ptr)
        release(ptr, 0, stream)


def deep(k):
    return loop() if k <= 0 else deep(k - 1)


best = None
for _ in range(rounds):
    t0 = time.perf_counter_ns()
    deep(depth)
    dt = (time.perf_counter_ns() - t0) / n
    best = dt if best is None else min(best, dt)
print(f"ns_per_tensor {best:.1f} tensors {n * rounds}")
