"""Issue 33: llama.cpp's fill ceiling on the GPU machine, predicted and then observed.

    python3 llama_fill.py --vt VRAMTRACE --bin LLAMA_BIN_DIR --out DIR CASE...

CASE is NAME:GGUF:CTX:UBATCH:FA[:CACHE[:MODE]] (FA `on` or `off`; CACHE a ggml type for both
caches, or empty). MODE: `whole`, the ballast leaves what the whole context needs and 64 MiB;
`card=BYTES`, the ballast leaves BYTES free (a smaller card, emulated) and the one rung is the
longest prompt.

For a hybrid (qwen35), whose compute buffer the model does not place, llama.cpp's own figure is
read first from a short run at the case's flags (its `CUDA0 compute buffer size is` line) and
given to the model (`--compute-buffer`); nothing else is taken from a run.

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
import os
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


COMPUTE = {}


def compute_line(log) -> int | None:
    """The CUDA0 compute buffer llama.cpp logged (4 decimals of MiB with -v, else 2)."""
    for line in Path(log).read_text(errors="replace").splitlines():
        for key in ("CUDA0 compute buffer size is", "CUDA0 compute buffer size ="):
            if key in line:
                return round(float(line.split(key)[1].split()[0]) * 2**20)
    return None


def model_json(vt, gguf, ctx, ub, fa, cache, limit, outside):
    cmd = [vt, "model", gguf, "--runtime", "llama.cpp", "-c", str(ctx), "-ub", str(ub),
           "-b", str(ub), "--limit", str(limit), "--known", f"context={outside}", "--json"]
    if (gguf, ctx, ub, fa, cache) in COMPUTE:
        cmd += ["--compute-buffer", str(COMPUTE[(gguf, ctx, ub, fa, cache)])]
    if fa == "on":
        cmd.append("--flash-attn")
    if cache:
        cmd += ["--cache-type-k", cache, "--cache-type-v", cache]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def needs_compute(vt, gguf) -> bool:
    """Whether the model refuses to place this GGUF's compute buffer (a hybrid)."""
    r = subprocess.run([vt, "model", gguf, "--runtime", "llama.cpp", "-c", "4096", "--json"],
                       capture_output=True, text=True)
    return r.returncode != 0 and "--compute-buffer" in r.stderr


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
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                                timeout=max(30, int(os.environ.get("LLAMA_FILL_TIMEOUT", "300")))).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
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
    hybrids = {}

    def hybrid(gguf):
        if gguf not in hybrids:
            hybrids[gguf] = needs_compute(a.vt, gguf)
        return hybrids[gguf]

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
        if hybrid(gguf):
            COMPUTE[(gguf, 4096, ub, fa, cache)] = compute_line(a.out / f"{tag}.log")
            COMPUTE[(gguf, 1000, ub, fa, cache)] = COMPUTE[(gguf, 4096, ub, fa, cache)]
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
        mode = rest[1] if len(rest) > 1 else ""
        whole = mode == "whole"
        card = int(mode.split("=")[1]) if mode.startswith("card=") else None
        outside = calibrate(gguf, ub, fa, cache)
        if hybrid(gguf):
            # llama.cpp's own compute buffer at these flags, from a 16-token prompt: the one
            # figure the model takes from a run, and only for the hybrids' graph.
            pf = prompt_file(a.out / f"prompt-{name}-boot.txt", 16)
            completion(a.bin, gguf, ctx, ub, fa, cache, pf, a.out / f"{name}-boot.log")
            COMPUTE[(gguf, ctx, ub, fa, cache)] = compute_line(a.out / f"{name}-boot.log")
            print(f"COMPUTE {name}: {COMPUTE[(gguf, ctx, ub, fa, cache)]} B (llama.cpp's line)",
                  flush=True)
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
        want = card if card else hi + (64 << 20 if whole else 2**20)
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
        plan = [("longest", max_prompt), ("95pct", max(2, fill * 95 // 100)),
                ("105pct", min(max_prompt, fill * 105 // 100))]
        for rung, n in plan[:1] if card else plan:
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
