"""A program that imports (the stand-in) torch and allocates tensors from nested functions;
it knows nothing of vramtrace. Prints `tensor PTR SIZE LINE` per allocation and `oom SIZE LINE`."""
import os

import torch

SRC = open(__file__).read().splitlines()


def line_of(marker):
    return next(i + 1 for i, l in enumerate(SRC) if l.rstrip().endswith("# " + marker))


def chunk_fwd_o(size):
    o = torch.cuda.fake_alloc(size)  # O
    os.write(1, f"tensor {o} {size} {line_of('O')}\n".encode())
    return o


def forward():
    h = chunk_fwd_o(102236160)
    o = chunk_fwd_o(50724864)
    torch.cuda.fake_free(h, 102236160)
    o2 = chunk_fwd_o(3145700)  # a 3145728-byte block
    try:
        torch.cuda.fake_oom(20 << 30)  # OOM
    except MemoryError:
        os.write(1, f"oom {20 << 30} {line_of('OOM')}\n".encode())
    return o, o2


forward()
