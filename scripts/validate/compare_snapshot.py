#!/usr/bin/env python3
"""Sets PyTorch's own record beside the preload's driver-level events for one mode.

Usage: python3 compare_snapshot.py CAPTURE.json EVENTS.jsonl
EVENTS.jsonl is `vramtrace events TRACE_DIR`. Prints a table and exits non-zero when, with
caching off, the driver allocation sizes differ from PyTorch's tensor sizes.
"""
import json
import sys


def main() -> int:
    cap = json.load(open(sys.argv[1]))
    events = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
    mode = cap["mode"]
    no_cache = mode["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
    snap_allocs = [e["size"] for e in cap["snapshot_trace"] if e["action"] == "alloc"]
    drv = [e for e in events if e["kind"] in ("alloc", "alloc_failed") and e["mem"] in ("device", "array")]
    apis = sorted({e["api"] for e in events})
    print(f"mode: {mode}")
    print(f"driver functions seen: {', '.join(apis)}")
    print(f"requested tensor bytes:        {cap['requested']}")
    print(f"snapshot alloc sizes:          {snap_allocs}")
    # Group repeats (expandable segments map thousands of 20 MiB chunks) so the line stays short.
    groups = []
    for e in drv:
        key = (e["api"], e["size"], e["kind"])
        if groups and groups[-1][0] == key:
            groups[-1][1] += 1
        else:
            groups.append([key, 1])
    print("driver allocations (api, size, kind) x count: " + ", ".join(f"{k} x{n}" if n > 1 else str(k) for k, n in groups))
    segs = [e["size"] for e in cap["snapshot_trace"] if e["action"] == "segment_alloc"]
    if segs:
        print(f"snapshot segment_alloc sizes:  {segs}")
    failed = [e for e in events if e["kind"] == "alloc_failed"]
    for f in failed:
        print(f"failed: {f['api']} size={f['size']} free={f.get('free_bytes')} total={f.get('total_bytes')}")
    print(f"torch OOM message: {cap['oom_message']}")
    if no_cache:
        # One driver allocation per tensor, in order: compare with the requested sizes and with
        # the snapshot where it recorded them.
        ok_allocs = [e["size"] for e in drv if e["kind"] == "alloc"]
        # Allocations torch makes for itself before our first tensor (none expected) would show
        # here as a prefix; compare the tail.
        tail = ok_allocs[-len(cap["requested"]):]
        same = tail == cap["requested"]
        print(f"caching off: driver sizes == requested tensor sizes one for one: {same}")
        if snap_allocs:
            print(f"caching off: driver sizes == snapshot alloc sizes: {tail == snap_allocs}")
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
