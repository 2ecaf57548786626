"""transformers' own chunked prefill until it runs out of memory: `model.generate(ids,
prefill_chunk_size=C, max_new_tokens=1)` of one N-token prompt under PyTorch's per-process memory
fraction (--cap GiB of the card), on cuda:0. The planner's validation run
(docs/validation.md, "transformers generate(prefill_chunk_size)").

Usage: python3 hf_generate_chunked.py MODEL_DIR --chunk C --cap GiB [--prompt N] [--attn eager]
                                       [--expandable]
--attn loads the model with that attn_implementation (default sdpa); --expandable sets
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch is imported.
Counts the model's forwards (a pre-hook on the decoder), so on a refusal it prints the failing
chunk (counting from 0), the context held at the end of that chunk, PyTorch's message and its
allocated/reserved bytes; then one JSON line with the same.
"""
import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--chunk", type=int, required=True)
    ap.add_argument("--cap", type=float, required=True, help="GiB the caching allocator may hold")
    ap.add_argument("--prompt", type=int, help="prompt tokens (default: max_position_embeddings)")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa, eager)")
    ap.add_argument("--expandable", action="store_true",
                    help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    a = ap.parse_args()
    if a.expandable:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    from transformers import AutoModelForCausalLM
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = a.cap * 2**30 / total
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, device_map="cuda",
                                                 attn_implementation=a.attn)
    model.eval()
    n = a.prompt or model.config.max_position_embeddings
    forwards = []
    model.model.register_forward_pre_hook(lambda m, args, kw: forwards.append(
        kw["input_ids"].shape[-1] if kw.get("input_ids") is not None else None), with_kwargs=True)
    ids = torch.randint(4, 4000, (1, n), device="cuda")
    result = {"chunk": a.chunk, "cap_gib": a.cap, "attn": model.config._attn_implementation,
              "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
              "total": total, "fraction": fraction,
              "prompt": n, "weights": torch.cuda.memory_allocated()}
    try:
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), prefill_chunk_size=a.chunk,
                           max_new_tokens=1, do_sample=False)
        result.update(oom=False, forwards=len(forwards))
        print(f"held: {n} tokens in {len(forwards)} forwards")
    except torch.OutOfMemoryError as e:
        idx = len(forwards) - 1
        context = sum(x or 0 for x in forwards)
        msg = str(e).splitlines()[0]
        result.update(oom=True, chunk_index=idx, context=context, message=msg,
                      allocated=torch.cuda.memory_allocated(),
                      reserved=torch.cuda.memory_reserved(),
                      peak_allocated=torch.cuda.max_memory_allocated(),
                      peak_reserved=torch.cuda.max_memory_reserved())
        print(f"OOM in chunk {idx} (context {context} held at its end): {msg}")
    print("RESULT " + json.dumps(result))
    return 3 if result["oom"] else 0


if __name__ == "__main__":
    sys.exit(main())
