import threading

from .. import _C
from . import _gpu_trace

TOTAL = 24 << 30
_next = [0x7F00_0000_0000]
# The current stream's handle (`cudaStream_t`), as `current_stream().cuda_stream` gives it.
_stream = [0x5150]
# Block pointer -> the base of the segment the stand-in libc10_cuda.so carved it from.
segments = {}
# Live block pointer -> (block bytes, requested bytes, device), for `memory._snapshot()`.
live = {}


def _c10():
    """The stand-in libc10_cuda.so beside this package (torch/lib), if a test built one."""
    if "lib" not in _c10.__dict__:
        import ctypes
        import os

        path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "lib", "libc10_cuda.so")
        # CDLL: its calls release the GIL, so two Python threads are in it at once.
        lib = ctypes.CDLL(path) if os.path.exists(path) else None
        if lib is not None:
            lib.fake_c10_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_uint64,
                                            ctypes.POINTER(ctypes.c_uint64),
                                            ctypes.POINTER(ctypes.c_uint64)]
            lib.fake_c10_malloc.restype = ctypes.c_uint64
            lib.fake_c10_free.argtypes = [ctypes.c_uint64, ctypes.c_int, ctypes.c_uint64]
            lib.fake_c10_free.restype = ctypes.c_uint64
        _c10.lib = lib
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


_init = {"done": False, "queued": []}
_init_lock = threading.RLock()
_init_tls = threading.local()


def is_initialized():
    return _init["done"]


def _lazy_call(fn):
    """As PyTorch's: run `fn` now if CUDA is initialised, else right after it is."""
    with _init_lock:
        if _init["done"]:
            fn()
        else:
            _init["queued"].append(fn)


def _lazy_init():
    """As PyTorch's: the first CUDA call of any thread initialises, then runs the queued calls
    on that thread, holding the lock (other threads wait; the initialising thread's own CUDA
    calls from the queued calls go through)."""
    if _init["done"] or getattr(_init_tls, "busy", False):
        return
    with _init_lock:
        if _init["done"]:
            return
        _init_tls.busy = True
        try:
            for fn in _init["queued"]:
                fn()
        finally:
            _init_tls.busy = False
            _init["done"] = True
            _init["queued"] = []


def device_count():
    return 1


def get_per_process_memory_fraction(dev):
    return 0.5


class _Props:
    total_memory = TOTAL


def get_device_properties(dev):
    return _Props()


def fake_alloc(size, device=0):
    """The caching allocator hands out a block: the counters first, then the callbacks. With the
    stand-in libc10_cuda.so (a test built one) the block comes from there, with its trace
    entries and its report to libc10, on `device` (0 or 1); else the request rounded up to 512
    bytes."""
    _lazy_init()
    lib = _c10()
    if lib is not None:
        import ctypes

        block, segment = ctypes.c_uint64(), ctypes.c_uint64()
        ptr = lib.fake_c10_malloc(size, device, _stream[0], ctypes.byref(block),
                                  ctypes.byref(segment))
        block = block.value
        segments[ptr] = segment.value
    else:
        ptr = _next[0]
        block = _block(size)
        _next[0] += block
    _C.STATE["allocated"] += block
    _C.STATE["requested"] += size
    live[ptr] = (block, size, device)
    _sync_c10()
    _C.STATE["reserved"] = max(_C.STATE["reserved"], _C.STATE["allocated"])
    if _C.STATE["active"]:
        for cb in _gpu_trace.alloc_callbacks:
            cb(ptr)
    return ptr


def fake_free(ptr, size, device=0):
    """A block goes back: the callbacks first, then the counter."""
    if _C.STATE["active"]:
        for cb in _gpu_trace.free_callbacks:
            cb(ptr)
    lib = _c10()
    block = lib.fake_c10_free(ptr, device, _stream[0]) if lib is not None else _block(size)
    _C.STATE["allocated"] -= block
    _C.STATE["requested"] -= size
    live.pop(ptr, None)
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


def current_device():
    return 0


class _Stream:
    def __init__(self, handle):
        self.cuda_stream = handle


def current_stream(device=None):
    return _Stream(_stream[0])


def mem_get_info(dev=0):
    """The driver's (free, total) bytes: the stand-in's total less what its allocator holds."""
    return TOTAL - _C.STATE["reserved"], TOTAL


class _Memory:
    @staticmethod
    def _snapshot():
        """As PyTorch's `torch.cuda.memory._snapshot()`, reduced: each live block alone in a
        segment of its own size (the stand-in allocator carves no segments)."""
        return {"segments": [
            {"device": dev, "address": ptr, "total_size": block,
             "blocks": [{"address": ptr, "size": block, "requested_size": req,
                         "state": "active_allocated"}]}
            for ptr, (block, req, dev) in sorted(live.items())]}


memory = _Memory()
