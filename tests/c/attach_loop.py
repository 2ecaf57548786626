"""A Python program vramtrace attaches to: reaches the stand-in driver through
cuGetProcAddress (with ctypes, as cudart would), then allocates and frees in a loop from
Python, printing each allocation ("T0 <i> <ptr> <size>"). argv[1]: iterations; argv[2]:
milliseconds between them; argv[3] == "torch": first allocate two segments and show them
through a stand-in `torch` module's `torch.cuda.memory._snapshot()` (as PyTorch's caching
allocator would hold them), printed as "S <ptr> <size>", freed half-way through the loop."""
import ctypes
import os
import sys
import time

cuda = ctypes.CDLL("libcuda.so.1")
GPA = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                       ctypes.c_uint64, ctypes.POINTER(ctypes.c_int))
gpa0 = GPA(("cuGetProcAddress_v2", cuda))


def look(name, version, proto):
    p = ctypes.c_void_p()
    status = ctypes.c_int()
    assert gpa0(name.encode(), ctypes.byref(p), version, 0, ctypes.byref(status)) == 0, name
    return proto(p.value)


init = look("cuInit", 2000, ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint))
get = look("cuDeviceGet", 2000, ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_int))
retain = look("cuDevicePrimaryCtxRetain", 7000,
              ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int))
setctx = look("cuCtxSetCurrent", 4000, ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p))
alloc = look("cuMemAlloc", 13000, ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t))
free = look("cuMemFree", 13000, ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64))

dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert init(0) == 0 and get(ctypes.byref(dev), 0) == 0
assert retain(ctypes.byref(ctx), dev) == 0 and setctx(ctx) == 0
print(f"ready {os.getpid()}", flush=True)


def allocate_kv_block(i):
    p = ctypes.c_uint64()
    size = 1000000 + i * 512
    assert alloc(ctypes.byref(p), size) == 0
    print(f"T0 {i} {p.value} {size}", flush=True)
    assert free(p.value) == 0


segments = []
if len(sys.argv) > 3 and sys.argv[3] == "torch":
    import types

    for size in (20 << 20, 2 << 20):
        p = ctypes.c_uint64()
        assert alloc(ctypes.byref(p), size) == 0
        segments.append((p.value, size))
        print(f"S {p.value} {size}", flush=True)
    snapshot = {"segments": [
        {"device": 0, "address": a, "total_size": n,
         "blocks": [{"address": a, "size": n // 2, "requested_size": n // 2 - 100,
                     "state": "active_allocated"},
                    {"address": a + n // 2, "size": n // 2, "state": "inactive"}]}
        for a, n in segments]}
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True, device_count=lambda: 1,
        mem_get_info=lambda dev: (1000, 2000),
        memory=types.SimpleNamespace(_snapshot=lambda: snapshot))
    sys.modules["torch"] = torch

n = int(sys.argv[1])
for i in range(n):
    if i == n // 2:
        for a, _ in segments:
            assert free(a) == 0
        print("freed segments", flush=True)
    allocate_kv_block(i)
    time.sleep(int(sys.argv[2]) / 1000)
print("done", flush=True)
