"""Twenty blocks of odd sizes from the stand-in torch, freed in turn; prints `tensor PTR SIZE`
per block. Enough blocks for the probe to check its native size source and then use it."""
import os

import torch

live = []
for i in range(20):
    size = 1000 * (i + 1) + 7 * i + 3
    ptr = torch.cuda.fake_alloc(size)
    os.write(1, f"tensor {ptr} {size}\n".encode())
    live.append((ptr, size))
    if i % 3 == 2:
        p, s = live.pop(0)
        torch.cuda.fake_free(p, s)
