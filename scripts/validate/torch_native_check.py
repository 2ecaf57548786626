"""Native tensor capture against PyTorch's own figures, on the GPU (scripts/validate/
torch_native.sh check). Run under `vramtrace run --out DIR`; writes the truth to the JSON file
given as the first argument, which `torch_native_compare.py` compares with DIR.

Phase 1, one thread: 24 tensors of odd sizes (small pool, large pool, over 10 MiB), every third
freed; each block's size is the move of `allocated_bytes` (nothing else allocates meanwhile).
Phase 2, two threads at once: the main thread on the default stream and a worker on a side
stream, 200 tensors each, kept until `torch.cuda.memory._snapshot()`, whose trace gives each
tensor's requested bytes and stream and whose segments give each block's size.
`_record_memory_history` is on throughout (it shares `record_trace` with the tracker, which
changes nothing for it)."""
import json
import os
import sys
import threading

import torch

out_path = sys.argv[1]
SRC = open(__file__).read().splitlines()


def line_of(marker):
    return next(i + 1 for i, l in enumerate(SRC) if l.rstrip().endswith("# " + marker))


torch.cuda.init()
torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
dev = torch.cuda.current_device()


def allocated():
    return torch.cuda.memory_stats(dev)["allocated_bytes.all.current"]


truth = {"phase1": [], "phase1_freed": [], "phase2": {}}
keep = []
for i in range(24):
    n = [333_333, 1_048_577, 3_000_001, 12_345_679][i % 4] + 4099 * i
    a0 = allocated()
    t = torch.empty(n, dtype=torch.uint8, device="cuda")  # P1
    truth["phase1"].append({"ptr": t.data_ptr(), "requested": n, "block": allocated() - a0,
                            "line": line_of("P1"), "function": "<module>"})
    if i % 3 == 2:
        truth["phase1_freed"].append(t.data_ptr())
        del t
    else:
        keep.append(t)

side = torch.cuda.Stream()
start = threading.Barrier(2)
phase2 = {"main": [], "worker": []}


def allocate_many(who):
    start.wait()
    for i in range(200):
        n = 10_000 + 7_919 * i + (0 if who == "main" else 3)
        t = torch.empty(n, dtype=torch.uint8, device="cuda")  # P2
        phase2[who].append(t)


def worker():
    with torch.cuda.stream(side):
        allocate_many("worker")


th = threading.Thread(target=worker)
th.start()
allocate_many("main")
th.join()
torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)

blocks = {}
for seg in snap["segments"]:
    addr = seg["address"]
    for b in seg["blocks"]:
        if b["state"] == "active_allocated":
            blocks[addr] = (b["size"], b["requested_size"])
        addr += b["size"]
alloc_trace = {}
for e in snap["device_traces"][dev]:
    if e["action"] == "alloc":
        alloc_trace[e["addr"]] = (e["size"], e["stream"])
for who, ts in phase2.items():
    for t in ts:
        p = t.data_ptr()
        size, stream = alloc_trace[p]
        truth["phase2"][str(p)] = {"who": who, "requested": size, "block": blocks[p][0],
                                   "requested_in_segment": blocks[p][1], "stream": stream,
                                   "line": line_of("P2"), "function": "allocate_many"}
truth["side_stream"] = side.cuda_stream
json.dump(truth, open(out_path, "w"))
print(f"phase1 {len(truth['phase1'])} phase2 {len(truth['phase2'])} tensors")
