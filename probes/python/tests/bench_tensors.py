"""The stand-in bench of the PyTorch probe (scripts/bench/torch_capture.sh): N tensors, each a
block of the stand-in libc10_cuda.so's allocator handed out and taken back, called from Python
as `torch.empty` and a tensor's release reach PyTorch's allocator (one call each into the
library), with the `torch.cuda._gpu_trace` callbacks dispatched around them as PyTorch does
when any are registered (the callback path registers them; bare and native capture do not).
Best of ROUNDS loops, run DEPTH Python frames deep (a third argument, default 0: a model's
forward under `generate` allocates some 30-50 frames down); prints `ns_per_tensor X tensors N`.

With EVICT_BYTES set, each tensor's life and the gap after it copy that many bytes from one
buffer to another, as a model's own work between two allocations pushes the recorder's data out
of the caches (a decode step on the H200 does some 20 µs of work between two tensors). The time
per tensor then measures the copies too, so the bench also prints `call_ns_per_tensor`: the time
spent inside the allocator's two calls alone (the recorder's work runs inside them), best loop.

With PAUSE_CAPTURE=1 (under the preload) tensor capture is paused (`vramtrace_torch.pause()`)
before the loops: what is left is what a paused recorder costs."""
import collections
import ctypes
import os
import sys
import time

import torch
from torch.cuda import _gpu_trace

n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
depth = int(sys.argv[3]) if len(sys.argv) > 3 else 0
torch.cuda._lazy_init()  # as torch.cuda.init(): the probe attaches and checks here
if os.environ.get("PAUSE_CAPTURE") == "1":
    import vramtrace_torch

    vramtrace_torch.pause("bench_tensors.py: PAUSE_CAPTURE=1")
lib = torch.cuda._c10()
assert lib is not None, "the stand-in libc10_cuda.so is missing"
malloc, release = lib.fake_c10_malloc, lib.fake_c10_free
on_alloc, on_free = _gpu_trace.alloc_callbacks, _gpu_trace.free_callbacks
size, stream = 1 << 20, 0x5150
block, segment = ctypes.c_uint64(), ctypes.c_uint64()
out, seg = ctypes.byref(block), ctypes.byref(segment)
evict = int(os.environ.get("EVICT_BYTES", "0"))
keep = int(os.environ.get("LIVE_TENSORS", "0"))
src, dst = bytearray(evict), bytearray(evict)


def loop():
    for _ in range(n):
        ptr = malloc(size, 0, stream, out, seg)
        for cb in on_alloc:
            cb(ptr)
        for cb in on_free:
            cb(ptr)
        release(ptr, 0, stream)


def evicting_loop():
    """`loop` with the copies between the calls; returns the ns spent inside the calls. With
    LIVE_TENSORS=K each tensor is released K tensors later, so that K stay live, as a model's
    weights, cache and activations do (the recorder's live-tensor table then holds K)."""
    clock = time.perf_counter_ns
    inside = 0
    live = collections.deque()
    for _ in range(n):
        t0 = clock()
        live.append(malloc(size, 0, stream, out, seg))
        inside += clock() - t0
        dst[:] = src
        if len(live) > keep:
            t0 = clock()
            release(live.popleft(), 0, stream)
            inside += clock() - t0
        src[:] = dst
    while live:
        release(live.popleft(), 0, stream)
    return inside


def deep(k):
    if k > 0:
        return deep(k - 1)
    if evict:
        assert not on_alloc and not on_free, "EVICT_BYTES times the allocator's calls alone"
        return evicting_loop()
    return loop()


best = best_inside = None
for _ in range(rounds):
    t0 = time.perf_counter_ns()
    inside = deep(depth)
    dt = (time.perf_counter_ns() - t0) / n
    best = dt if best is None else min(best, dt)
    if inside is not None:
        best_inside = inside / n if best_inside is None else min(best_inside, inside / n)
print(f"ns_per_tensor {best:.1f} tensors {n * rounds}"
      + (f" call_ns_per_tensor {best_inside:.1f}" if best_inside is not None else ""))
