"""Per-tensor cost of each way of recording PyTorch's caching allocator, on the same loop:
`torch.empty(1 MiB, device="cuda"); del` repeated, best of 5 rounds, one mode per process.

Modes: bare; gpu_trace (no-op torch.cuda._gpu_trace callbacks); probe (vramtrace_torch.activate():
callbacks + size counter + the preload's TENSOR record with Python frames; run under the
preload); probe_shapes (the same with --torch-shapes' dispatch mode); history_python and
history_all (`torch.cuda.memory._record_memory_history(stacks=...)`).
Prints `mode NAME us_per_pair X`."""
import argparse
import os
import sys
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("mode")
ap.add_argument("--n", type=int, default=20000)
a = ap.parse_args()

torch.cuda.init()
x = torch.empty(1, device="cuda")
if a.mode == "gpu_trace":
    from torch.cuda import _gpu_trace

    _gpu_trace.register_callback_for_memory_allocation(lambda p: None)
    _gpu_trace.register_callback_for_memory_deallocation(lambda p: None)
    torch._C._activate_gpu_trace()
elif a.mode in ("probe", "probe_shapes"):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../probes/python"))
    import vramtrace_torch

    # `vramtrace run` has started the probe already (right after `import torch`); started by
    # hand otherwise.
    active = vramtrace_torch._state["active"] or vramtrace_torch.activate(
        shapes=a.mode == "probe_shapes")
    assert active, "run under vramtrace run (the preload must be loaded)"
elif a.mode.startswith("history_"):
    torch.cuda.memory._record_memory_history(stacks=a.mode.split("_")[1], max_entries=100000)
elif a.mode != "bare":
    sys.exit(f"unknown mode {a.mode}")


def loop(n):
    for _ in range(n):
        t = torch.empty(1 << 18, device="cuda")  # 1 MiB of f32
        del t


loop(1000)
torch.cuda.synchronize()
best = 1e9
for _ in range(5):
    t0 = time.perf_counter()
    loop(a.n)
    torch.cuda.synchronize()
    best = min(best, (time.perf_counter() - t0) / a.n)
print(f"mode {a.mode} us_per_pair {best * 1e6:.2f}")
