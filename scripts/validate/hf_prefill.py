"""One transformers prefill of T tokens through a model saved by hf_models.py, on cuda:0.

Usage: python3 hf_prefill.py MODEL_DIR --tokens T [--chunks N] [--cap GiB]
--chunks N feeds the prompt as N chunks of T tokens each into one cache (a chunked prefill: the
context grows by T per chunk); --cap sets PyTorch's per-process memory fraction to GiB of the
card, so the prefill can run out of memory as on a smaller card.
Prints which Gated DeltaNet implementation the layers hold (fla's kernels or transformers' torch
fallback) and the peak PyTorch saw, so the trace can be checked against both.
"""
import argparse
import sys

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--chunks", type=int, default=1)
    ap.add_argument("--cap", type=float)
    a = ap.parse_args()
    if a.cap:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(a.cap * 2**30 / total, 0)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, device_map="cuda")
    model.eval()
    impls = set()
    for m in model.modules():
        f = getattr(m, "chunk_gated_delta_rule", None)
        if f is not None:
            impls.add(f"{getattr(f, '__module__', '?')}.{getattr(f, '__name__', '?')}")
    print("gdn implementations:", sorted(impls) or "none")
    torch.cuda.reset_peak_memory_stats()
    ids = torch.randint(4, 4000, (1, a.tokens * a.chunks), device="cuda")
    past = None
    try:
        with torch.no_grad():
            for c in range(a.chunks):
                chunk = ids[:, c * a.tokens:(c + 1) * a.tokens]
                out = model(input_ids=chunk, past_key_values=past, use_cache=True,
                            logits_to_keep=1)
                past = out.past_key_values
                torch.cuda.synchronize()
                print(f"chunk {c}: context {(c + 1) * a.tokens} tokens, "
                      f"allocated {torch.cuda.memory_allocated() / 2**20:.1f} MiB, "
                      f"peak {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB, "
                      f"reserved {torch.cuda.memory_reserved() / 2**20:.1f} MiB")
    except torch.OutOfMemoryError as e:
        print("OOM:", str(e).splitlines()[0])
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
