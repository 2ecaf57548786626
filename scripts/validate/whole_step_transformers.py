"""The whole-step model against a real transformers prefill (issue 18, item 3): Qwen3.5 with fla.

Builds Qwen3.6-27B's text model from samples/models/Qwen3.6-27B/config.json, keeping its first
--layers layers (random bf16 weights: memory does not depend on the values, and no checkpoint is
needed), with SDPA attention, then prefills --chunks chunks of --chunk tokens through
`model(input_ids, past_key_values=cache, use_cache=True)`, the cache carried from chunk to chunk
as a chunked prefill does. The previous chunk's output (its logits) is released before the next
chunk runs. Prints one JSON line of versions, then one per chunk: its tokens, the context at its
end, PyTorch's allocated bytes before it, and its peak allocated and reserved bytes
(torch.cuda.max_memory_allocated / max_memory_reserved, reset before each chunk).

Set each chunk's peak beside the model's prediction, computed anywhere (no GPU needed):
  cargo run -p vramtrace-models --example step -- samples/models/Qwen3.6-27B/config.json \\
      --runtime transformers --layers 8 --chunk 4128 --context 8256
The model's `total` (weights + KV at the context + state + the largest layer + cuBLAS's
workspace) should be within 5% of `peak_allocated`, or its parts say which differs.

Usage: whole_step_transformers.py [--layers 8] [--chunk 4128] [--chunks 2]
"""

import argparse
import json
import os
import sys

import torch

try:
    import einops  # noqa: F401  fla-core imports it; the chunk kernels never call it
except ImportError:
    import types

    sys.modules["einops"] = types.ModuleType("einops")

import transformers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "samples", "models", "Qwen3.6-27B", "config.json")


def build(layers):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    with open(CONFIG) as f:
        text = json.load(f)["text_config"]
    text = {k: v for k, v in text.items() if k != "model_type"}
    text["num_hidden_layers"] = layers
    text["layer_types"] = [
        "full_attention" if (i + 1) % text["full_attention_interval"] == 0 else "linear_attention"
        for i in range(layers)
    ]
    cfg = Qwen3_5TextConfig(**text)
    cfg._attn_implementation = "sdpa"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3_5ForCausalLM(cfg)
    return model.eval()


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--chunk", type=int, default=4128)
    p.add_argument("--chunks", type=int, default=2)
    a = p.parse_args()
    try:
        import fla

        fla_version = fla.__version__
    except ImportError:
        fla_version = None
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "fla": fla_version, "layers": a.layers, "chunk": a.chunk}))
    model = build(a.layers)
    weights = torch.cuda.memory_allocated()
    print(json.dumps({"weights_allocated": weights,
                      "parameters_bytes": sum(p.numel() * p.element_size()
                                              for p in model.parameters())}))
    cache = None
    with torch.no_grad():
        for i in range(a.chunks):
            ids = torch.randint(0, model.config.vocab_size, (1, a.chunk), device="cuda")
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            out = model(input_ids=ids, past_key_values=cache, use_cache=True)
            torch.cuda.synchronize()
            row = {"chunk": i, "tokens": a.chunk, "context": (i + 1) * a.chunk,
                   "allocated_before": before,
                   "peak_allocated": torch.cuda.max_memory_allocated(),
                   "peak_reserved": torch.cuda.max_memory_reserved(),
                   "logits_dtype": str(out.logits.dtype),
                   "logits_shape": list(out.logits.shape)}
            cache = out.past_key_values
            del out, ids
            row["allocated_after"] = torch.cuda.memory_allocated()
            print(json.dumps(row))


if __name__ == "__main__":
    main()
