#!/usr/bin/env python3
"""A Gated DeltaNet layer that is not fla: the chunked gated delta rule written in plain PyTorch.

It computes what fla's `chunk_gated_delta_rule` computes (chunk-local decay cumsum, the WY
representation by a triangular solve, the chunk states, the corrected values and the output) and
keeps buffers of the same shapes and dtypes as fla 0.6.0 (g cumsum f32 [B,T,H], A bf16
[B,T,H,64], w and u bf16 [B,T,H,K|V], h bf16 [B,NT,H,K,V], v_new and o bf16 [B,T,H,V], the final
state f32 [B,H,K,V]), allocated here, by this file's lines. So a trace of it holds allocations of
exactly the sizes fla's model predicts, made by other code: `vramtrace compare --variant
fla-0.6.0` must not report fla's tensors as matched (issue 11).

  python3 naive_gdn.py                  # T=4128, Hk=16, H=48, K=V=128, bf16
  python3 naive_gdn.py --check-fla      # also run fla on the same inputs and print the difference
"""

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "probes", "python"))
import vramtrace_probe as vt  # noqa: E402

C = 64  # chunk size, as fla's


def naive_chunk_gdn(q, k, v, g, beta, scale, initial_state):
    """q, k [B,T,Hk,K]; v [B,T,H,V]; g (log decay) f32 [B,T,H]; beta [B,T,H]; returns o and the
    final state, keeping fla-shaped buffers live until the output is written."""
    B, T, Hk, K = k.shape
    H, V = v.shape[2], v.shape[3]
    NT = math.ceil(T / C)
    rep = H // Hk
    dt = v.dtype
    g_cum = torch.empty(B, T, H, dtype=torch.float32, device=v.device)
    A = torch.empty(B, T, H, C, dtype=dt, device=v.device)
    w = torch.empty(B, T, H, K, dtype=dt, device=v.device)
    u = torch.empty(B, T, H, V, dtype=dt, device=v.device)
    h = torch.empty(B, NT, H, K, V, dtype=dt, device=v.device)
    v_new = torch.empty(B, T, H, V, dtype=dt, device=v.device)
    o = torch.empty(B, T, H, V, dtype=dt, device=v.device)
    final = torch.empty(B, H, K, V, dtype=torch.float32, device=v.device)

    # Per chunk, everything in f32 with heads first: [B, H, c, D].
    S = initial_state.float().clone() if initial_state is not None else torch.zeros(B, H, K, V, device=v.device)
    for n in range(NT):
        s, e = n * C, min(T, (n + 1) * C)
        c = e - s
        qc = q[:, s:e].float().repeat_interleave(rep, dim=2).transpose(1, 2) * scale
        kc = k[:, s:e].float().repeat_interleave(rep, dim=2).transpose(1, 2)
        vc = v[:, s:e].float().transpose(1, 2)
        bc = beta[:, s:e].float().transpose(1, 2)
        gc = g[:, s:e].float().cumsum(1).transpose(1, 2)  # [B, H, c]
        g_cum[:, s:e] = gc.transpose(1, 2)
        decay = (gc[..., :, None] - gc[..., None, :])
        strict = torch.ones(c, c, dtype=torch.bool, device=v.device).tril(-1)
        causal = torch.ones(c, c, dtype=torch.bool, device=v.device).tril()
        L = ((kc * bc[..., None]) @ kc.transpose(-1, -2)) * decay.masked_fill(~strict, -math.inf).exp()
        eye = torch.eye(c, device=v.device).expand_as(L)
        Ainv = torch.linalg.solve_triangular(eye + L, eye, upper=False)
        A[:, s:e, :, :c] = Ainv.transpose(1, 2).to(dt)
        wc = Ainv @ (kc * (bc * gc.exp())[..., None])
        uc = Ainv @ (vc * bc[..., None])
        w[:, s:e] = wc.transpose(1, 2).to(dt)
        u[:, s:e] = uc.transpose(1, 2).to(dt)
        h[:, n] = S.to(dt)
        vn = uc - wc @ S
        v_new[:, s:e] = vn.transpose(1, 2).to(dt)
        att = (qc @ kc.transpose(-1, -2)) * decay.masked_fill(~causal, -math.inf).exp()
        oc = (qc * gc.exp()[..., None]) @ S + att @ vn
        o[:, s:e] = oc.transpose(1, 2).to(dt)
        glast = gc[..., -1]
        S = S * glast.exp()[..., None, None] + (kc * (glast[..., None] - gc).exp()[..., None]).transpose(-1, -2) @ vn
    final.copy_(S)
    return o, final


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4128)
    p.add_argument("--hk", type=int, default=16)
    p.add_argument("--hv", type=int, default=48)
    p.add_argument("--k", type=int, default=128)
    p.add_argument("--v", type=int, default=128)
    p.add_argument("--check-fla", action="store_true", help="compare the output with fla's chunk_gated_delta_rule")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("naive_gdn.py needs a CUDA device")
    torch.manual_seed(0)
    T, dev, dt = args.tokens, "cuda", torch.bfloat16
    q = torch.randn(1, T, args.hk, args.k, dtype=dt, device=dev)
    k = F.normalize(torch.randn(1, T, args.hk, args.k, device=dev), p=2, dim=-1).to(dt)
    v = torch.randn(1, T, args.hv, args.v, dtype=dt, device=dev)
    g = F.logsigmoid(torch.randn(1, T, args.hv, device=dev))
    beta = torch.rand(1, T, args.hv, dtype=dt, device=dev).sigmoid()
    h0 = torch.zeros(1, args.hv, args.k, args.v, device=dev)
    for name, t in (("input q", q), ("input k", k), ("input v", v), ("input g", g), ("input beta", beta),
                    ("input initial_state", h0)):
        vt.annotate(t, name)
    scale = args.k ** -0.5
    with torch.inference_mode():
        o, final = naive_chunk_gdn(q, k, v, g, beta, scale, h0)
        torch.cuda.synchronize()
        print(f"naive GDN: o {list(o.shape)} {o.dtype}, final state {list(final.shape)}, "
              f"peak allocated {torch.cuda.max_memory_allocated() / 2**20:.2f} MiB")
        if args.check_fla:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule

            o_fla, final_fla = chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0,
                                                      output_final_state=True)
            do = (o.float() - o_fla.float()).abs().max().item()
            ds = (final - final_fla.float()).abs().max().item()
            print(f"against fla: max |o - o_fla| = {do:.4g} (|o| max {o_fla.float().abs().max().item():.3g}), "
                  f"max |S - S_fla| = {ds:.4g}")


if __name__ == "__main__":
    main()
