#!/usr/bin/env python3
"""Does vramtrace's PyTorch snapshot show what PyTorch's own `_snapshot()` of the same run shows?

Usage:
  python3 snapshot_equal.py --locate OURS.pickle THEIRS.pickle
      OURS is `vramtrace export TRACE --format pytorch --max-entries 0` of the traced run (the
      whole run), THEIRS PyTorch's own snapshot taken in that run. Finds THEIRS' device trace
      as one contiguous run of OURS' and prints the moment its last entry was recorded, as the
      argument of `vramtrace export --until` (`@TIME_US`).
  python3 snapshot_equal.py OURS.pickle THEIRS.pickle
      OURS is the export as of that moment (`--until @TIME_US`). Compares, and exits 0 when
      they agree:
      - the device trace: THEIRS' entries (action, address, size) are one contiguous run of
        OURS' ending at OURS' last entry, and each `alloc` has the same frames (file name, line,
        function; vramtrace's own `filename: "vramtrace"` frames aside);
      - the segments: the same segments (device, address, total, allocated, active and
        requested bytes, type, expandable), split into the same blocks (address, size, state);
        each allocated block with the same requested size and, where THEIRS has frames, the
        same frames. THEIRS has no frames for a block allocated before its history began
        (`_record_memory_history` started then); OURS does, and is counted, not compared.
        A free block's requested size is not compared: PyTorch keeps there the request of a
        block that occupied it before a split or merge, which no record says.

Only the standard library is used, and no torch: both files are plain dicts, lists and tuples
(a pickle that names any class is refused). What the viewers draw is replayed from exactly
these fields (torch/cuda/_memory_viz.py: segments and device_traces), so equal fields are the
same picture; on a machine with torch, `snapshot_plots.sh` draws both for the eye.
"""
import io
import pickle
import sys


class _PlainOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name}: a snapshot is plain data")


def load(path):
    with open(path, "rb") as f:
        return _PlainOnly(io.BytesIO(f.read())).load()


def frames(fs):
    return [(f["filename"], f["line"], f["name"]) for f in fs or [] if f["filename"] != "vramtrace"]


def key(e):
    return (e["action"], e["addr"], e["size"])


def find_run(ours, theirs):
    """Index in `ours` where `theirs` starts as a contiguous run (the last such), or None."""
    n = len(theirs)
    want = [key(e) for e in theirs]
    got = [key(e) for e in ours]
    for i in range(len(got) - n, -1, -1):
        if got[i:i + n] == want:
            return i
    return None


def locate(ours, theirs):
    for d, t in enumerate(theirs["device_traces"]):
        if not t:
            continue
        o = ours["device_traces"][d] if d < len(ours["device_traces"]) else []
        i = find_run(o, t)
        if i is None:
            print(f"device {d}: PyTorch's {len(t)} entries are not one run of our {len(o)}")
            return 1
        end = o[i + len(t) - 1]
        print(f"@{end['time_us']}")
        return 0
    print("PyTorch's snapshot has no trace entry to locate")
    return 1


def compare(ours, theirs):
    problems = []
    notes = []
    # The device traces.
    for d, t in enumerate(theirs["device_traces"]):
        o = ours["device_traces"][d] if d < len(ours["device_traces"]) else []
        if not t:
            continue
        i = find_run(o, t)
        if i is None:
            problems.append(f"device {d}: PyTorch's {len(t)} trace entries are not one run of our {len(o)}")
            continue
        if i + len(t) != len(o):
            problems.append(
                f"device {d}: PyTorch's trace ends {len(o) - i - len(t)} entries before ours: "
                "export with --until at the moment PyTorch's snapshot was taken (--locate)")
        for a, b in zip(o[i:], t):
            if b["action"] == "alloc" and frames(a["frames"]) != frames(b["frames"]):
                problems.append(
                    f"device {d}: alloc at {b['addr']:#x}: frames differ:\n  ours   {frames(a['frames'])[:3]}\n"
                    f"  theirs {frames(b['frames'])[:3]}")
        acts = {}
        for e in t:
            acts[e["action"]] = acts.get(e["action"], 0) + 1
        notes.append(f"device {d}: {len(t)} trace entries the same ({', '.join(f'{n} {a}' for a, n in sorted(acts.items()))}), "
                     f"run at {i} of our {len(o)}")
    # The segments and their blocks.
    seg_key = lambda s: (s["device"], s["address"])
    mine = {seg_key(s): s for s in ours["segments"]}
    theirs_s = {seg_key(s): s for s in theirs["segments"]}
    for k in sorted(set(mine) | set(theirs_s)):
        a, b = mine.get(k), theirs_s.get(k)
        if a is None or b is None:
            problems.append(f"segment {k[1]:#x} (device {k[0]}) only in {'theirs' if a is None else 'ours'}")
            continue
        for f in ("total_size", "allocated_size", "active_size", "requested_size", "segment_type", "is_expandable"):
            if a[f] != b[f]:
                problems.append(f"segment {k[1]:#x}: {f} ours {a[f]} theirs {b[f]}")
        ab = [(x["address"], x["size"], x["state"]) for x in a["blocks"]]
        bb = [(x["address"], x["size"], x["state"]) for x in b["blocks"]]
        if ab != bb:
            problems.append(f"segment {k[1]:#x}: blocks differ:\n  ours   {ab}\n  theirs {bb}")
            continue
        for x, y in zip(a["blocks"], b["blocks"]):
            if y["state"] != "active_allocated":
                continue
            if x["requested_size"] != y["requested_size"]:
                problems.append(f"block {y['address']:#x}: requested_size ours {x['requested_size']} theirs {y['requested_size']}")
            if not y["frames"]:
                if frames(x["frames"]):
                    notes.append(f"block {y['address']:#x}: allocated before PyTorch's history began; ours has its frames")
            elif frames(x["frames"]) != frames(y["frames"]):
                problems.append(f"block {y['address']:#x}: frames differ:\n  ours   {frames(x['frames'])[:3]}\n"
                                f"  theirs {frames(y['frames'])[:3]}")
    blocks = sum(len(s["blocks"]) for s in theirs["segments"])
    active = sum(1 for s in theirs["segments"] for x in s["blocks"] if x["state"] == "active_allocated")
    notes.append(f"{len(theirs_s)} segments, {blocks} blocks ({active} allocated)")
    for n in notes:
        print(n)
    for p in problems:
        print("DIFFERS:", p)
    print("same picture" if not problems else f"{len(problems)} difference(s)")
    return 1 if problems else 0


def main(argv):
    if len(argv) == 4 and argv[1] == "--locate":
        return locate(load(argv[2]), load(argv[3]))
    if len(argv) == 3:
        return compare(load(argv[1]), load(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
