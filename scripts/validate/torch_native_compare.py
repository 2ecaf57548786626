"""Compares a trace of torch_native_check.py (`vramtrace events --stacks DIR` as JSON lines on
stdin) with the truth it wrote (first argument): every tensor's block bytes, requested bytes and
Python line, every free of phase 1. Prints each difference and a verdict line; exits 1 on any
difference."""
import json
import sys

truth = json.load(open(sys.argv[1]))
allocs, frees = {}, []
for line in sys.stdin:
    e = json.loads(line)
    if e["kind"] == "tensor_alloc":
        allocs.setdefault(int(e["ptr"], 16), []).append(e)
    elif e["kind"] == "tensor_free":
        frees.append(int(e["ptr"], 16))

bad = 0
n_records = sum(map(len, allocs.values()))


def check(ptr, want, what):
    """Compares the earliest record of `ptr` not compared yet (an address freed in phase 1 is
    handed out again later)."""
    global bad
    got = allocs.get(ptr)
    if not got:
        print(f"MISSING {what} {ptr:#x}")
        bad += 1
        return
    e = got.pop(0)
    frames = [f for f in e.get("frames") or [] if f.get("file", "").endswith("torch_native_check.py")]
    line = (frames[0]["function"], frames[0]["line"]) if frames else None
    have = (e["size"], e.get("requested"), line)
    expect = (want["block"], want["requested"], (want["function"], want["line"]))
    if have != expect:
        print(f"DIFF {what} {ptr:#x}: recorded (block, requested, line) {have}, PyTorch {expect}")
        bad += 1


for t in truth["phase1"]:
    check(t["ptr"], t, "phase1")
for p, t in truth["phase2"].items():
    if t["requested"] != t["requested_in_segment"]:
        print(f"NOTE snapshot trace and segment disagree on {int(p):#x}: {t}")
    check(int(p), t, f"phase2/{t['who']}")
missing_frees = [p for p in truth["phase1_freed"] if p not in frees]
if missing_frees:
    print(f"MISSING frees {[hex(p) for p in missing_frees]}")
    bad += len(missing_frees)
n = len(truth["phase1"]) + len(truth["phase2"])
print(f"{'OK' if bad == 0 else 'FAILED'}: {n} tensors, {len(truth['phase1_freed'])} frees compared, "
      f"{bad} differences ({n_records} tensor records in the trace)")
sys.exit(1 if bad else 0)
