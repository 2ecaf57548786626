"""Issue 33: llama.cpp's fill ceiling on the GPU machine, predicted and then observed.

    python3 llama_fill.py --vt VRAMTRACE --bin LLAMA_BIN_DIR --out DIR CASE...

CASE is NAME:GGUF:CTX:UBATCH:FA[:CACHE[:whole]] (FA `on` or `off`; CACHE a ggml type for both
caches, or empty; `whole`: the ballast leaves what the whole context needs and 64 MiB).

1. Calibration (its own run, never a rung): `llama-completion` on a 1,000-token prompt at
   `-c 4096` with the case's weights, -ub and kernels, nothing else on the card; the bytes the
   process holds beyond the buffers the model predicts (model, KV cache, compute buffer,
   ggml's cuBLAS workspace, the pool) are its CUDA context, cuBLAS's handles and the kernel
   modules it loaded: `outside`. (The first call, 2026-12-04 03:25, calibrated once, on the f16
   weights without flash attention, for every case.)
2. For each case: a ballast (this process's own tensor) leaves free about what the model says a
   prompt of 55% of the context needs; the free bytes are then measured and the model predicts
   the fill ceiling for them (`vramtrace model ... --limit FREE --known context=OUTSIDE`),
   printed before any rung runs.
3. The rungs, each a fresh `llama-completion` under the ballast: the longest prompt the context
   takes (where it stops is read from its log, one `n_past` line per ubatch), and prompts of
   95% and 105% of the prediction.

Writes DIR/fill.json (every figure) and DIR/<case>-<rung>.log.
"""

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch


def prompt_file(path: Path, n: int) -> Path:
    """A prompt of exactly n tokens with the llama SPM vocabulary: BOS, `hello`, then n - 2
    times ` hello` (no trailing newline)."""
    path.write_text("hello" + " hello" * (n - 2))
    return path


def free_bytes() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def model_json(vt, gguf, ctx, ub, fa, cache, limit, outside):
    cmd = [vt, "model", gguf, "--runtime", "llama.cpp", "-c", str(ctx), "-ub", str(ub),
           "-b", str(ub), "--limit", str(limit), "--known", f"context={outside}", "--json"]
    if fa == "on":
        cmd.append("--flash-attn")
    if cache:
        cmd += ["--cache-type-k", cache, "--cache-type-v", cache]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def completion(bin_dir, gguf, ctx, ub, fa, cache, prompt, log, vt=None, trace=None):
    """Runs llama-completion; returns (exit code, tokens processed, the lowest free bytes seen
    while it ran)."""
    cmd = [str(Path(bin_dir) / "llama-completion"), "-m", gguf, "-ngl", "99", "-c", str(ctx),
           "-b", str(ub), "-ub", str(ub), "-fa", fa, "-f", str(prompt), "-n", "16", "-no-cnv",
           "--temp", "0", "-v"]
    if cache:
        cmd += ["-ctk", cache, "-ctv", cache]
    if vt and trace:
        cmd = [vt, "run", "--quiet", "--out", str(trace), "--"] + cmd
    low = [free_bytes()]
    done = threading.Event()

    def watch():
        while not done.is_set():
            low[0] = min(low[0], torch.cuda.mem_get_info()[0])
            time.sleep(0.01)

    w = threading.Thread(target=watch)
    w.start()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=300).returncode
    done.set()
    w.join()
    n_past = 0
    for line in Path(log).read_text(errors="replace").splitlines():
        if "n_past = " in line:
            try:
                n_past = max(n_past, int(line.split("n_past = ")[1].split()[0].strip(",")))
            except ValueError:
                pass
    return rc, n_past, low[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vt", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("cases", nargs="+")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    torch.cuda.init()
    torch.empty(1, device="cuda")
    results = {"cases": []}

    calibrations = {}

    def calibrate(gguf, ub, fa, cache):
        """What the process holds beyond the buffers the model predicts, on a 1,000-token prompt
        at -c 4096 with the case's own weights and kernels (lazily loaded kernel modules differ
        between cuBLAS, MMQ and flash attention); never a rung."""
        key = (gguf, ub, fa, cache)
        if key in calibrations:
            return calibrations[key]["outside_bytes"]
        p = prompt_file(a.out / "prompt-calib.txt", 1000)
        before = free_bytes()
        tag = f"calib-{len(calibrations)}"
        rc, n_past, low = completion(a.bin, gguf, 4096, ub, fa, cache, p, a.out / f"{tag}.log")
        held = before - low
        m = model_json(a.vt, gguf, 4096, ub, fa, cache, 1 << 40, 0)
        pool = model_json(a.vt, gguf, 1000, ub, fa, cache, 1 << 40, 0)["pool_at_full_bytes"]
        buffers = m["boot_bytes"] + m["frontier"]["cublas_workspace_bytes"] + pool
        outside = max(0, held - buffers)
        calibrations[key] = {"log": tag, "rc": rc, "n_past": n_past, "held_bytes": held,
                             "buffers_bytes": buffers, "outside_bytes": outside}
        print(f"CALIB {tag} {key}: rc={rc} held={held} buffers={buffers} outside={outside}",
              flush=True)
        return outside

    for case in a.cases:
        name, gguf, ctx, ub, fa, *rest = case.split(":")
        ctx, ub = int(ctx), int(ub)
        cache = rest[0] if rest and rest[0] else None
        whole = len(rest) > 1 and rest[1] == "whole"
        outside = calibrate(gguf, ub, fa, cache)
        full = model_json(a.vt, gguf, ctx, ub, fa, cache, 1 << 40, outside)
        max_prompt = full["frontier"]["max_prompt_tokens"]
        # A prompt of 55% of the context; with `whole`, the whole context and 64 MiB to spare.
        target = max_prompt if whole else max_prompt * 55 // 100
        # The free bytes for which the model's ceiling is the target: bisect over the limit.
        lo, hi = full["boot_bytes"], full["boot_bytes"] + outside + 8 * 2**30
        while hi - lo > 2**20:
            mid = (lo + hi) // 2
            if model_json(a.vt, gguf, ctx, ub, fa, cache, mid, outside)["frontier"]["fill_tokens"] >= target:
                hi = mid
            else:
                lo = mid
        want = hi + (64 << 20 if whole else 2**20)
        ballast = None
        torch.cuda.empty_cache()
        spare = free_bytes() - want
        if spare > 0:
            ballast = torch.empty(spare, dtype=torch.uint8, device="cuda")
        limit = free_bytes()
        pred = model_json(a.vt, gguf, ctx, ub, fa, cache, limit, outside)
        fill = pred["frontier"]["fill_tokens"]
        print(f"PREDICT {name}: free {limit} B -> fill ceiling {fill} of {max_prompt} tokens "
              f"(boot {pred['boot_bytes']}, pool at the ceiling {pred['frontier']['pool_bytes']})",
              flush=True)
        # llama.cpp's own projection under the same ballast (it cannot see the fill-time pool).
        fit = [str(Path(a.bin) / "llama-fit-params"), "-m", gguf, "-c", str(ctx), "-ngl", "99",
               "-ub", str(ub), "-b", str(ub), "-fa", fa, "-fitp", "on"]
        if cache:
            fit += ["-ctk", cache, "-ctv", cache]
        with open(a.out / f"{name}-fit-params.log", "w") as f:
            subprocess.run(fit, stdout=f, stderr=subprocess.STDOUT, timeout=120)
        rungs = {}
        for rung, n in [("longest", max_prompt), ("95pct", max(2, fill * 95 // 100)),
                        ("105pct", min(max_prompt, fill * 105 // 100))]:
            if n in [r["prompt"] for r in rungs.values()]:
                continue
            pf = prompt_file(a.out / f"prompt-{name}-{rung}.txt", n)
            trace = a.out / f"{name}-{rung}.trace" if rung == "longest" else None
            rc, n_past, low = completion(a.bin, gguf, ctx, ub, fa, cache, pf,
                                         a.out / f"{name}-{rung}.log", a.vt, trace)
            ok = rc == 0
            rungs[rung] = {"prompt": n, "rc": rc, "filled": ok, "n_past": n_past,
                           "lowest_free": low}
            print(f"RUNG {name} {rung}: prompt {n}: rc {rc}, n_past {n_past}, "
                  f"{'filled' if ok else 'FAILED'}", flush=True)
        results["cases"].append({"name": name, "gguf": gguf, "ctx": ctx, "ubatch": ub, "fa": fa,
                                 "cache": cache, "free_bytes": limit, "outside_bytes": outside,
                                 "prediction": pred, "rungs": rungs})
        del ballast
        torch.cuda.empty_cache()
    results["calibrations"] = [{"key": list(k), **v} for k, v in calibrations.items()]
    (a.out / "fill.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
