"""Pools the rounds of several serve_bench.sh calls (their serve-bench.tsv files) into one table
per ratio: each ratio is taken within a round of one call, then the rounds of every call are
pooled, with the median, a 90% bootstrap interval of the median, and the rounds below 1.

  python3 serve_pool.py [--rounds] CALL.tsv [CALL.tsv ...]

Ratios (where the call has both batches), for each toggled server T (toggled, toggled2, ...):
  T:on / T:off        what recording costs, within one server (docs/validation.md)
  T:history / T:off   what PyTorch's recorder costs, within the same server
  T:on / T:history    vramtrace against the recorder, the same server and round
  SLOT / bare         every other slot's batch over the bare server's, across processes (the
                      few percent that two identical servers differ by is inside these)
Several toggled servers' turns are also pooled together, under "toggled*", each turn against
the others and against bare.
"""

import argparse
import collections
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_alternate import median_interval  # noqa: E402


FAILED = collections.Counter()


def read(path):
    """{slot: {round: seconds}} of one call; a failed batch (nan) is left out, and counted."""
    t = collections.defaultdict(dict)
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                slot, r, s = line.split()
                r, s = int(r), float(s)
            except ValueError:
                sys.exit(f"serve_pool: {path}:{n}: expected 'SLOT ROUND SECONDS', got {line!r}")
            if math.isnan(s):
                FAILED[slot] += 1
            else:
                t[slot][r] = s
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--rounds", action="store_true",
                    help="also print each slot's seconds, round by round, call by call")
    ap.add_argument("tsv", nargs="+", help="a serve_bench.sh call's serve-bench.tsv")
    a = ap.parse_args()
    calls = [read(p) for p in a.tsv]
    if a.rounds:
        print("seconds per batch of 16, each round")
        print("| call | slot | each round (s) |")
        print("| --- | --- | --- |")
        for n, t in enumerate(calls, 1):
            for slot in sorted(t, key=lambda x: (x != "bare", x)):
                v = ", ".join(f"{t[slot][r]:.3f}" for r in sorted(t[slot]))
                print(f"| {n} | {slot} | {v} |")
        print()
    togs = sorted({s.split(":")[0] for t in calls for s in t if s.endswith(":off")})
    turns = [("on", "off"), ("history", "off"), ("on", "history")]
    # (label, numerator slots, denominator slots): a ratio pools the rounds of each pair.
    pairs = [(f"{g}:{x} / {g}:{y}", [f"{g}:{x}"], [f"{g}:{y}"]) for g in togs for x, y in turns]
    if len(togs) > 1:
        pairs += [(f"toggled*:{x} / toggled*:{y}", [f"{g}:{x}" for g in togs],
                   [f"{g}:{y}" for g in togs]) for x, y in turns]
    slots = sorted({s for t in calls for s in t} - {"bare"})
    pairs += [(f"{s} / bare", [s], ["bare"]) for s in slots]
    if len(togs) > 1:
        pairs += [(f"toggled*:{x} / bare", [f"{g}:{x}" for g in togs], ["bare"] * len(togs))
                  for x in ("off", "on", "history")]
    print(f"{len(calls)} call(s) pooled; each ratio within a round of one call")
    print("| ratio | rounds | median | 90% interval | rounds below 1 |")
    print("| --- | ---: | ---: | --- | ---: |")
    for name, nums, dens in pairs:
        ratios = [t[num][r] / t[den][r] for t in calls for num, den in zip(nums, dens)
                  for r in sorted(t.get(num, {})) if r in t.get(den, {})]
        if len(ratios) < 2:
            continue
        lo, hi = median_interval(ratios)
        print(f"| {name} | {len(ratios)} | {statistics.median(ratios):.3f} | "
              f"{lo:.3f} – {hi:.3f} | {sum(x < 1 for x in ratios)} / {len(ratios)} |")
    print("\nseconds per batch, every call")
    print("| slot | batches | median (s) | range (s) |")
    print("| --- | ---: | ---: | --- |")
    for s in ["bare"] + slots:
        v = [x for t in calls for x in t.get(s, {}).values()]
        if v:
            print(f"| {s} | {len(v)} | {statistics.median(v):.3f} | {min(v):.3f} – {max(v):.3f} |")
    for s, n in sorted(FAILED.items()):
        print(f"{s}: {n} batch(es) had a failed request and are left out")


if __name__ == "__main__":
    main()
