"""Issue 33: the kept llama.cpp fill cases in one table: the model's prediction (made before
each call, `fill.json`), llama.cpp's own lines and the observed fill, and llama-fit-params'
projection beside them.

    python3 scripts/validate/llama_table.py [SAMPLES_DIR]   (default samples/h200)

For each case: the model buffer, KV cache (with the GDN state, as llama-fit-params counts its
"context") and compute buffer, predicted / logged, in MiB; the fill ceiling predicted and the
observed one (a bracket: the longest prompt that filled, or the tokens a failing prompt had
passed, to the end of the ubatch it died in); llama-fit-params' device total and whether it
leaves its 1,024 MiB margin on the card the case had (what `torch.cuda.mem_get_info` gave
before llama.cpp started, less what the process holds besides its buffers).
"""

import json
import re
import sys
from pathlib import Path

MIB = 1 << 20


def logged(text: str, key: str) -> float:
    """The largest `key … = X MiB` (or `key … is X MiB`) in a log excerpt; 0 when absent."""
    vals = [float(m.group(1)) for m in re.finditer(re.escape(key) + r"[^=\n]*(?:=|is)\s*([0-9.]+) MiB", text)]
    return max(vals, default=0.0)


def cases(root: Path):
    """(case, its directory, its log-excerpt prefix) for every kept fill case, the last
    call's where a case ran twice."""
    seen = {}
    for f in sorted(root.glob("llama-fill/fill-call*.json")):
        call = f.stem.split("-")[-1]
        for c in json.loads(f.read_text())["cases"]:
            seen[c["name"]] = (c, f.parent, f"{call}-{c['name']}-")
    for f in [root / "llama-hybrid/fill.json", *sorted(root.glob("llama-27b/*/fill.json"))]:
        for c in json.loads(f.read_text())["cases"]:
            prefix = "" if f.parent.name.startswith("c") else f"{c['name']}-"
            seen[c["name"]] = (c, f.parent, prefix)
    return seen.values()


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "samples/h200")
    print("| case | -c / -ub / FA / cache | model buffer | KV + state | compute | fill: predicted | "
          "fill: observed | llama-fit-params (device, MiB) | its margin on this card |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |")
    for c, d, prefix in cases(root):
        p = c["prediction"]
        logs = [x for x in d.glob(f"{prefix}*.log-excerpt.txt") if "calib" not in x.name]
        text = "\n".join(x.read_text(errors="replace") for x in logs)
        model = logged(text, "CUDA0 model buffer size")
        kv = logged(text, "CUDA0 KV buffer size") + logged(text, "CUDA0 RS buffer size")
        comp = logged(text, "CUDA0 compute buffer size")
        ctx_pred = (p["kv_cache_bytes"] + p.get("recurrent_state_bytes", 0)) / MIB
        r = c["rungs"]
        ub = c["ubatch"]
        pred = p["frontier"]["fill_tokens"]
        if r["longest"]["filled"]:
            seen = f"all {r['longest']['prompt']:,} filled"
        else:
            passed = r["longest"]["n_past"]
            lo = max([passed] + [v["prompt"] for v in r.values() if v["filled"]])
            seen = f"{lo:,}–{passed + ub - 1:,}" if passed else "none (died at start)"
        fit = ""
        margin = ""
        fp = d / f"{prefix}fit-params.log" if prefix else next(d.glob("*fit-params.log"), None)
        if fp and fp.exists():
            row = next((l.split() for l in fp.read_text().splitlines() if l.startswith("CUDA0 ")), None)
            if row:
                total = sum(int(x) for x in row[1:4])
                fit = f"{total:,}"
                room = (c["free_bytes"] - c["outside_bytes"]) / MIB
                margin = "leaves it" if total + 1024 <= room else "does not"
        cache = c.get("cache") or "f16"
        print(f"| {c['name']} | {c['ctx']:,} / {ub} / {c['fa']} / {cache} "
              f"| {p['weights_bytes'] / MIB:,.2f} / {model:,.2f} | {ctx_pred:,.2f} / {kv:,.2f} "
              f"| {p['compute_buffer_bytes'] / MIB:,.2f} / {comp:,.2f} | {pred:,} | {seen} | {fit} | {margin} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
