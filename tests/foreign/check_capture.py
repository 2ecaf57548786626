"""Checks what the preload's C test programs recorded (run by aarch64_capture.sh under qemu, or
natively) against what they printed, through the CLI: `vramtrace events --stacks DIR`.

    python3 tests/foreign/check_capture.py VRAMTRACE_CLI WORK_DIR

WORK_DIR holds NAME.out (the program's stdout) and NAME.trace/ (its trace directory) for each
program. Every failure is listed, then the exit code is 1.
"""
import json
import os
import subprocess
import sys

cli, work = sys.argv[1], sys.argv[2]
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def out(name):
    with open(os.path.join(work, name + ".out")) as f:
        return f.read()


def lines(name, word):
    return [l.split()[1:] for l in out(name).splitlines() if l.split()[:1] == [word]]


def events(name, stacks=False):
    d = os.path.join(work, name + ".trace")
    cmd = [cli, "events"] + (["--stacks"] if stacks else []) + [d]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        check(False, f"{name}: {' '.join(cmd)} failed: {r.stderr.strip()}")
        return []
    return [json.loads(l) for l in r.stdout.splitlines() if l.strip()]


def find(evs, kind, api, ptr):
    for e in evs:
        if e["kind"] == kind and e["api"] == api and int(e["ptr"], 16) == ptr:
            return e
    return None


def paired(evs):
    """Every allocation released once, by pointer, and nothing released that was not live."""
    live = {}
    for e in evs:
        key = (e["pid"], e["device"], e["ptr"])
        if e["kind"] == "alloc":
            if key in live:
                return False
            live[key] = e
        elif e["kind"] == "free":
            if live.pop(key, None) is None:
                return False
    return not live


# every_api: each entry point's allocation with the pointer and size the driver handed back,
# and the failed allocation with the free memory then.
evs = events("every_api")
for api in ("cuMemAlloc_v2", "cuMemAllocPitch_v2", "cuMemAllocManaged", "cuMemAllocAsync",
            "cuMemAllocFromPoolAsync", "cuMemAllocHost_v2", "cuMemHostAlloc",
            "cuArrayCreate_v2", "cuArray3DCreate_v2"):
    printed = lines("every_api", api)
    check(len(printed) == 1, f"every_api: the program printed {api}")
    for ptr, size, _aux in printed:
        e = find(evs, "alloc", api, int(ptr))
        check(e is not None and e["size"] == int(size),
              f"every_api: {api} of {int(ptr):#x}, {size} bytes, recorded")
failed = lines("every_api", "failed")
f = [e for e in evs if e["kind"] == "alloc_failed"]
check(len(failed) == 1 and len(f) == 1, "every_api: one failed allocation, recorded once")
if failed and f:
    result, size, free, total = failed[0]
    e = f[0]
    check(e["size"] == int(size) and e.get("free_bytes") == int(free) and e["result"] == int(result),
          f"every_api: the failure's size {size} and free {free} recorded ({json.dumps(e)})")
devices = {e["device"] for e in evs if e["mem"] == "device"}
check(devices == {0, 1}, f"every_api: allocations on devices 0 and 1 ({sorted(devices)})")

# dlopen_dlsym: dlsym on the driver's handle hands out the preload's wrappers for what it
# wraps and the driver's functions for the rest.
resolved = {l[0]: l[1] for l in lines("dlopen_dlsym", "resolved")}
check(resolved.get("cuMemAlloc_v2") == "preload" and resolved.get("cuMemFree_v2") == "preload",
      f"dlopen_dlsym: dlsym(handle) gives the wrappers ({resolved})")
check(resolved.get("cuInit") == "driver", "dlopen_dlsym: functions not wrapped stay the driver's")
evs = events("dlopen_dlsym")
for ptr, size in lines("dlopen_dlsym", "cuMemAlloc_v2"):
    e = find(evs, "alloc", "cuMemAlloc_v2", int(ptr))
    check(e is not None and e["size"] == int(size), f"dlopen_dlsym: cuMemAlloc_v2 {size} recorded")
check(len(evs) == 6 and paired(evs), f"dlopen_dlsym: 6 events, paired ({len(evs)})")

# procaddr: cuGetProcAddress, the CUDA runtime's way, routes to the wrappers.
evs = events("procaddr")
for api in ("cuMemAlloc_v2", "cuMemAllocAsync", "cuMemAllocAsync_ptsz"):
    for ptr, size in lines("procaddr", api):
        e = find(evs, "alloc", api.replace("_ptsz", ""), int(ptr)) or find(evs, "alloc", api, int(ptr))
        check(e is not None and e["size"] == int(size), f"procaddr: {api} {size} recorded")
check(any(e["kind"] == "alloc_failed" for e in evs), "procaddr: the failed allocation recorded")

# threads: 8 threads x 50 pairs, none lost, each thread's own.
evs = events("threads")
allocs = [e for e in evs if e["kind"] == "alloc"]
check(len(allocs) == 400 and paired(evs), f"threads: 400 allocations, paired ({len(allocs)})")
check(len({e["tid"] for e in allocs}) == 8, "threads: from 8 threads")

# no_cuda: a program that never touches CUDA runs as it would, and writes nothing.
check(out("no_cuda") == "cos(0)=1.0\n", "no_cuda: the program's own output")
check(not os.path.exists(os.path.join(work, "no_cuda.trace")), "no_cuda: no trace directory")

# rtld_next: the dlsym hook leaves the caller glibc sees untouched.
check(lines("rtld_next", "next") == [["preload"]],
      f"rtld_next: dlsym(RTLD_NEXT) from the program finds the preload ({out('rtld_next').strip()})")
check(lines("rtld_next", "default") == [["preload"]], "rtld_next: RTLD_DEFAULT too")
check("cos(0)=1.0" in out("rtld_next"), "rtld_next: dlsym on a real handle")

# fork: the child writes its own file.
evs = events("fork")
pids = {e["pid"] for e in evs}
check(len(os.listdir(os.path.join(work, "fork.trace"))) == 2 and len(pids) == 2,
      f"fork: two files, two processes ({sorted(pids)})")
check(sorted(e["size"] for e in evs if e["kind"] == "alloc") == [1111, 2222, 3333],
      "fork: the parent's and the child's allocations")

# stacks: native stacks unwound from .eh_frame name the program's own functions.
evs = events("stacks", stacks=True)
allocs = [e for e in evs if e["kind"] == "alloc"]
fns = [[f.get("function") for f in e.get("frames", [])][:3] for e in allocs]
want = [["vramtrace_test_inner", "vramtrace_test_outer", "main"]] * 3 + [["vramtrace_test_inner", "main"]]
check([x[:len(w)] for x, w in zip(fns, want)] == want and len(fns) == 4,
      f"stacks: frames name inner, outer, main ({fns})")

if failures:
    print(f"{len(failures)} check(s) failed", file=sys.stderr)
    sys.exit(1)
print("all checks passed")
