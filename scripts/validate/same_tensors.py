#!/usr/bin/env python3
"""Is PyTorch's own snapshot of a run, imported, the same tensor set as vramtrace's record of it?

Usage: python3 same_tensors.py OURS.jsonl IMPORTED.jsonl
Both are `vramtrace events DIR` output: OURS of the traced run (the PyTorch probe's tensor
events), IMPORTED of `vramtrace import SNAPSHOT -o DIR` for the snapshot that run took of its
measured call. The import allocates what was live before PyTorch's history began at its very
first instant; those blocks must have been allocated earlier in ours. The rest, the measured
call's allocations (pointer and requested bytes) and frees (pointer), in order, must appear as
one contiguous run inside ours. Exits 0 when they do.
"""
import json
import sys


def tensor_events(path):
    out = []
    for line in open(path):
        if not line.strip():
            continue
        e = json.loads(line)
        if e.get("kind") in ("tensor_alloc", "tensor_free"):
            # The request where the record has it (PyTorch's snapshot entries are requests);
            # a free is keyed by its pointer.
            alloc = e["kind"] == "tensor_alloc"
            size = e.get("requested", e["size"]) if alloc else None
            out.append((e["t_ns"], ("alloc" if alloc else "free", e["ptr"], size)))
    return out


def main() -> int:
    ours = [e for _, e in tensor_events(sys.argv[1])]
    imported = tensor_events(sys.argv[2])
    if not imported:
        print("verdict: the snapshot holds no tensor event")
        return 1
    t0 = min(t for t, _ in imported)
    before = [e for t, e in imported if t == t0 and any(t2 > t0 for t2, _ in imported)]
    theirs = [e for t, e in imported if not (t == t0 and e in before)]
    n = len(theirs)
    print(f"ours: {len(ours)} tensor events; PyTorch's snapshot (imported): {len(imported)}, "
          f"of them {len(before)} live before its history began and {n} in the measured call")
    best, at = -1, -1
    for i in range(len(ours) - n + 1):
        k = 0
        while k < n and ours[i + k] == theirs[k]:
            k += 1
        if k > best:
            best, at = k, i
        if k == n:
            break
    earlier = all(e in ours[:at] for e in before) if at >= 0 else False
    allocs = sum(1 for e in theirs if e[0] == "alloc")
    nbytes = sum(e[2] for e in theirs if e[0] == "alloc")
    print(f"  the {len(before)} live before: each allocated earlier in ours: {earlier}")
    if best == n and earlier:
        print(f"verdict: same — all {n} events of the call ({allocs} allocations, {nbytes} bytes "
              f"requested) appear in order in ours from event {at}")
        return 0
    print(f"verdict: different — the longest common run is {best} of {n} events (from our event {at})")
    if 0 <= at and best < n:
        print(f"  first difference: ours {ours[at + best] if at + best < len(ours) else None}, "
              f"snapshot {theirs[best]}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
