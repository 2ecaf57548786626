"""The decode case of issue 19 (item 3): a transformers causal LM with random weights and 8
layers, one 1,024-token prompt, 128 new tokens (greedy, no early stop), the wall time of the
`generate` call in the same process. A warm-up generate of the same prompt length (16 new
tokens) runs first, so Triton's autotuning and compilation of every shape the timed calls meet
happen before the clock starts; then --repeats timed generates, each printed, and the best. One
process per mode; the mode is how the process is started (scripts/validate/torch_native.sh decode
alternates them).

  python3 decode_bench.py [--history] [--config CONFIG.json] [--repeats N]

--history: PyTorch's own recorder on, `_record_memory_history(stacks="python")`, before the
model is built. --config: a model's config.json (its text part, `num_hidden_layers` set to 8)
instead of the built-in Llama shape (hidden 2048, 16 heads, 8 KV heads, MLP 5632, vocab 32000).
Prints `generate_s BEST each A,B,.. new_tokens N` and the process's peak allocated bytes.

--turns: for decode_alternate.py, which keeps such processes (several per mode) alive and has
them take turns. After the warm-up (and one untimed generate of the timed length, so the
compilation of its shapes is done too) it prints `ready`, then times one generate per `go` line
read from stdin (printing `generate_s T new_tokens N`) until stdin ends. A `go` line may name
the turn's mode, so that one process can take turns in several (its own speed, which differs
from another process's for its whole life, then cancels out of their ratio):
  go on        as started (the default)
  go off       under `vramtrace run`: tensor capture paused for the generate
  go history   the same, and PyTorch's recorder on for the generate only
               (bench_turns.py, shared with serve_bench.sh's toggled server, says what each
               does)
--turn-modes lists the modes this process will be asked for; each is warmed up once."""
import argparse
import json
import sys
import time

import torch
import transformers

import bench_turns

ap = argparse.ArgumentParser()
ap.add_argument("--history", action="store_true")
ap.add_argument("--config")
ap.add_argument("--prompt", type=int, default=1024)
ap.add_argument("--new", type=int, default=128)
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--turns", action="store_true")
ap.add_argument("--turn-modes", default="on")
a = ap.parse_args()

torch.manual_seed(0)
if a.history:
    torch.cuda.memory._record_memory_history(stacks="python")
if a.config:
    raw = json.load(open(a.config))
    raw = raw.get("text_config", raw)
    raw["num_hidden_layers"] = a.layers
    for key in ("layer_types", "layers_block_type"):  # hybrids list a type per layer
        if isinstance(raw.get(key), list):
            raw[key] = raw[key][: a.layers]
    config = transformers.AutoConfig.for_model(**raw)
else:
    config = transformers.LlamaConfig(
        hidden_size=2048, intermediate_size=5632, num_hidden_layers=a.layers,
        num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
        max_position_embeddings=4096)
# Built on the GPU in bf16 (random weights), not on the CPU first: seconds, not tens of them.
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = transformers.AutoModelForCausalLM.from_config(config)
torch.set_default_dtype(torch.float32)
model.eval()
vocab = config.vocab_size
ids = torch.randint(3, vocab, (1, a.prompt), device="cuda")
kw = dict(do_sample=False, pad_token_id=0)
with torch.inference_mode():
    mask = torch.ones_like(ids)
    model.generate(ids, attention_mask=mask, max_new_tokens=16, min_new_tokens=16, **kw)
    torch.cuda.synchronize()
    if a.turns:
        def turn(mode):
            try:
                bench_turns.enter(mode, f"decode_bench: a turn {mode}")
            except ValueError as e:
                sys.exit(f"decode_bench: {e}")
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, max_new_tokens=a.new,
                                 min_new_tokens=a.new, **kw)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            bench_turns.leave(mode)
            return dt, out

        for mode in a.turn_modes.split(","):
            turn(mode)
        print("ready", flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words or words[0] != "go":
                continue
            dt, out = turn(words[1] if len(words) > 1 else "on")
            print(f"generate_s {dt:.4f} new_tokens {out.shape[1] - a.prompt}", flush=True)
        sys.exit(0)
    times = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=a.new,
                             min_new_tokens=a.new, **kw)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
print(f"generate_s {min(times):.3f} each {','.join(f'{t:.3f}' for t in times)} "
      f"new_tokens {out.shape[1] - a.prompt} peak_allocated {torch.cuda.max_memory_allocated()}")
