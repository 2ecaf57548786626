from .. import _C
from . import _gpu_trace

TOTAL = 24 << 30
_next = [0x7F00_0000_0000]


def _c10():
    """The stand-in libc10_cuda.so beside this package (torch/lib), if a test built one."""
    if "lib" not in _c10.__dict__:
        import ctypes
        import os

        path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "lib", "libc10_cuda.so")
        _c10.lib = ctypes.CDLL(path) if os.path.exists(path) else None
    return _c10.lib


def _sync_c10():
    lib = _c10()
    if lib is not None:
        import ctypes

        lib.fake_set(ctypes.c_int64(_C.STATE["allocated"]), ctypes.c_int64(_C.STATE["requested"]))


def get_allocator_backend():
    return "native"


def _is_compiled():
    """FAKE_TORCH_NO_CUDA=1: a torch built without CUDA."""
    import os

    return os.environ.get("FAKE_TORCH_NO_CUDA") != "1"


def is_available():
    return _is_compiled()


def is_initialized():
    return True


def device_count():
    return 1


def get_per_process_memory_fraction(dev):
    return 0.5


class _Props:
    total_memory = TOTAL


def get_device_properties(dev):
    return _Props()


def fake_alloc(size):
    """The caching allocator hands out a block (the request rounded up to 512 bytes): the
    counters first, then the callbacks."""
    ptr = _next[0]
    block = _block(size)
    _next[0] += block
    _C.STATE["allocated"] += block
    _C.STATE["requested"] += size
    _sync_c10()
    _C.STATE["reserved"] = max(_C.STATE["reserved"], _C.STATE["allocated"])
    if _C.STATE["active"]:
        for cb in _gpu_trace.alloc_callbacks:
            cb(ptr)
    return ptr


def fake_free(ptr, size):
    """A block goes back: the callbacks first, then the counter."""
    if _C.STATE["active"]:
        for cb in _gpu_trace.free_callbacks:
            cb(ptr)
    _C.STATE["allocated"] -= _block(size)
    _C.STATE["requested"] -= size
    _sync_c10()


def _block(size):
    return (size + 511) // 512 * 512


def fake_oom(size):
    # As PyTorch's caching allocator calls its observers: the request, the bytes the process may
    # use (the fraction's maximum, as one is set here) and the driver's free bytes.
    allowed = int(get_per_process_memory_fraction(0) * TOTAL)
    for cb in _C.STATE["oom_observers"]:
        cb(0, size, allowed, 1 << 30)
    raise MemoryError(f"CUDA out of memory. Tried to allocate {size} bytes")
