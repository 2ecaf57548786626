"""The paged pool and batch transformers' continuous batching plans at start, as transformers
itself logs them ("Paged cache initialized: ... max_batch_tokens = M, ... num_blocks = N"), for
each --cb-max-memory-percent given: `model.generate_batch` of two short prompts with a
`ContinuousBatchingConfig(max_memory_percent=P)`, on cuda:0. The CB planner's validation run
(docs/validation.md, "transformers continuous batching").

Usage: python3 hf_cb_plan.py MODEL_DIR P [P ...]
Prints, for each P, one JSON line: the free and reserved memory just before (what the planner
predicts from the card, the context and the weights) and transformers' own max_batch_tokens and
num_blocks, read from `PagedAttentionMemoryHandler.infer_max_batch_tokens_and_num_blocks` (wrapped:
its log line did not reach a handler in the first call), with the handler's own available memory
and IO settings.
"""
import json
import logging
import re
import sys

import torch
from transformers import AutoModelForCausalLM, ContinuousBatchingConfig
from transformers.generation.continuous_batching import cache as cb_cache
from transformers.utils import logging as hf_logging

SEEN = []
_infer = cb_cache.PagedAttentionMemoryHandler.infer_max_batch_tokens_and_num_blocks


def _recorded(self):
    m, n = _infer(self)
    SEEN.append({"max_batch_tokens": m, "num_blocks": n, "block_size": self.block_size,
                 "available": self.available_memory, "io_multiplier": self.io_multiplier,
                 "num_attention_masks": self.num_attention_masks,
                 "max_blocks_per_request": self.max_blocks_per_request,
                 "group_size": self.group_size, "num_groups": self.num_groups})
    return m, n


cb_cache.PagedAttentionMemoryHandler.infer_max_batch_tokens_and_num_blocks = _recorded


class Grab(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def main():
    model_dir, percents = sys.argv[1], [float(p) for p in sys.argv[2:]]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, device_map="cuda")
    hf_logging.set_verbosity_info()
    grab = Grab()
    hf_logging.get_logger("transformers").addHandler(grab)
    for p in percents:
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        reserved = torch.cuda.memory_reserved()
        grab.lines.clear()
        SEEN.clear()
        model.generate_batch([[5] * 16, [6] * 16], max_new_tokens=2,
                             continuous_batching_config=ContinuousBatchingConfig(max_memory_percent=p))
        line = next((l for l in grab.lines if "Paged cache initialized" in l), "")
        m = re.search(r"max_batch_tokens = (\d+).*num_blocks = (\d+).*block_size = (\d+)", line)
        seen = SEEN[0] if SEEN else {}
        print("RESULT " + json.dumps({
            "percent": p, "free": free, "total": total, "reserved": reserved,
            "weights": torch.cuda.memory_allocated(), **seen,
            "logged": [int(x) for x in m.groups()] if m else None}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
