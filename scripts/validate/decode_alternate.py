"""The decode benchmark of issue 19 (item 3), alternated finely: PROCS long-lived processes per
mode, all started at once and warmed up, then ROUNDS rounds in which each process in turn times
one `generate` (decode_bench.py --turns) while the others wait, idle. A machine whose speed
drifts during the call (docs/validation.md, 2026-12-01, night: bare 1.20 s, then 1.98, then
2.17 s between processes run a minute apart) moves every mode of a round alike, so each mode is
compared with bare in its own round, seconds apart; the order rotates from round to round so
that no process always follows the same one.

Two identical processes also differ, each for its whole life: two bare processes on the H200
were 5% apart over 27 rounds, their intervals apart (docs/validation.md, 2026-12-02). One
process per mode cannot resolve 3% however many rounds run, so a mode's time in a round is the
mean over its PROCS processes (--procs, default 3), each a fresh draw of whatever makes one
process slower than another, and the table gives the spread of their medians.

  python3 decode_alternate.py [--rounds 10] [--procs 3] [--modes bare,history,vramtrace,...]
                              [--vt PATH] [--out DIR] [--cpus 0-7] [--budget-s S]
                              -- [decode_bench.py arguments]

Modes (each process started as a user would):
  bare                 python3 decode_bench.py
  bare_again           bare again, as a mode of its own: its ratio to bare is the noise floor
  history              the same with PyTorch's recorder, `_record_memory_history(stacks="python")`
  vramtrace            `vramtrace run` (native tensor capture with Python lines)
  vramtrace_nopy       the same without Python lines (VRAMTRACE_PYTHON=0)
  vramtrace_selftime   the same timing its own steps (VRAMTRACE_SELF_TIME=1; not a cost figure)
  vramtrace_nobudget   `vramtrace run --max-size 0` (no ring, so no live-tensor table)
  no_torch_probe       `vramtrace run --no-torch-probe` (driver level only)
  toggled              `vramtrace run`, one process taking three turns per round: `toggled:off`
                       (tensor capture paused, `vramtrace_torch.pause()`), `toggled:on` and
                       `toggled:history` (paused, PyTorch's recorder on for the turn; the turns
                       as bench_turns.py defines them). Its on and history turns are also
                       divided by its off turn of the same round: one process's own speed
                       cancels out of that ratio, which two processes' does not. What the off
                       turn still costs over bare (the tracker called and returning, the report
                       passed on, a release looked up in the live-tensor table) is measured on
                       the stand-in by bench_tensors.py (docs/performance.md)

With --cpus every process runs on the same CPUs (only one works at a time): unpinned, a second
bare process ran 0.53-1.51 times the first's time in the same round; pinned, 0.80-1.19.
With --budget-s no round starts after that many seconds, so the table prints inside a caller's
timeout.

Prints each round, then a table: per mode (or turn), its median time, the median of its
per-round ratio to bare with a 90% bootstrap interval, the range of those ratios, and each of its
processes' median time; then, for a process taking turns, each turn's ratio to its first turn.
Each process's stderr is kept in OUT/MODE-I.err (the probe's stats line,
VRAMTRACE_TORCH_PROBE_STATS=1, among it); vramtrace's traces in OUT/MODE-I.
"""
import argparse
import os
import random
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
    "toggled": ({}, [], []),
}
# Modes whose processes take turns in several modes of their own (decode_bench.py's `go MODE`):
# the first is the reference each other is divided by, in the same process and round.
TURNS = {"toggled": ["off", "on", "history"]}


def start(mode, name, vt, out, bench_args, cpus):
    env_extra, run_flags, bench_flags = MODES[mode]
    cmd = [sys.executable, os.path.join(HERE, "decode_bench.py"), "--turns",
           "--turn-modes", ",".join(TURNS.get(mode, ["on"])), *bench_flags, *bench_args]
    if run_flags is not None:
        trace = os.path.join(out, name)
        shutil.rmtree(trace, ignore_errors=True)
        cmd = [vt, "run", "--quiet", *run_flags, "--out", trace, "--", *cmd]
    env = dict(os.environ, VRAMTRACE_TORCH_PROBE_STATS="1", PYTHONUNBUFFERED="1", **env_extra)
    err = open(os.path.join(out, name + ".err"), "w")
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


def median_interval(ratios, draws=4000):
    """The 5th and 95th percentiles of the median of `ratios` resampled with replacement."""
    rng = random.Random(1)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return meds[draws // 20], meds[draws - 1 - draws // 20]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--procs", type=int, default=3,
                    help="processes per mode (a mode's time in a round is their mean)")
    ap.add_argument("--modes", default="bare,history,vramtrace,vramtrace_nopy,no_torch_probe")
    ap.add_argument("--vt", default=os.path.join(HERE, "..", "..", ".device", "bin", "vramtrace"))
    ap.add_argument("--out", default="/tmp/vramtrace-validation/w/decode-alternate")
    ap.add_argument("--budget-s", type=float, default=float("inf"),
                    help="start no round after this many seconds (the processes' start included)")
    ap.add_argument("--cpus", type=cpu_list, default=set(),
                    help="run every process on these CPUs (as 2-9): only one works at a time, "
                         "and an unpinned process the scheduler placed badly stays slower")
    ap.add_argument("bench", nargs="*", help="decode_bench.py's arguments (after --)")
    a = ap.parse_args()
    modes = a.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown or "bare" not in modes:
        sys.exit(f"decode_alternate: modes are {', '.join(MODES)}, bare among them "
                 f"(unknown: {', '.join(unknown) or 'none'})")
    if a.procs < 1 or a.rounds < 1:
        sys.exit("decode_alternate: --procs and --rounds must be at least 1")
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    # Instances interleaved by index, so that a mode's processes are spread over the order.
    names = [(m, f"{m}-{i}") for i in range(a.procs) for m in modes]
    procs = {n: start(m, n, a.vt, a.out, a.bench, a.cpus) for m, n in names}
    for n, p in procs.items():
        read_until(p, "ready", n)
    print(f"{len(procs)} processes ready after {time.time() - t0:.1f} s", flush=True)
    # A slot: one process's turn in one of its modes (`toggled:on`), or a process of one mode.
    slots = [(slot, m, n, turn) for m, n in names for slot, turn in
             ([(f"{m}:{t}", t) for t in TURNS[m]] if m in TURNS else [(m, "on")])]
    labels = list(dict.fromkeys(slot for slot, _, _, _ in slots))
    times = {(slot, n): [] for slot, _, n, _ in slots}
    rounds = 0
    for r in range(a.rounds):
        if time.time() - t0 > a.budget_s:
            print(f"the budget of {a.budget_s:.0f} s is spent: {r} rounds", flush=True)
            break
        k = r % len(slots)
        for slot, _, n, turn in slots[k:] + slots[:k]:
            procs[n].stdin.write(f"go {turn}\n")
            procs[n].stdin.flush()
            times[slot, n].append(float(read_until(procs[n], "generate_s", n).split()[1]))
        rounds += 1
        print(f"round {r + 1}: " + ", ".join(f"{n}{slot[len(m):]} {times[slot, n][-1]:.3f}"
                                               for slot, m, n, _ in slots), flush=True)
    for p in procs.values():
        p.stdin.close()
    for n, p in procs.items():
        rc = p.wait()
        if rc:
            with open(os.path.join(a.out, n + ".err")) as f:
                tail = f.readlines()[-6:]
            print(f"{n}: exit status {rc}; the end of its stderr:\n  " + "  ".join(tail).rstrip())
    if rounds == 0:
        sys.exit("decode_alternate: no round ran")
    # A slot's time in a round: the mean over its processes.
    per_round = {label: [statistics.mean(times[slot, n][r] for slot, _, n, _ in slots
                                         if slot == label) for r in range(rounds)]
                 for label in labels}
    bare = per_round["bare"]
    print(f"\n{rounds} rounds, {len(modes)} modes x {a.procs} processes alternated; seconds per "
          "generate; ratio: the mode's mean over its processes, over bare's, of the same round")
    print("| mode | median (s) | median ratio | 90% interval | ratio range | each process's median (s) |")
    print("| --- | ---: | ---: | --- | --- | --- |")
    for label in labels:
        ratios = [t / b for t, b in zip(per_round[label], bare)]
        lo, hi = median_interval(ratios)
        each = ", ".join(f"{statistics.median(times[slot, n]):.3f}" for slot, _, n, _ in slots
                         if slot == label)
        print(f"| {label} | {statistics.median(per_round[label]):.3f} | "
              f"{statistics.median(ratios):.3f} | {lo:.3f} – {hi:.3f} | "
              f"{min(ratios):.3f} – {max(ratios):.3f} | {each} |")
    for m in modes:
        if m not in TURNS:
            continue
        ref = f"{m}:{TURNS[m][0]}"
        print(f"\nin-process ratios: each turn over its process's {ref} turn of the same round "
              f"(per process, then the mean over the {a.procs} processes)")
        print("| turn | median ratio | 90% interval | ratio range | rounds below 1 | each process's median ratio |")
        print("| --- | ---: | --- | --- | ---: | --- |")
        for t in TURNS[m][1:]:
            label = f"{m}:{t}"
            per_proc = {n: [x / y for x, y in zip(times[label, n], times[ref, n])]
                        for mm, n in names if mm == m}
            ratios = [statistics.mean(v[r] for v in per_proc.values()) for r in range(rounds)]
            lo, hi = median_interval(ratios)
            each = ", ".join(f"{statistics.median(v):.3f}" for v in per_proc.values())
            print(f"| {label} | {statistics.median(ratios):.3f} | {lo:.3f} – {hi:.3f} | "
                  f"{min(ratios):.3f} – {max(ratios):.3f} | {sum(x < 1 for x in ratios)}/{rounds} "
                  f"| {each} |")
    for m, n in names:
        with open(os.path.join(a.out, n + ".err")) as f:
            for line in f:
                if "torch probe" in line or "VRAMTRACE_TORCH_PROBE_STATS" in line:
                    print(f"{n}: {line.rstrip()}")


if __name__ == "__main__":
    main()
