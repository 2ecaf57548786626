#!/usr/bin/env python3
"""Record the real allocations of fla 0.6.0's chunk_gated_delta_rule and of PyTorch's
aten::_flash_attention_forward, to diff against `vramtrace model --json`.

Every allocation and free made inside the measured call is printed as one JSON line, in order,
as PyTorch's own allocator history records it (torch.cuda.memory._record_memory_history):

  {"kernel": "gdn", "event": "alloc", "seq": 0, "tensor": 0, "bytes": 792576, "addr": "0x..."}
  {"kernel": "gdn", "event": "free", "seq": 8, "tensor": 2, "bytes": 50724864, ...}
  {"kernel": "gdn", "event": "segment_alloc", "seq": 1, "bytes": 27262976, ...}

followed by one {"summary": ...} line per kernel (alloc sizes in order, frees by alloc index,
and live bytes at the peak above the inputs). With --compare FILE (the output of
`vramtrace model CONFIG --json`, or of --kernel gdn/fa), the predicted tensor list is checked
against the recording: same sizes, same order, same frees; the verdict is the last line and the
exit status (0 equal, 1 different).

Examples (H200, torch 2.11, fla-core 0.6.0 on PYTHONPATH):
  python3 model_vs_torch.py --kernel gdn --seqlens 4128 --hk 16 --hv 48 --k 128 --v 128
  python3 model_vs_torch.py --kernel gdn --seqlens 1000,3000,128 --hk 8 --hv 24 --k 128 --v 64
  python3 model_vs_torch.py --kernel fa --seqlens 4128 --heads 24 --kv-heads 4 --head-dim 256 \
      --max-seqlen-k 262144
Warm-up calls run first (Triton autotuning, fla's index-tensor cache keyed by the cu_seqlens
object), so the measured call is the steady state vramtrace models.
"""

import argparse
import json
import os
import sys

# Keep fla on its Triton path: no FlashQLA / TileLang / intra-card CP backends.
os.environ.setdefault("FLA_FLASH_QLA", "0")
os.environ.setdefault("FLA_TILELANG", "0")
os.environ.setdefault("FLA_INTRACARD_CP", "0")

import torch  # noqa: E402

# Under `vramtrace run`, name the inputs and mark the measured call (no-op otherwise).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "probes", "python"))
import vramtrace_probe as vt  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
          "float16": torch.float16}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", choices=["gdn", "fa", "both"], default="both")
    p.add_argument("--seqlens", default="4128", help="tokens per sequence, comma-separated")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--hk", type=int, default=16, help="GDN query/key heads")
    p.add_argument("--hv", type=int, default=48, help="GDN value heads")
    p.add_argument("--k", type=int, default=128, help="GDN key head dim")
    p.add_argument("--v", type=int, default=128, help="GDN value head dim")
    p.add_argument("--l2norm", action="store_true", help="use_qk_l2norm_in_kernel=True")
    p.add_argument("--no-final-state", action="store_true", help="output_final_state=False")
    p.add_argument("--varlen", action="store_true", help="pass cu_seqlens even for one sequence")
    p.add_argument("--heads", type=int, default=24, help="FA query heads")
    p.add_argument("--kv-heads", type=int, default=4, help="FA key/value heads")
    p.add_argument("--head-dim", type=int, default=256, help="FA head dim")
    p.add_argument("--max-seqlen-k", type=int, default=None, help="FA max_seqlen_k (default: longest)")
    p.add_argument("--causal", action="store_true", default=True)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--compare", default=None, help="vramtrace model --json output to check against")
    p.add_argument("--snapshot-out", default=None,
                   help="also write PyTorch's own snapshot of the measured call (pickle) here, for `vramtrace import`")
    return p.parse_args()


def emit(obj):
    print(json.dumps(obj), flush=True)


SNAPSHOT_OUT = None


def record(kernel, fn):
    """Runs fn() with allocator history on; returns the events of that call only."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    try:
        with vt.range(f"{kernel}-measured"):
            result = fn()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    if SNAPSHOT_OUT:
        import pickle

        with open(SNAPSHOT_OUT.replace("{kernel}", kernel), "wb") as f:
            pickle.dump(snap, f)
    dev = torch.cuda.current_device()
    traces = snap["device_traces"][dev] if len(snap["device_traces"]) > dev else []
    allocs, frees, live_by_addr, out = [], [], {}, []
    cur = peak = 0
    for e in traces:
        action, addr, size = e["action"], e["addr"], e["size"]
        if action == "alloc":
            idx = len(allocs)
            allocs.append(size)
            live_by_addr[addr] = idx
            cur += size
            peak = max(peak, cur)
            out.append({"kernel": kernel, "event": "alloc", "tensor": idx, "bytes": size, "addr": hex(addr)})
        elif action == "free_completed":
            idx = live_by_addr.pop(addr, None)
            if idx is None:
                continue  # freed memory allocated before the call
            cur -= allocs[idx]
            frees.append(idx)
            out.append({"kernel": kernel, "event": "free", "tensor": idx, "bytes": allocs[idx], "addr": hex(addr)})
        elif action in ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom"):
            out.append({"kernel": kernel, "event": action, "bytes": size, "addr": hex(addr)})
    for seq, ev in enumerate(out):
        ev["seq"] = seq
        emit(ev)
    summary = {"kernel": kernel, "alloc_bytes": allocs, "freed_tensors": frees,
               "returned_tensors": sorted(live_by_addr.values()), "peak_bytes": peak}
    emit({"summary": summary})
    del result
    return summary


def gdn(args, dtype, seqlens):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    import torch.nn.functional as F

    T, N = sum(seqlens), len(seqlens)
    dev = "cuda"
    q = torch.randn(1, T, args.hk, args.k, dtype=dtype, device=dev)
    k = F.normalize(torch.randn(1, T, args.hk, args.k, dtype=torch.float32, device=dev), p=2, dim=-1).to(dtype)
    v = torch.randn(1, T, args.hv, args.v, dtype=dtype, device=dev)
    g = F.logsigmoid(torch.randn(1, T, args.hv, dtype=torch.float32, device=dev))
    beta = torch.rand(1, T, args.hv, dtype=dtype, device=dev).sigmoid()
    h0 = torch.zeros(N, args.hv, args.k, args.v, dtype=torch.float32, device=dev)
    cu = None
    if N > 1 or args.varlen:
        cu = torch.tensor([0] + list(torch.tensor(seqlens).cumsum(0).tolist()), dtype=torch.long, device=dev)
    for name, t in (("input q", q), ("input k", k), ("input v", v), ("input g", g), ("input beta", beta),
                    ("input initial_state", h0), ("input cu_seqlens", cu)):
        if t is not None:
            vt.annotate(t, name)

    def call():
        return chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                      output_final_state=not args.no_final_state,
                                      use_qk_l2norm_in_kernel=args.l2norm, cu_seqlens=cu)

    with torch.inference_mode():
        for _ in range(args.warmup):
            call()
        return record("gdn", call)


def fa(args, dtype, seqlens):
    dev = "cuda"
    T = sum(seqlens)
    q = torch.randn(T, args.heads, args.head_dim, dtype=dtype, device=dev)
    k = torch.randn(T, args.kv_heads, args.head_dim, dtype=dtype, device=dev)
    v = torch.randn(T, args.kv_heads, args.head_dim, dtype=dtype, device=dev)
    cu = torch.tensor([0] + list(torch.tensor(seqlens).cumsum(0).tolist()), dtype=torch.int32, device=dev)
    for name, t in (("input q", q), ("input k", k), ("input v", v), ("input cu_seqlens", cu)):
        vt.annotate(t, name)
    max_q = max(seqlens)
    max_k = args.max_seqlen_k or max_q

    def call():
        return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_q, max_k, 0.0, args.causal, False)

    with torch.inference_mode():
        for _ in range(args.warmup):
            call()
        return record("fa", call)


def compare(path, summaries):
    with open(path) as f:
        predicted = json.load(f)
    kernels = predicted.get("kernels") or []
    ok = True
    for s in summaries:
        pk = next((k for k in kernels if k.get("kernel") == s["kernel"]), None)
        if pk is None:
            emit({"compare": s["kernel"], "result": "no prediction for this kernel in " + path})
            ok = False
            continue
        tensors = pk["tensors"]
        pred_sizes = [t["bytes"] for t in tensors if t["bytes"] > 0]
        names = [t["name"] for t in tensors if t["bytes"] > 0]
        steps = sorted((t["freed_at"], i) for i, t in enumerate(tensors) if t["freed_at"] is not None)
        pred_frees = [i for _, i in steps]
        same_sizes = pred_sizes == s["alloc_bytes"]
        same_frees = pred_frees == s["freed_tensors"]
        emit({"compare": s["kernel"], "variant": pk.get("variant"), "sizes_equal": same_sizes,
              "frees_equal": same_frees, "predicted": list(zip(names, pred_sizes)),
              "observed": s["alloc_bytes"], "predicted_frees": pred_frees,
              "observed_frees": s["freed_tensors"], "predicted_peak": pk.get("peak_bytes"),
              "observed_peak": s["peak_bytes"]})
        ok = ok and same_sizes and same_frees and pk.get("peak_bytes") == s["peak_bytes"]
    emit({"verdict": "equal" if ok else "different"})
    return ok


def main():
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit("model_vs_torch.py needs a CUDA device")
    global SNAPSHOT_OUT
    SNAPSHOT_OUT = args.snapshot_out
    dtype = DTYPES[args.dtype]
    seqlens = [int(x) for x in args.seqlens.split(",") if x.strip()]
    emit({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
          "seqlens": seqlens, "dtype": args.dtype, "args": vars(args)})
    summaries = []
    if args.kernel in ("gdn", "both"):
        summaries.append(gdn(args, dtype, seqlens))
    if args.kernel in ("fa", "both"):
        summaries.append(fa(args, dtype, seqlens))
    if args.compare:
        sys.exit(0 if compare(args.compare, summaries) else 1)


if __name__ == "__main__":
    main()
