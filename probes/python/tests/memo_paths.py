"""Tensors from one function reached by two callers, and from two lines of that function,
alternating, so that a recorder keeping what it made of a stack it saw before must tell these
stacks apart by every frame. Prints `tensor PTR INNER_LINE CALLER_LINE` per allocation."""
import os

import torch

SRC = open(__file__).read().splitlines()
LINE = {m: next(i + 1 for i, l in enumerate(SRC) if l.rstrip().endswith("# " + m))
        for m in ("EVEN", "ODD", "FIRST", "SECOND")}


def alloc_here(i):
    if i % 2 == 0:
        p = torch.cuda.fake_alloc(4096 + i)  # EVEN
        inner = LINE["EVEN"]
    else:
        p = torch.cuda.fake_alloc(4096 + i)  # ODD
        inner = LINE["ODD"]
    return p, inner


def first(i):
    return alloc_here(i)  # FIRST


def second(i):
    return alloc_here(i)  # SECOND


for i in range(200):
    caller = first if (i // 2) % 2 == 0 else second
    p, inner = caller(i)
    outer = LINE["FIRST"] if caller is first else LINE["SECOND"]
    os.write(1, f"tensor {p} {inner} {outer}\n".encode())
    torch.cuda.fake_free(p, 4096 + i)
