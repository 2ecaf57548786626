"""Bytes per decode step of the trace (issue 19 item 4), run under `vramtrace run` by
scripts/validate/ring_decode.sh: a transformers model with random weights (`--model-type
llama` by default, or `qwen3_next` for the hybrid the issue measured), 8 layers, a 1,024-token
prefill, then STEPS decode steps. Prints `steps N`."""
import argparse

import torch
import transformers

ap = argparse.ArgumentParser()
ap.add_argument("steps", type=int)
ap.add_argument("--model-type", default="llama")
ap.add_argument("--layers", type=int, default=8)
a = ap.parse_args()

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
model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).cuda().eval()
ids = torch.randint(0, cfg.vocab_size, (1, 1024), device="cuda")
with torch.no_grad():
    model.generate(ids, max_new_tokens=a.steps, min_new_tokens=a.steps, do_sample=False)
torch.cuda.synchronize()
print("steps", a.steps, flush=True)
