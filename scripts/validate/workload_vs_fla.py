#!/usr/bin/env python3
"""Check vramtrace-workload's kernels against the real ones on identical inputs.

The workload generates the inputs (seeded) and, with --dump, writes them and every
intermediate and output as raw little-endian files plus manifest.json. This script runs
the workload (or reads an existing dump with --from-dump), loads those exact bytes onto the
GPU, runs the upstream kernels on them and prints the max abs error of each tensor:

  gdn: fla 0.6.0 (fla-core wheel) chunk_gated_delta_rule end to end (o, final_state); then
       each fla stage fed the workload's own inputs to that stage, so errors do not compound
       (l2norm_fwd, chunk_local_cumsum, chunk_gated_delta_rule_fwd_intra -> A, w, u,
       chunk_gated_delta_rule_fwd_h -> h, v_new, final_state, chunk_fwd_o -> o); and both
       against fla's fp32 naive_recurrent_gated_delta_rule for scale.
  fa:  torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0,
       causal, False) -> out, softmax_lse [H, total_q]; and both against an fp32 softmax.

Examples (H200: torch 2.11+cu130, triton 3.6, fla-core 0.6.0 on PYTHONPATH):
  python3 workload_vs_fla.py --workload ./vramtrace-workload gdn --tokens 4128 --heads 48 \
      --key-dim 128 --value-dim 128
  python3 workload_vs_fla.py --workload ./vramtrace-workload gdn --seqlens 1000,3000,128 \
      --heads 48 --key-heads 16 --key-dim 128 --value-dim 128 --qk-l2norm --initial-state
  python3 workload_vs_fla.py --workload ./vramtrace-workload fa --seqlens 4000,128 --heads 24 \
      --kv-heads 4 --head-dim 256 --max-seqlen-k 262144

Exit status: 0 when every end-to-end and stage comparison is within the dtype's tolerance
(relative to max(1, max|ref|): bf16 3e-2, f16 5e-3, f32 2e-3; fla's solve_tril merge uses
TF32, so f32 agrees to ~1e-3 only), 1 otherwise, 2 on usage or run errors.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

# Keep fla on its Triton path: no FlashQLA / TileLang / intra-card CP backends.
os.environ.setdefault("FLA_FLASH_QLA", "0")
os.environ.setdefault("FLA_TILELANG", "0")
os.environ.setdefault("FLA_INTRACARD_CP", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402

try:
    import einops  # noqa: F401  fla-core requires it; its chunk kernels never call it
except ImportError:
    import types

    def _einops_missing(name):
        def missing(*_args, **_kwargs):
            raise ImportError(f"einops.{name}: einops is not installed")
        return missing

    _stub = types.ModuleType("einops")
    _stub.__getattr__ = _einops_missing  # `from einops import rearrange` imports a stand-in
    sys.modules["einops"] = _stub
    print("note: einops is not installed; fla's imports get a stand-in (the kernels compared "
          "here do not use it)", file=sys.stderr)

NP_DTYPES = {"bf16": np.int16, "f16": np.float16, "f32": np.float32, "i32": np.int32,
             "i64": np.int64, "u64": np.uint64}
TOLERANCE = {"bf16": 3e-2, "f16": 5e-3, "f32": 2e-3}
RCP_LN2 = 1.4426950216  # fla/ops/utils/constant.py


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="vramtrace-workload",
                   help="path of the vramtrace-workload binary")
    p.add_argument("--dir", default=None, help="dump directory (default: a temporary one)")
    p.add_argument("--from-dump", default=None, metavar="DIR",
                   help="compare an existing dump instead of running the workload")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--no-exact", action="store_true", help="skip the fp32 exact references")
    sub = p.add_subparsers(dest="kernel", required=True)

    g = sub.add_parser("gdn", help="fla 0.6.0 chunk_gated_delta_rule")
    shape = g.add_mutually_exclusive_group(required=True)
    shape.add_argument("--tokens", type=int)
    shape.add_argument("--seqlens")
    g.add_argument("--heads", type=int, required=True, help="value heads (fla HV)")
    g.add_argument("--key-heads", type=int, default=None, help="q/k heads (fla H)")
    g.add_argument("--key-dim", type=int, required=True)
    g.add_argument("--value-dim", type=int, required=True)
    g.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    g.add_argument("--scale", type=float, default=None)
    g.add_argument("--qk-l2norm", action="store_true")
    g.add_argument("--initial-state", action="store_true")

    f = sub.add_parser("fa", help="torch.ops.aten._flash_attention_forward")
    f.add_argument("--seqlens", required=True)
    f.add_argument("--kv-seqlens", default=None)
    f.add_argument("--heads", type=int, required=True)
    f.add_argument("--kv-heads", type=int, default=None)
    f.add_argument("--head-dim", type=int, required=True)
    f.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    f.add_argument("--no-causal", action="store_true")
    f.add_argument("--scale", type=float, default=None)
    f.add_argument("--max-seqlen-q", type=int, default=None)
    f.add_argument("--max-seqlen-k", type=int, default=None)
    return p.parse_args()


def workload_command(args, out_dir):
    """The workload invocation with the same shapes and seed, dumping into out_dir."""
    cmd = [args.workload, args.kernel]
    skip = {"workload", "dir", "from_dump", "no_exact", "kernel"}
    for key, val in vars(args).items():
        if key in skip or val is None or val is False:
            continue
        flag = "--" + key.replace("_", "-")
        cmd += [flag] if val is True else [flag, str(val)]
    return cmd + ["--dump", out_dir]


def load_dump(d):
    with open(os.path.join(d, "manifest.json")) as fh:
        manifest = json.load(fh)
    dev = torch.device("cuda")
    tensors = {}
    for e in manifest["tensors"]:
        arr = np.fromfile(os.path.join(d, e["file"]), dtype=NP_DTYPES[e["dtype"]])
        t = torch.from_numpy(arr.copy())
        if e["dtype"] == "bf16":
            t = t.view(torch.bfloat16)
        tensors[e["name"]] = t.reshape(e["shape"]).to(dev)
    return manifest, tensors


class Table:
    def __init__(self, dtype):
        self.tol = TOLERANCE[dtype]
        self.failed = []

    def section(self, title):
        print(f"\n{title}")
        print(f"  {'tensor':<34} {'max abs err':>12} {'mean abs err':>12} {'max |ref|':>10}  result")

    def row(self, name, got, ref, gated=True):
        got, ref = got.float(), ref.float()
        assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} vs {tuple(ref.shape)}"
        finite = torch.isfinite(ref) & torch.isfinite(got)
        same_inf = bool(((~torch.isfinite(ref)) == (~torch.isfinite(got))).all())
        diff = (got[finite] - ref[finite]).abs()
        max_err = diff.max().item() if diff.numel() else 0.0
        mean_err = diff.mean().item() if diff.numel() else 0.0
        max_ref = ref[finite].abs().max().item() if diff.numel() else 0.0
        if not same_inf:
            max_err = float("inf")
        ok = max_err <= self.tol * max(1.0, max_ref)
        verdict = ("ok" if ok else "FAIL") if gated else "(info)"
        if gated and not ok:
            self.failed.append(name)
        print(f"  {name:<34} {max_err:>12.3e} {mean_err:>12.3e} {max_ref:>10.3e}  {verdict}")


def gdn(args, cfg, t, table):
    from fla.modules.norm.l2norm import l2norm_fwd
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.common.chunk_o import chunk_fwd_o
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum

    q, k, v, g, beta = t["q"], t["k"], t["v"], t["g"], t["beta"]
    h0, cu = t.get("initial_state"), t.get("cu_seqlens")
    scale, l2 = cfg["scale"], cfg["qk_l2norm"]
    with torch.inference_mode():
        o, ht = chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0,
                                       output_final_state=True, use_qk_l2norm_in_kernel=l2,
                                       cu_seqlens=cu)
        torch.cuda.synchronize()
        table.section("end to end: fla chunk_gated_delta_rule (reference) vs workload")
        table.row("o", t["o"], o)
        table.row("final_state", t["final_state"], ht)

        table.section("stage by stage: each fla stage fed the workload's inputs to that stage")
        if l2:
            qn, _ = l2norm_fwd(q)
            kn, _ = l2norm_fwd(k)
            table.row("q_l2norm (l2norm_fwd)", t["q_l2norm"], qn)
            table.row("k_l2norm (l2norm_fwd)", t["k_l2norm"], kn)
            q_used, k_used = t["q_l2norm"], t["k_l2norm"]
        else:
            q_used, k_used = q, k
        gc = chunk_local_cumsum(g, chunk_size=64, scale=RCP_LN2, cu_seqlens=cu)
        table.row("g_cumsum (chunk_local_cumsum)", t["g_cumsum"], gc)
        g_w = t["g_cumsum"]
        w, u, A = chunk_gated_delta_rule_fwd_intra(k=k_used, v=v, g=g_w, beta=beta,
                                                   cu_seqlens=cu, chunk_size=64)
        table.row("A (fwd_intra)", t["A"], A)
        table.row("w (fwd_intra)", t["w"], w)
        table.row("u (fwd_intra)", t["u"], u)
        h, v_new, fs = chunk_gated_delta_rule_fwd_h(k=k_used, w=t["w"], u=t["u"], g=g_w,
                                                    initial_state=h0, output_final_state=True,
                                                    cu_seqlens=cu)
        table.row("h (fwd_h)", t["h"], h)
        table.row("v_new (fwd_h)", t["v_new"], v_new)
        table.row("final_state (fwd_h)", t["final_state"], fs)
        o2 = chunk_fwd_o(q=q_used, k=k_used, v=t["v_new"], h=t["h"], g=g_w, scale=scale,
                         cu_seqlens=cu)
        table.row("o (chunk_fwd_o)", t["o"], o2)

        if not args.no_exact:
            eo, es = gdn_exact(cfg, q, k, v, g, beta, h0)
            table.section("context: fp32 naive_recurrent_gated_delta_rule (exact) as the reference")
            table.row("o: workload", t["o"], eo, gated=False)
            table.row("o: fla", o, eo, gated=False)
            table.row("final_state: workload", t["final_state"], es, gated=False)
            table.row("final_state: fla", ht, es, gated=False)


def gdn_exact(cfg, q, k, v, g, beta, h0):
    """fla's naive recurrence in fp32, per sequence, with q/k heads repeated for GVA."""
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

    hv, hk = cfg["heads"], cfg["key_heads"]
    seqlens = cfg["seqlens"]
    qf, kf = q.float(), k.float()
    if cfg["qk_l2norm"]:
        qf = qf / torch.sqrt((qf * qf).sum(-1, keepdim=True) + 1e-6)
        kf = kf / torch.sqrt((kf * kf).sum(-1, keepdim=True) + 1e-6)
    qf = qf.repeat_interleave(hv // hk, dim=2)
    kf = kf.repeat_interleave(hv // hk, dim=2)
    outs, states, bos = [], [], 0
    for n, length in enumerate(seqlens):
        sl = slice(bos, bos + length)
        init = h0[n:n + 1].float() if h0 is not None else None
        o, s = naive_recurrent_gated_delta_rule(qf[:, sl], kf[:, sl], v[:, sl].float(),
                                                beta[:, sl].float(), g[:, sl].float(),
                                                scale=cfg["scale"], initial_state=init,
                                                output_final_state=True)
        outs.append(o)
        states.append(s)
        bos += length
    return torch.cat(outs, dim=1), torch.cat(states, dim=0)


def fa(args, cfg, t, table):
    q, k, v = t["q"], t["k"], t["v"]
    cu_q, cu_k = t["cu_seqlens_q"], t["cu_seqlens_k"]
    with torch.inference_mode():
        out, lse = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, cfg["max_seqlen_q"], cfg["max_seqlen_k"], 0.0, cfg["causal"],
            False, scale=cfg["scale"])[:2]
        torch.cuda.synchronize()
    table.section("torch.ops.aten._flash_attention_forward (reference) vs workload")
    table.row("out", t["out"], out)
    got_lse = t["softmax_lse"]
    if cfg["padded_lse"]:
        got_lse = unpad_lse(got_lse, cfg)
    table.row("softmax_lse [H, total_q]", got_lse, lse)
    if not args.no_exact:
        eo, el = fa_exact(cfg, q, k, v)
        table.section("context: fp32 softmax attention (exact) as the reference")
        table.row("out: workload", t["out"], eo, gated=False)
        table.row("out: torch", out, eo, gated=False)
        table.row("softmax_lse: workload", got_lse, el, gated=False)
        table.row("softmax_lse: torch", lse, el, gated=False)


def unpad_lse(padded, cfg):
    parts = [padded[b, :, :lq] for b, lq in enumerate(cfg["seqlens_q"])]
    return torch.cat(parts, dim=1)


def fa_exact(cfg, q, k, v):
    h, hkv = cfg["heads"], cfg["kv_heads"]
    outs, lses, bq, bk = [], [], 0, 0
    for lq, lk in zip(cfg["seqlens_q"], cfg["seqlens_k"]):
        qs = q[bq:bq + lq].float().transpose(0, 1)                      # [H, lq, D]
        ks = k[bk:bk + lk].float().repeat_interleave(h // hkv, dim=1).transpose(0, 1)
        vs = v[bk:bk + lk].float().repeat_interleave(h // hkv, dim=1).transpose(0, 1)
        s = (qs @ ks.transpose(1, 2)) * cfg["scale"]                     # [H, lq, lk]
        if cfg["causal"]:
            i = torch.arange(lq, device=q.device)[:, None]
            j = torch.arange(lk, device=q.device)[None, :]
            s = s.masked_fill(j > i + (lk - lq), float("-inf"))
        lse = torch.logsumexp(s, dim=-1)                                  # [H, lq]
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        outs.append((p @ vs).transpose(0, 1))
        lses.append(torch.where(torch.isfinite(lse), lse, torch.full_like(lse, float("inf"))))
        bq, bk = bq + lq, bk + lk
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)


def main():
    args = parse_args()
    torch.cuda.set_device(args.device)
    tmp = None
    if args.from_dump:
        d = args.from_dump
    else:
        d = args.dir or (tmp := tempfile.TemporaryDirectory(prefix="vt-workload-")).name
        cmd = workload_command(args, d)
        print("$ " + " ".join(cmd), flush=True)
        r = subprocess.run(cmd)
        if r.returncode != 0:
            print(f"error: the workload exited with status {r.returncode}", file=sys.stderr)
            return 2
    manifest, t = load_dump(d)
    cfg = manifest["config"]
    if manifest["kernel"] != args.kernel:
        print(f"error: {d} holds a {manifest['kernel']} dump, not {args.kernel}", file=sys.stderr)
        return 2
    print(f"\n{args.kernel}: {json.dumps(cfg)}")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    table = Table(cfg["dtype"])
    if args.kernel == "gdn":
        import fla
        print(f"fla {getattr(fla, '__version__', '?')} from {os.path.dirname(fla.__file__)}")
        gdn(args, cfg, t, table)
    else:
        fa(args, cfg, t, table)
    if tmp is not None:
        tmp.cleanup()
    if table.failed:
        print(f"\nFAIL: outside tolerance ({table.tol} x max(1, max|ref|)): {', '.join(table.failed)}")
        return 1
    print(f"\nOK: every comparison within {table.tol} x max(1, max|ref|)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
