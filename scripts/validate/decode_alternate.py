"""The decode benchmark of issue 19 (item 3), alternated finely: one long-lived process per mode,
all started at once and warmed up, then ROUNDS rounds in which each mode in turn times one
`generate` (decode_bench.py --turns) while the others wait, idle. A machine whose speed drifts
during the call (docs/validation.md, 2026-12-01, night: bare 1.20 s, then 1.98, then 2.17 s
between processes run a minute apart) moves every mode of a round alike, so each traced run is
compared with the bare run of its own round, seconds apart; the order of the modes rotates from
round to round so that no mode always follows the same one.

  python3 decode_alternate.py [--rounds 10] [--modes bare,history,vramtrace,...] [--vt PATH]
                              [--out DIR] -- [decode_bench.py arguments]

Modes (each a process started as a user would):
  bare                 python3 decode_bench.py
  bare_again           a second bare process: its ratio to bare is the machine's noise floor
  history              the same with PyTorch's recorder, `_record_memory_history(stacks="python")`
  vramtrace            `vramtrace run` (native tensor capture with Python lines)
  vramtrace_nopy       the same without Python lines (VRAMTRACE_PYTHON=0)
  vramtrace_selftime   the same timing its own steps (VRAMTRACE_SELF_TIME=1; not a cost figure)
  vramtrace_nobudget   `vramtrace run --max-size 0` (no ring, so no live-tensor table)
  no_torch_probe       `vramtrace run --no-torch-probe` (driver level only)

With --cpus every process runs on the same CPUs (only one works at a time): in a call without
it (docs/validation.md, 2026-12-02) a second bare process ran 0.53-1.51 times the first's time
in the same round, a process staying slow or fast for several rounds.

Prints each round (wall/CPU seconds per mode), then two tables (wall time, and the main
thread's CPU time, which a guest's stolen time does not count): per mode, every round's time,
the median, and the median and range of the per-round ratio to bare. With --budget-s no round
starts after that many seconds, so the tables print inside a caller's timeout. Each process's stderr is kept in OUT/MODE.err (the
probe's stats line, VRAMTRACE_TORCH_PROBE_STATS=1, among it); vramtrace's traces in OUT/MODE.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = {
    "bare": ({}, None, []),
    "bare_again": ({}, None, []),
    "history": ({}, None, ["--history"]),
    "vramtrace": ({}, [], []),
    "vramtrace_nopy": ({"VRAMTRACE_PYTHON": "0"}, [], []),
    "vramtrace_selftime": ({"VRAMTRACE_SELF_TIME": "1"}, [], []),
    "vramtrace_nobudget": ({}, ["--max-size", "0"], []),
    "no_torch_probe": ({}, ["--no-torch-probe"], []),
}


def start(mode, vt, out, bench_args, cpus):
    env_extra, run_flags, bench_flags = MODES[mode]
    cmd = [sys.executable, os.path.join(HERE, "decode_bench.py"), "--turns", *bench_flags,
           *bench_args]
    if run_flags is not None:
        trace = os.path.join(out, mode)
        shutil.rmtree(trace, ignore_errors=True)
        cmd = [vt, "run", "--quiet", *run_flags, "--out", trace, "--", *cmd]
    env = dict(os.environ, VRAMTRACE_TORCH_PROBE_STATS="1", PYTHONUNBUFFERED="1", **env_extra)
    err = open(os.path.join(out, mode + ".err"), "w")
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                            env=env, text=True, bufsize=1, preexec_fn=pin)


def cpu_list(text):
    """`2-9,12` as a set of CPU numbers."""
    cpus = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def read_until(proc, prefix, mode):
    for line in proc.stdout:
        if line.startswith(prefix):
            return line
    sys.exit(f"decode_alternate: the {mode} process ended before printing {prefix!r} "
             f"(rc {proc.wait()}; see its .err file)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--modes", default="bare,history,vramtrace,vramtrace_nopy,no_torch_probe")
    ap.add_argument("--vt", default=os.path.join(HERE, "..", "..", ".device", "bin", "vramtrace"))
    ap.add_argument("--out", default="/tmp/vramtrace-validation/w/decode-alternate")
    ap.add_argument("--budget-s", type=float, default=float("inf"),
                    help="start no round after this many seconds (the processes' start included)")
    ap.add_argument("--cpus", type=cpu_list, default=set(),
                    help="run every mode's process on these CPUs (as 2-9): only one works at a "
                         "time, and a process that the scheduler moved to a slower core or node "
                         "otherwise stays slower for rounds")
    ap.add_argument("bench", nargs="*", help="decode_bench.py's arguments (after --)")
    a = ap.parse_args()
    modes = a.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown or "bare" not in modes:
        sys.exit(f"decode_alternate: modes are {', '.join(MODES)}, bare among them "
                 f"(unknown: {', '.join(unknown) or 'none'})")
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    procs = {m: start(m, a.vt, a.out, a.bench, a.cpus) for m in modes}
    for m, p in procs.items():
        read_until(p, "ready", m)
        print(f"{m} ready after {time.time() - t0:.1f} s", flush=True)
    times = {m: [] for m in modes}
    cpu = {m: [] for m in modes}
    for r in range(a.rounds):
        if time.time() - t0 > a.budget_s:
            print(f"the budget of {a.budget_s:.0f} s is spent: {r} rounds", flush=True)
            a.rounds = r
            break
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for m in order:
            procs[m].stdin.write("go\n")
            procs[m].stdin.flush()
            line = read_until(procs[m], "generate_s", m).split()
            times[m].append(float(line[1]))
            cpu[m].append(float(line[line.index("cpu_s") + 1]))
        print(f"round {r + 1}: " + ", ".join(f"{m} {times[m][-1]:.3f}/{cpu[m][-1]:.3f}"
                                             for m in modes), flush=True)
    for m, p in procs.items():
        p.stdin.close()
    for m, p in procs.items():
        rc = p.wait()
        if rc:
            with open(os.path.join(a.out, m + ".err")) as f:
                tail = f.readlines()[-6:]
            print(f"{m}: exit status {rc}; the end of its stderr:\n  " + "  ".join(tail).rstrip())
    for what, table in (("seconds per generate", times),
                        ("CPU seconds of the main thread per generate", cpu)):
        bare = table["bare"]
        print(f"\n{a.rounds} rounds, {len(modes)} modes alternated; {what}; "
              "ratio: the mode over bare of the same round")
        print("| mode | each round (s) | median (s) | median ratio | ratio range |")
        print("| --- | --- | ---: | ---: | --- |")
        for m in modes:
            ratios = [t / b for t, b in zip(table[m], bare)]
            print(f"| {m} | {', '.join(f'{t:.3f}' for t in table[m])} | "
                  f"{statistics.median(table[m]):.3f} | {statistics.median(ratios):.3f} | "
                  f"{min(ratios):.3f} – {max(ratios):.3f} |")
    for m in modes:
        with open(os.path.join(a.out, m + ".err")) as f:
            for line in f:
                if "torch probe" in line or "VRAMTRACE_TORCH_PROBE_STATS" in line:
                    print(f"{m}: {line.rstrip()}")


if __name__ == "__main__":
    main()
