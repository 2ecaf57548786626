#!/usr/bin/env python3
"""A small PyTorch allocation pattern, run under `vramtrace run` in each allocator mode.

It allocates tensors of known sizes (some freed, some kept), records PyTorch's own view with
`torch.cuda.memory._record_memory_history()` / `_snapshot()`, and writes that view as JSON so
`compare_snapshot.py` can set it beside what the preload saw at the driver.

Usage: python3 torch_capture.py OUT.json
The allocator mode comes from the environment (PYTORCH_CUDA_ALLOC_CONF,
PYTORCH_NO_CUDA_MEMORY_CACHING), exactly as a server would get it.
"""
import json
import os
import sys

import torch

# Sizes in bytes, chosen to cross the caching allocator's classes: small (<= 1 MiB), 1-10 MiB,
# >= 10 MiB, and one size that is not a multiple of 512.
SIZES = [4096, 512 * 1000, 3 << 20, 50 << 20, 48 * 4128 * 128 * 2, 1000]


def main() -> None:
    out = sys.argv[1]
    torch.cuda.init()
    try:
        torch.cuda.memory._record_memory_history(max_entries=100000)
        recording = True
    except RuntimeError as e:  # backend:cudaMallocAsync has no history
        print(f"torch_capture: no allocator history in this mode: {e}", file=sys.stderr)
        recording = False
    keep = []
    tensors = []
    for i, n in enumerate(SIZES):
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        tensors.append((n, t.data_ptr()))
        if i % 2 == 0:
            keep.append(t)
        else:
            del t
    # A failed allocation: far more than the card has.
    failed = None
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    except (torch.OutOfMemoryError, RuntimeError) as e:  # caching off raises AcceleratorError
        failed = str(e).splitlines()[0]
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot() if recording else {}
    if recording:
        torch.cuda.memory._record_memory_history(enabled=None)
    trace = []
    for dev in snap.get("device_traces", []):
        for e in dev:
            if e["action"] in ("alloc", "free_completed", "segment_alloc", "segment_free", "oom", "segment_map", "segment_unmap"):
                trace.append({"action": e["action"], "addr": e.get("addr"), "size": e.get("size")})
    json.dump(
        {
            "torch": torch.__version__,
            "mode": {
                "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                "PYTORCH_NO_CUDA_MEMORY_CACHING": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", ""),
            },
            "requested": [n for n, _ in tensors],
            "ptrs": [p for _, p in tensors],
            "snapshot_trace": trace,
            "segments": [
                {"address": s["address"], "total_size": s["total_size"], "segment_type": s.get("segment_type")}
                for s in snap.get("segments", [])
            ],
            "oom_message": failed,
        },
        open(out, "w"),
        indent=1,
    )
    del keep


if __name__ == "__main__":
    main()
