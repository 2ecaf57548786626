"""Many tensor events, then the evidence that must survive a small size budget: `python3
ring_prog.py MODE N [K]`. Three blocks are allocated first and kept (their records are the
oldest, the first a ring drops), and K more of 4 KiB (0 by default), then N blocks are
allocated and freed in turn, then:
- oom: the stand-in allocator refuses a 20 GiB request;
- signal: the process sends itself SIGUSR2 (a flight record on request);
- snapshot: the process runs `$VRAMTRACE_BIN snapshot <its pid>`.
- driver_oom: the driver (the stand-in libcuda.so.1, through ctypes) refuses a 1 TiB
  cuMemAlloc_v2.
Prints `keep PTR SIZE` for the kept blocks and `churn FIRST_PTR LAST_PTR` for the others."""
import os
import signal
import subprocess
import sys
import time

import torch

mode, n = sys.argv[1], int(sys.argv[2])
k = int(sys.argv[3]) if len(sys.argv) > 3 else 0
keep = []
for size in (4 << 20, 3 << 20, 1000):
    ptr = torch.cuda.fake_alloc(size)
    keep.append(ptr)
    os.write(1, f"keep {ptr} {size}\n".encode())
many = [torch.cuda.fake_alloc(4096) for _ in range(k)]
os.write(1, f"kept {k} more of 4096 bytes\n".encode())
first = last = None
for i in range(n):
    ptr = torch.cuda.fake_alloc(4096)
    torch.cuda.fake_free(ptr, 4096)
    first = ptr if first is None else first
    last = ptr
os.write(1, f"churn {first} {last}\n".encode())
if mode == "oom":
    try:
        torch.cuda.fake_oom(20 << 30)
    except MemoryError:
        os.write(1, b"oom\n")
elif mode == "signal":
    os.kill(os.getpid(), signal.SIGUSR2)
    time.sleep(0.1)
elif mode == "driver_oom":
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 40)) != 0
    os.write(1, b"driver oom\n")
elif mode == "snapshot":
    subprocess.run([os.environ["VRAMTRACE_BIN"], "snapshot", str(os.getpid())], check=True)
    time.sleep(0.1)
