#!/usr/bin/env python3
"""Is PyTorch's own snapshot of a run, imported, the same tensor set as vramtrace's record of it?

Usage: python3 same_tensors.py OURS.jsonl IMPORTED.jsonl
Both are `vramtrace events DIR` output: OURS of the traced run (the PyTorch probe's tensor
events), IMPORTED of `vramtrace import SNAPSHOT -o DIR` for the snapshot that run took of its
measured call. The snapshot covers only that call, so its tensor events (allocations and frees,
pointer and size, in order) must appear as one contiguous run inside ours. Exits 0 when they do.
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
            out.append((e["kind"][len("tensor_"):], e["ptr"], e["size"]))
    return out


def main() -> int:
    ours, theirs = tensor_events(sys.argv[1]), tensor_events(sys.argv[2])
    n = len(theirs)
    print(f"ours: {len(ours)} tensor events; PyTorch's snapshot (imported): {n}")
    if n == 0:
        print("verdict: the snapshot holds no tensor event")
        return 1
    # The import allocates what was live before the history began at its start: those lead
    # `theirs` and were allocated earlier in ours. Try skipping each number of them.
    lead = 0
    while lead < n and theirs[lead][0] == "alloc":
        lead += 1
    best, at, skip = -1, -1, 0
    for s in range(lead + 1):
        window = theirs[s:]
        m = len(window)
        for i in range(len(ours) - m + 1):
            k = 0
            while k < m and ours[i + k] == window[k]:
                k += 1
            if k > best or (k == m and best < m):
                best, at, skip = k, i, s
            if k == m:
                break
        if best == m and all(e in ours[:at] for e in theirs[:s]):
            break
    if skip:
        print(f"{skip} allocation(s) live before PyTorch's history began (imported at its start), "
              f"each allocated earlier in ours: {all(e in ours[:at] for e in theirs[:skip])}")
        theirs = theirs[skip:]
        n = len(theirs)
    allocs = sum(1 for e in theirs if e[0] == "alloc")
    nbytes = sum(e[2] for e in theirs if e[0] == "alloc")
    if best == n:
        print(f"verdict: same — all {n} events ({allocs} allocations, {nbytes} bytes) appear in order "
              f"in ours from event {at}")
        return 0
    print(f"verdict: different — the longest common run is {best} of {n} events (from our event {at})")
    if at >= 0 and best < n:
        print(f"  first difference: ours {ours[at + best] if at + best < len(ours) else None}, snapshot {theirs[best]}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
