"""Writes torch_snapshot.pickle: a memory snapshot in the exact shape of
`torch.cuda.memory._snapshot()` (torch 2.x: segments with blocks, device_traces with
segment_alloc / alloc / free_requested / free_completed / oom entries and their frames,
allocator_settings), built with nothing but the standard library's pickle, for
tests/import_cli.rs. Run: python3 tests/data/make_torch_snapshot.py

The story, on device 0 (times in µs since the epoch):
- before the history began: a 2 MiB small segment with one active 512 KiB block (`bias`);
- a 20 MiB segment, an 8 MiB block (`h`, chunk_delta_h.py:240) and a 4 MiB block
  (`o`, chunk_o.py:565) inside it, the 8 MiB block freed;
- a request of 12 MiB refused (`oom`, 1 GiB free on the device): the 20 MiB segment holds the
  4 MiB block at offset 8 MiB, so its largest free block is 8 MiB.
"""
import pickle
from pathlib import Path

MIB = 1 << 20
BASE = 0x7F3A00000000
SMALL = 0x7F3900000000
T0 = 1_764_500_000_000_000


def frames(py_file, py_line, py_name):
    # PyTorch's frames, innermost first: C++ (allocator), then Python, as _snapshot() returns
    # them with _record_memory_history(stacks="all").
    return [
        {"filename": "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "line": 1390, "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)"},
        {"filename": "??", "line": 0, "name": "at::native::empty_cuda(...)"},
        {"filename": py_file, "line": py_line, "name": py_name},
        {"filename": "/app/model.py", "line": 42, "name": "forward"},
    ]


H = frames("/site/fla/ops/common/chunk_delta_h.py", 240, "chunk_gated_delta_rule_fwd_h")
O = frames("/site/fla/ops/common/chunk_o.py", 565, "chunk_fwd_o")
OOM = frames("/site/fla/ops/common/chunk_o.py", 570, "chunk_fwd_o")
BIAS = frames("/app/model.py", 12, "__init__")


def entry(action, addr, size, t, fr, **extra):
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": T0 + t, "frames": fr}
    e.update(extra)
    return e


snapshot = {
    "segments": [
        {
            "device": 0, "address": SMALL, "total_size": 2 * MIB, "allocated_size": 512 * 1024,
            "active_size": 512 * 1024, "requested_size": 500 * 1024, "stream": 0,
            "segment_type": "small", "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": BIAS,
            "blocks": [
                {"address": SMALL, "size": 512 * 1024, "requested_size": 500 * 1024,
                 "state": "active_allocated", "frames": BIAS},
                {"address": SMALL + 512 * 1024, "size": 2 * MIB - 512 * 1024,
                 "requested_size": 0, "state": "inactive", "frames": []},
            ],
        },
        {
            "device": 0, "address": BASE, "total_size": 20 * MIB, "allocated_size": 4 * MIB,
            "active_size": 4 * MIB, "requested_size": 4 * MIB, "stream": 0,
            "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": H,
            "blocks": [
                {"address": BASE, "size": 8 * MIB, "requested_size": 0, "state": "inactive", "frames": []},
                {"address": BASE + 8 * MIB, "size": 4 * MIB, "requested_size": 4 * MIB,
                 "state": "active_allocated", "frames": O},
                {"address": BASE + 12 * MIB, "size": 8 * MIB, "requested_size": 0, "state": "inactive", "frames": []},
            ],
        },
    ],
    "device_traces": [
        [
            entry("segment_alloc", BASE, 20 * MIB, 100, H),
            entry("alloc", BASE, 8 * MIB, 101, H),
            entry("alloc", BASE + 8 * MIB, 4 * MIB, 200, O),
            entry("free_requested", BASE, 8 * MIB, 300, H),
            entry("free_completed", BASE, 8 * MIB, 301, H),
            entry("oom", 0, 12 * MIB, 400, OOM, device_free=1 << 30),
        ]
    ],
    "allocator_settings": {
        "PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
        "expandable_segments": False, "pinned_num_register_threads": 1,
        "release_lock_on_cudamalloc": False, "pinned_use_cuda_host_register": False,
        "roundup_power2_divisions": {},
    },
}

out = Path(__file__).with_name("torch_snapshot.pickle")
out.write_bytes(pickle.dumps(snapshot, protocol=2))
print(out)
