"""Allocations from nested Python functions through the driver via ctypes, with the GIL released
(ctypes.CDLL releases it around each call, as PyTorch's bindings do before the allocator runs),
with it held (ctypes.PyDLL), from a second thread, and from a generator. Prints one line per
allocation: `alloc PTR LINE FUNCTION CALLERS...`, where LINE is the line of the driver call."""
import ctypes
import os
import sys
import threading

SRC = open(__file__).read().splitlines()


def line_of(marker):
    return next(i + 1 for i, l in enumerate(SRC) if l.rstrip().endswith("# " + marker))


released = ctypes.CDLL("libcuda.so.1")
held = ctypes.PyDLL("libcuda.so.1")


def setup():
    assert released.cuInit(0) == 0
    dev = ctypes.c_int()
    assert released.cuDeviceGet(ctypes.byref(dev), 0) == 0
    ctx = ctypes.c_void_p()
    assert released.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert released.cuCtxSetCurrent(ctx) == 0
    return ctx


def report(ptr, marker, *names):
    os.write(1, f"alloc {ptr.value} {line_of(marker)} {' '.join(names)}\n".encode())


def empty_cuda_released(size):
    ptr = ctypes.c_uint64()
    assert released.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)) == 0  # RELEASED
    report(ptr, "RELEASED", "empty_cuda_released", "chunk_fwd_o", "forward", "<module>")


def empty_cuda_held(size):
    ptr = ctypes.c_uint64()
    assert held.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)) == 0  # HELD
    report(ptr, "HELD", "empty_cuda_held", "chunk_fwd_o", "forward", "<module>")


def chunk_fwd_o(size, gil):
    if gil:
        empty_cuda_held(size)
    else:
        empty_cuda_released(size)


def forward(size, gil):
    chunk_fwd_o(size, gil)


def in_thread(ctx, size):
    assert released.cuCtxSetCurrent(ctx) == 0
    ptr = ctypes.c_uint64()
    assert released.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)) == 0  # THREAD
    report(ptr, "THREAD", "in_thread", "run", "_bootstrap_inner", "_bootstrap")


def blocks(n):
    for i in range(n):
        ptr = ctypes.c_uint64()
        assert released.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(4096 + i)) == 0  # GEN
        report(ptr, "GEN", "blocks", "<module>")
        yield ptr


ctx = setup()
forward(1 << 20, gil=False)
forward(2 << 20, gil=True)
t = threading.Thread(target=in_thread, args=(ctx, 3 << 20))
t.start()
t.join()
for _ in blocks(2):
    pass
os.write(1, f"version {sys.version_info[0]}.{sys.version_info[1]}\n".encode())
