"""A decode loop whose PyTorch reserve settles (issue 34): a random-weight model generates
again and again for SECONDS, each time from a prompt of a length drawn from 64..LONGEST tokens
(new lengths at first, then only lengths already seen), so the caching allocator's segments
grow while new shapes come and then hold.
Usage: python3 decode_soak.py MODEL_DIR SECONDS [LONGEST]"""
import random
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    model_dir, seconds = sys.argv[1], float(sys.argv[2])
    longest = int(sys.argv[3]) if len(sys.argv) > 3 else 2048
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    vocab = model.config.vocab_size
    rng = random.Random(1)
    end = time.time() + seconds
    n = 0
    with torch.no_grad():
        while time.time() < end:
            length = rng.randrange(64, longest + 1, 64)
            ids = torch.randint(0, vocab, (1, length), device="cuda")
            model.generate(ids, max_new_tokens=32, do_sample=False, min_new_tokens=32)
            n += 1
    print(f"decode_soak: {n} generations, reserved {torch.cuda.memory_reserved()} B, "
          f"allocated {torch.cuda.memory_allocated()} B")


if __name__ == "__main__":
    main()
