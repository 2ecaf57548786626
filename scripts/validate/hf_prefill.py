"""One transformers prefill of T tokens through a model saved by hf_models.py, on cuda:0.

Usage: python3 hf_prefill.py MODEL_DIR --tokens T [--chunks N] [--cap GiB] [--snapshot-out FILE]
--chunks N feeds the prompt as N chunks of T tokens each into one cache (a chunked prefill: the
context grows by T per chunk); --cap sets PyTorch's per-process memory fraction to GiB of the
card, so the prefill can run out of memory as on a smaller card. --snapshot-out records PyTorch's
allocator history (Python frames) over the prefill and writes its `_snapshot()` there when the
prefill ends, to set beside `vramtrace export --format pytorch` of the same run.
Prints the peak PyTorch saw after each chunk and whether fla was imported (which GDN ran is in the
trace's frames), so the trace can be checked against both.
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
    ap.add_argument("--snapshot-out")
    a = ap.parse_args()
    if a.cap:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(a.cap * 2**30 / total, 0)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, device_map="cuda")
    model.eval()
    torch.cuda.reset_peak_memory_stats()
    ids = torch.randint(4, 4000, (1, a.tokens * a.chunks), device="cuda")
    past = None
    if a.snapshot_out:
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
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
    finally:
        if a.snapshot_out:
            import pickle

            torch.cuda.synchronize()
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            with open(a.snapshot_out, "wb") as f:
                pickle.dump(snap, f)
            print(f"snapshot: {sum(len(t) for t in snap['device_traces'])} trace entries, "
                  f"{len(snap['segments'])} segments -> {a.snapshot_out}")
    # Which GDN ran is in the trace's frames (fla's chunk_delta_h.py, chunk_o.py ...);
    # transformers' layer attributes do not say it. This says whether fla was even imported.
    print("fla imported:", "yes" if "fla" in sys.modules else "no")
    return 0


if __name__ == "__main__":
    sys.exit(main())
