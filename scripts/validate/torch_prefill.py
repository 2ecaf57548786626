"""A real PyTorch chunked prefill, timed: the recorder's cost on a server-like run.

Qwen3.6-27B-shaped layers (3 Gated DeltaNet layers through fla 0.6.0's chunk_gated_delta_rule,
then 1 attention layer through PyTorch's FlashAttention, each followed by the MLP), random bf16
weights, a prompt prefilled in chunks with the GDN state carried and the K/V cache growing, as
vLLM does. Prints the best wall time of several passes, in seconds, on the last line. Run it bare
and under `vramtrace run` (scripts/validate/h200.sh prefill_cost alternates the two).

Usage: torch_prefill.py [--tokens 32768] [--chunk 4128] [--layers 8] [--passes 3]
                        [--capacity-gib G]
"""

import argparse
import sys
import time
import types

import torch

try:
    import einops  # noqa: F401  fla-core imports it; the chunk kernels never call it
except ImportError:
    sys.modules["einops"] = types.ModuleType("einops")
from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: E402

HIDDEN, FFN = 5120, 17408
GDN_HEADS, GDN_KEY_HEADS, GDN_DIM = 48, 16, 128
ATTN_HEADS, KV_HEADS, HEAD_DIM = 24, 4, 256


def make_layers(n, dev, dt):
    def w(*shape):
        return (torch.randn(*shape, device=dev, dtype=dt) * 0.02)

    layers = []
    for i in range(n):
        mlp = (w(HIDDEN, 2 * FFN), w(FFN, HIDDEN))
        if i % 4 == 3:
            qkv = w(HIDDEN, (ATTN_HEADS + 2 * KV_HEADS) * HEAD_DIM)
            layers.append(("attn", qkv, w(ATTN_HEADS * HEAD_DIM, HIDDEN), mlp))
        else:
            qkv = w(HIDDEN, (2 * GDN_KEY_HEADS + GDN_HEADS) * GDN_DIM + 2 * GDN_HEADS)
            layers.append(("gdn", qkv, w(GDN_HEADS * GDN_DIM, HIDDEN), mlp))
    return layers


def prefill(layers, tokens, chunk, dev, dt):
    state = [None] * len(layers)
    kv = [[] for _ in layers]
    done = 0
    while done < tokens:
        n = min(chunk, tokens - done)
        x = torch.randn(n, HIDDEN, device=dev, dtype=dt)
        for i, (kind, qkv_w, o_w, (up, down)) in enumerate(layers):
            qkv = x @ qkv_w
            if kind == "gdn":
                kd = GDN_KEY_HEADS * GDN_DIM
                q, k, v, g, b = qkv.split([kd, kd, GDN_HEADS * GDN_DIM, GDN_HEADS, GDN_HEADS], -1)
                q = q.view(1, n, GDN_KEY_HEADS, GDN_DIM).repeat_interleave(3, 2)
                k = k.view(1, n, GDN_KEY_HEADS, GDN_DIM).repeat_interleave(3, 2)
                v = v.reshape(1, n, GDN_HEADS, GDN_DIM)
                g = torch.nn.functional.logsigmoid(g.float()).view(1, n, GDN_HEADS)
                beta = b.sigmoid().view(1, n, GDN_HEADS)
                o, state[i] = chunk_gated_delta_rule(
                    q, k, v, g, beta, initial_state=state[i], output_final_state=True,
                    use_qk_l2norm_in_kernel=True)
                o = o.reshape(n, -1)
            else:
                q, k, v = qkv.split([ATTN_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM,
                                     KV_HEADS * HEAD_DIM], -1)
                kv[i].append((k.view(n, KV_HEADS, HEAD_DIM), v.view(n, KV_HEADS, HEAD_DIM)))
                kc = torch.cat([a for a, _ in kv[i]]).repeat_interleave(ATTN_HEADS // KV_HEADS, 1)
                vc = torch.cat([b for _, b in kv[i]]).repeat_interleave(ATTN_HEADS // KV_HEADS, 1)
                o = torch.nn.functional.scaled_dot_product_attention(
                    q.view(n, ATTN_HEADS, HEAD_DIM).transpose(0, 1).unsqueeze(0),
                    kc.transpose(0, 1).unsqueeze(0), vc.transpose(0, 1).unsqueeze(0),
                    is_causal=False)
                o = o.squeeze(0).transpose(0, 1).reshape(n, -1)
            x = x + o @ o_w
            h = x @ up
            gate, upv = h.chunk(2, -1)
            x = x + (torch.nn.functional.silu(gate) * upv) @ down
        done += n
    torch.cuda.synchronize()


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--chunk", type=int, default=4128)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--capacity-gib", type=float, default=None,
                   help="limit PyTorch's allocator to this many GiB "
                        "(set_per_process_memory_fraction), as a smaller card would")
    a = p.parse_args()
    dev, dt = "cuda", torch.bfloat16
    if a.capacity_gib is not None:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(a.capacity_gib * 2**30 / total)
    torch.manual_seed(0)
    layers = make_layers(a.layers, dev, dt)
    prefill(layers, a.chunk, a.chunk, dev, dt)  # warm-up: Triton compiles, cuBLAS plans
    best = float("inf")
    for _ in range(a.passes):
        t = time.perf_counter()
        prefill(layers, a.tokens, a.chunk, dev, dt)
        best = min(best, time.perf_counter() - t)
    print(f"peak reserved {torch.cuda.max_memory_reserved() / 2**30:.2f} GiB")
    print(f"{best:.4f}")


if __name__ == "__main__":
    main()
