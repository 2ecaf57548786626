"""Bytes per decode step of the trace (issue 19 item 4), run under `vramtrace run` by
scripts/validate/ring_decode.sh: a transformers model with random weights (`--model-type
llama` by default, or `--config CONFIG.json`, e.g. the Qwen3.5 hybrid the issue measured, its
text part), 8 layers, built on the GPU in bf16, a 1,024-token prefill, then STEPS decode steps.
Prints `steps N`."""
import argparse
import json

import torch
import transformers

ap = argparse.ArgumentParser()
ap.add_argument("steps", type=int)
ap.add_argument("--model-type", default="llama")
ap.add_argument("--config")
ap.add_argument("--layers", type=int, default=8)
a = ap.parse_args()

if a.config:
    raw = json.load(open(a.config))
    raw = raw.get("text_config", raw)
    raw["num_hidden_layers"] = a.layers
    for key in ("layer_types", "layers_block_type"):  # hybrids list a type per layer
        if isinstance(raw.get(key), list):
            raw[key] = raw[key][: a.layers]
    cfg = transformers.AutoConfig.for_model(**raw)
else:
    cfg = transformers.AutoConfig.for_model(
        a.model_type,
        num_hidden_layers=a.layers,
        hidden_size=2048,
        intermediate_size=5632,
        num_attention_heads=16,
        num_key_value_heads=4,
        vocab_size=32000,
    )
torch.manual_seed(0)
# Built on the GPU in bf16: a random model on the CPU first takes minutes at these sizes.
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = transformers.AutoModelForCausalLM.from_config(cfg)
torch.set_default_dtype(torch.float32)
model.eval()
ids = torch.randint(0, cfg.vocab_size, (1, 1024), device="cuda")
with torch.no_grad():
    model.generate(ids, max_new_tokens=a.steps, min_new_tokens=a.steps, do_sample=False)
torch.cuda.synchronize()
print("steps", a.steps, flush=True)
