"""Two threads allocate at once from the stand-in torch, one on device 0 and one on device 1
(each device has its own allocator lock, so their trace entries and reports interleave), and
free every other block. The main thread never allocates: CUDA's (lazy) initialisation, and with
it the probe's attach and check, happens on whichever worker allocates first. Prints
`tensor PTR REQUESTED DEVICE LINE SEGMENT` per block and, at the end, `reports N` (the calls
libc10's report function received)."""
import ctypes
import os
import threading

import torch

SRC = open(__file__).read().splitlines()
LINE = {name: next(i + 1 for i, l in enumerate(SRC) if l.rstrip().endswith("# " + name))
        for name in ("A", "B")}
N = 300
start = threading.Barrier(2)
out = {0: [], 1: []}


def worker_a():
    start.wait()
    for i in range(N):
        size = 1000 + 37 * i
        ptr = torch.cuda.fake_alloc(size, 0)  # A
        out[0].append((ptr, size, 0, LINE["A"]))
        if i % 2:
            torch.cuda.fake_free(ptr, size, 0)


def worker_b():
    start.wait()
    for i in range(N):
        size = (1 << 20) + 4099 * i + 1
        ptr = torch.cuda.fake_alloc(size, 1)  # B
        out[1].append((ptr, size, 1, LINE["B"]))
        if i % 2:
            torch.cuda.fake_free(ptr, size, 1)


threads = [threading.Thread(target=worker_a), threading.Thread(target=worker_b)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for rows in out.values():
    for ptr, size, dev, line in rows:
        os.write(1, f"tensor {ptr} {size} {dev} {line} {torch.cuda.segments[ptr]}\n".encode())
lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
lib.fake_c10_reports.restype = ctypes.c_uint64
os.write(1, f"reports {lib.fake_c10_reports()}\n".encode())
