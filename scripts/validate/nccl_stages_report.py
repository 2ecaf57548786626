#!/usr/bin/env python3
"""Sets NVML's per-process used memory beside the traced live device bytes, stage by stage.

Usage: python3 nccl_stages_report.py STDOUT EVENTS.jsonl
STDOUT holds the ranks' `STAGE {json}` lines (scripts/validate/nccl_stages.py); EVENTS.jsonl is
`vramtrace events TRACE_DIR` of the same run. Per rank and stage: NVML used, traced device bytes
live then (driver allocations and cuMemCreate handles of that process, `mem == "device"`, less
the releases of those very pointers and handles), the difference (context, modules, what the trace does not see),
and how that difference moved since the previous stage. Unmatched releases are listed with the
stage they fall in.
"""
import bisect
import json
import sys

MIB = 1 << 20


def main() -> int:
    stages = [json.loads(l.split("STAGE ", 1)[1]) for l in open(sys.argv[1]) if "STAGE {" in l]
    events = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
    by_pid = {}
    for e in events:
        by_pid.setdefault(e["pid"], []).append(e)
    for pid in sorted({s["pid"] for s in stages}):
        evs = by_pid.get(pid, [])
        # Paired by pointer or handle: a release of an imported or retained handle is not this
        # process's device bytes.
        times, levels, live, held = [], [], 0, {}
        for e in evs:
            if e.get("kind") == "alloc" and e.get("mem") == "device":
                held[e["ptr"]] = e["size"]
                live += e["size"]
            elif e.get("kind") == "free" and e["ptr"] in held:
                live -= held.pop(e["ptr"])
            else:
                continue
            times.append(e["t_ns"])
            levels.append(live)
        ss = sorted((s for s in stages if s["pid"] == pid), key=lambda s: s["t_ns"])
        print(f"--- rank {ss[0]['rank']} pid {pid} (module loading {ss[0]['module_loading']}, "
              f"stack limit {ss[0].get('stack_limit')} B per thread)")
        print(f"  {'stage':<52} {'NVML MiB':>9} {'traced MiB':>11} {'NVML-traced':>12} {'moved':>8} {'torch reserved MiB':>19}")
        prev = None
        for s in ss:
            i = bisect.bisect_right(times, s["t_ns"]) - 1
            traced = levels[i] / MIB if i >= 0 else 0.0
            nv = s["nvml_mib"]
            gap = None if nv is None else nv - traced
            moved = "" if gap is None or prev is None else f"{gap - prev:+.1f}"
            print(f"  {s['stage']:<52} {nv if nv is not None else '-':>9} {traced:>11.1f} "
                  f"{gap if gap is None else round(gap, 1):>12} {moved:>8} {s['torch_reserved'] / MIB:>19.1f}")
            prev = gap if gap is not None else prev
        apis = {}
        for e in evs:
            if e.get("mem") == "device" and e.get("kind") in ("alloc", "free"):
                k = (e["api"], e["kind"])
                apis[k] = apis.get(k, 0) + 1
        print("  device calls:", ", ".join(f"{a} {k} {n}" for (a, k), n in sorted(apis.items())))
        for e in evs:
            if e.get("unmatched"):
                j = bisect.bisect_right([s["t_ns"] for s in ss], e["t_ns"])
                where = ss[j - 1]["stage"] if j > 0 else "before stage 1"
                print(f"  unmatched release: {e['api']} {e['mem']} {e['ptr']} after '{where}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
