"""PyTorch's caching allocator, tensor by tensor, into the vramtrace trace while the program runs.

`vramtrace run` activates this for Python programs (probes/python/autostart/sitecustomize.py
calls `activate()` right after `import torch` finishes; `--no-torch-probe` turns it off). Nothing
is imported into a program that never imports torch.

What is recorded, through the preload's `vramtrace_tensor` (same trace, same clock):
- each block the caching allocator hands out (`torch.cuda._gpu_trace` allocation callback: the
  data pointer as it happens), with its size: the growth of the allocator's `allocated_bytes`
  counter since the previous event, which the allocator updates before it calls the callback
  (the probe keeps each live block's size, so a free moves the baseline by what it frees), and
  the bytes the program asked for, from the `requested_bytes` counter the same way (a block is
  rounded up to 512 bytes, and a large one is not split when less than 1 MiB would remain);
- each block taken back (the deallocation callback, called before the counter drops);
- each request the allocator refuses (`torch._C._cuda_attach_out_of_memory_observer`), with
  PyTorch's own numbers: the request, allocated and reserved bytes, the per-process limit
  (`set_per_process_memory_fraction`) and the driver's free memory.
The Python line of each allocation is read by the preload from the interpreter's frames.

With `VRAMTRACE_TORCH_SHAPES=1` (`vramtrace run --torch-shapes`), a TorchDispatchMode describes
each operator's output tensors: `empty_like [1, 4128, 48, 128] bf16` (operator, shape, dtype)
through `vramtrace_annotate_op`, which is a description, not a name: `compare` still matches those
tensors by size and counts an equal shape and dtype as evidence.

With `PYTORCH_NO_CUDA_MEMORY_CACHING=1` no block is recorded: each tensor is then a driver
allocation, which the preload records with its Python frames.

Sizes come from one counter per device, so two threads allocating on the same device at the same
moment can swap sizes; inference servers allocate from one thread per device. The counters are
read from the allocator's own statistics where that is checked to be exact (`_NativeCounters`),
else from `torch._C._cuda_memoryStats`.
"""
import ctypes
import os
import sys
import threading

# PyDLL: the calls keep the GIL (they are short and never call back into Python), which saves
# releasing and taking it again twice per tensor. The preload is in the global scope under
# `vramtrace run`; `vramtrace attach` loads it privately and names it in `sys._vramtrace_preload`.
_lib = ctypes.PyDLL(getattr(sys, "_vramtrace_preload", None))
try:
    _tensor = _lib.vramtrace_tensor
    _tensor.argtypes = [ctypes.c_uint32, ctypes.c_int32] + [ctypes.c_uint64] * 7 + [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_int64),
        ctypes.c_uint32,
        ctypes.c_uint64,
    ]
    _tensor.restype = ctypes.c_int
except AttributeError:  # not under the preload
    _tensor = None
try:
    # The two reports made per tensor, with five arguments: each argument converted from Python
    # costs about 0.1 µs (the full call takes 14).
    _block = _lib.vramtrace_tensor_block
    _block.argtypes = [ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64,
                       ctypes.c_uint64]
    _block.restype = ctypes.c_int
except AttributeError:  # not under the preload, or one older than this probe
    _block = None
try:
    # An operator's output, not a name (ABI 2): attribution still matches it by size.
    _annotate_op = _lib.vramtrace_annotate_op
    _annotate_op.argtypes = [
        ctypes.c_uint64,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_int64),
        ctypes.c_uint32,
    ]
    _annotate_op.restype = None
except AttributeError:
    _annotate_op = None

ALLOC, FREE, REFUSED = 1, 2, 3
_state = {"active": False}
# What was reported, for VRAMTRACE_TORCH_PROBE_STATS=1 (a line on stderr at exit).
counts = {"alloc": 0, "free": 0, "refused": 0, "alloc_bytes": 0, "unsized": 0, "shapes": 0}
_lock = threading.Lock()


def _note(text):
    """A line on stderr when the probe cannot do what `vramtrace run` asked of it."""
    sys.stderr.write(f"vramtrace: torch probe: {text}\n")


def activate(shapes=None, before=None):
    """Start recording tensor events; a no-op without the preload, CUDA, or on a second call.

    `before`: blocks live before activation, {pointer: (device, block bytes, requested bytes)}
    (`vramtrace attach` seeds them from PyTorch's snapshot), so that their frees are paired and
    move the counters' baseline by what they free."""
    if _state["active"] or _tensor is None:
        return False
    import torch

    if not torch.cuda.is_available():
        return False
    if _block is None:
        _note("the preload is older than this probe (no vramtrace_tensor_block): tensors are not recorded")
        return False
    if shapes is None:
        shapes = os.environ.get("VRAMTRACE_TORCH_SHAPES") == "1"
    stats = torch._C._cuda_memoryStats
    get_device = torch._C._cuda_getDevice
    sizes = dict(before or {})  # live block pointer -> (device, block bytes, requested bytes)
    baseline = {}  # device -> (allocated, requested) bytes after the last event we saw

    def dict_counters(dev):
        # The block (allocated_bytes) and what the program asked for (requested_bytes, since
        # PyTorch 2.1; 0 before).
        s = stats(dev)
        return (s["allocated_bytes"]["all"]["current"],
                s.get("requested_bytes", {}).get("all", {}).get("current", 0))

    native = _NativeCounters(torch)

    def counters(dev):
        return native.read(dev) if native.ready else native.check(dev, dict_counters(dev))

    def on_alloc(ptr):
        dev = get_device()
        now = counters(dev)
        with _lock:
            was = baseline.get(dev, now)
            size, requested = now[0] - was[0], now[1] - was[1]
            baseline[dev] = now
            sizes[ptr] = (dev, size, requested)
            counts["alloc"] += 1
            counts["alloc_bytes"] += max(size, 0)
            counts["unsized"] += size <= 0
        _block(ALLOC, dev, ptr, max(size, 0), max(requested, 0))

    def on_free(ptr):
        with _lock:
            dev, size, requested = sizes.pop(ptr, (get_device(), 0, 0))
            if dev in baseline:
                baseline[dev] = (baseline[dev][0] - size, baseline[dev][1] - requested)
            counts["free"] += 1
        _block(FREE, dev, ptr, 0, 0)

    def on_oom(device, alloc, allowed, device_free):
        # PyTorch's caching allocator calls its observers with the request, the bytes this
        # process may use (the per-process fraction's maximum when one is set, else the
        # device's total) and the driver's free bytes; what it had allocated and reserved comes
        # from its own statistics.
        s = stats(device)
        allocated_now = s["allocated_bytes"]["all"]["current"]
        reserved = s["reserved_bytes"]["all"]["current"]
        total = torch.cuda.get_device_properties(device).total_memory
        limit = allowed if 0 < allowed < total else 0
        counts["refused"] += 1
        _tensor(REFUSED, device, 0, alloc, 0, allocated_now, reserved, limit, device_free, None, None, None, 0, 0)

    uncached = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "").strip().lower() not in (
        "", "0", "false", "off", "no")
    if not uncached:
        for dev in range(torch.cuda.device_count()):
            # Blocks allocated before activation have no size here; count from now.
            baseline[dev] = counters(dev) if torch.cuda.is_initialized() else (0, 0)
        from torch.cuda import _gpu_trace

        _gpu_trace.register_callback_for_memory_allocation(on_alloc)
        _gpu_trace.register_callback_for_memory_deallocation(on_free)
        torch._C._activate_gpu_trace()
        try:
            torch._C._cuda_attach_out_of_memory_observer(on_oom)
        except AttributeError:
            _note("this torch has no out-of-memory observer: allocator OOMs are not recorded")
    # With the caching allocator off every tensor is a driver allocation, recorded with its
    # Python frames by the preload itself; the allocator's counters do not move, so there is
    # no block to record (an --torch-shapes description still lands on the driver allocation).
    if shapes and _annotate_op is None:
        _note("this preload has no vramtrace_annotate_op: --torch-shapes records nothing")
    elif shapes:
        _shapes_mode(torch).__enter__()
    if os.environ.get("VRAMTRACE_TORCH_PROBE_STATS") == "1":
        import atexit

        atexit.register(lambda: _note(
            " ".join(f"{k}={v}" for k, v in counts.items()) + f" sizes={native.source}"))
    _state["active"] = True
    return True


class _NativeCounters:
    """The caching allocator's two counters read straight from its `DeviceStats`, instead of
    through `torch._C._cuda_memoryStats`, which builds a dictionary of some 150 numbers per call
    (most of the probe's cost per tensor: docs/performance.md).

    libc10_cuda.so exports the allocator (`c10::cuda::CUDACachingAllocator::allocator`) but
    not its `NativeCachingAllocator::getDeviceStats(DeviceIndex)`; that one is found in the
    file's symbol table (`.symtab`, kept in PyTorch's wheels) and placed by the exported
    allocator's own address. The statistics come back through a hidden result pointer (x86-64
    only: on aarch64 that pointer travels in x8, which ctypes cannot set). `allocated_bytes` and
    `requested_bytes` are the 5th and 9th `StatArray` of `DeviceStats` (3 `Stat`s of 4 int64
    each), `current` of the `all` entry first. That layout is PyTorch's, not a promise: the first
    `CHECKS` readings are compared with the dictionary's, and any difference keeps the
    dictionary for good. `VRAMTRACE_TORCH_SIZES=dict` skips it."""

    CHECKS = 8
    ALLOCATED, REQUESTED = 4 * 96, 8 * 96
    ALLOCATOR = "_ZN3c104cuda20CUDACachingAllocator9allocatorE"
    GET_STATS = "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator14getDeviceStatsEa"

    def __init__(self, torch):
        self.ready = False
        self.fn = None
        self.checked = 0
        self.torch = torch
        # Nothing is looked up before the first block: a program that never allocates pays
        # nothing, and importing torch reads no file.
        self.source = "dict (no block yet)"
        if os.environ.get("VRAMTRACE_TORCH_SIZES") == "dict":
            self.source = "dict (VRAMTRACE_TORCH_SIZES=dict)"
            return
        import platform

        if platform.machine() not in ("x86_64", "AMD64"):
            self.source = "dict (native statistics are read on x86-64 only)"
            return
        self.source = "unresolved"

    def _resolve(self):
        """Finds getDeviceStats; on success the readings are checked from now on."""
        torch = self.torch
        try:
            if torch.cuda.get_allocator_backend() != "native":
                self.source = "dict (not the native caching allocator)"
                return
            path = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so")
            lib = ctypes.PyDLL(path)
            self.allocator = ctypes.c_void_p.in_dll(lib, self.ALLOCATOR)
            try:
                fn = getattr(lib, self.GET_STATS)
            except AttributeError:
                # Not exported: its address in the file, moved as the exported allocator moved.
                at = _symtab_values(path, [self.ALLOCATOR, self.GET_STATS])
                if self.GET_STATS not in at or self.ALLOCATOR not in at:
                    self.source = "dict (getDeviceStats is neither exported nor in the symbol table)"
                    return
                base = ctypes.addressof(self.allocator) - at[self.ALLOCATOR]
                fn = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                       ctypes.c_int8)(base + at[self.GET_STATS])
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int8]
            fn.restype = ctypes.c_void_p
        except (OSError, ValueError, AttributeError, RuntimeError) as e:
            self.source = f"dict ({type(e).__name__}: {e})"
            return
        self.buf = ctypes.create_string_buffer(4096)
        self.allocated = ctypes.c_int64.from_buffer(self.buf, self.ALLOCATED)
        self.requested = ctypes.c_int64.from_buffer(self.buf, self.REQUESTED)
        self.fn = fn
        self.source = "checking"

    def read(self, dev):
        self.fn(self.buf, self.allocator.value, dev)
        return self.allocated.value, self.requested.value

    def check(self, dev, expected):
        """`expected` from the dictionary; returns it, and switches to the native reading after
        `CHECKS` equal readings (of live, nonzero counters)."""
        if self.source == "unresolved":
            self._resolve()
        if self.fn is None:
            return expected
        got = self.read(dev)
        if got != expected:
            self.fn = None
            self.source = f"dict (native statistics {got} differ from the dictionary's {expected})"
        elif expected[0] > 0:
            self.checked += 1
            if self.checked >= self.CHECKS:
                self.ready = True
                self.source = "native"
        return expected


def _symtab_values(path, names):
    """`st_value` of each of `names` defined in the `.symtab` of the ELF64 little-endian file
    at `path` (names missing are left out; an unreadable or foreign file gives {})."""
    import mmap
    import struct

    out = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"\x7fELF" or m[4] != 2 or m[5] != 1:
            return out
        shoff = struct.unpack_from("<Q", m, 0x28)[0]
        shentsize, shnum = struct.unpack_from("<HH", m, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", m, shoff + i * shentsize) for i in range(shnum)]
        for sh in sections:
            if sh[1] != 2 or sh[9] != 24:  # SHT_SYMTAB, Elf64_Sym
                continue
            str_off, str_size = sections[sh[6]][4], sections[sh[6]][5]
            wanted = {}
            for name in names:
                at = m.find(b"\0" + name.encode() + b"\0", str_off, str_off + str_size)
                if at >= 0:
                    wanted[at + 1 - str_off] = name
            if not wanted:
                continue
            for st_name, _info, _other, shndx, value, _size in struct.iter_unpack(
                    "<IBBHQQ", m[sh[4]:sh[4] + sh[5]]):
                if st_name in wanted and shndx != 0 and value != 0:
                    out[wanted[st_name]] = value
    return out


def _shapes_mode(torch):
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    Tensor = torch.Tensor

    class Shapes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__.encode()
            for t in tree_leaves(out):
                if isinstance(t, Tensor) and t.is_cuda:
                    shape = list(t.shape)
                    arr = (ctypes.c_int64 * len(shape))(*shape)
                    dtype = str(t.dtype).replace("torch.", "").encode()
                    _annotate_op(t.data_ptr(), name, dtype, arr, len(shape))
                    counts["shapes"] += 1
            return out

    return Shapes()


def attach(lib_path):
    """Run by `vramtrace attach` inside a live interpreter (a pending call: main thread, GIL
    held; `sys._vramtrace_preload` named the preload it loaded at `lib_path` before this module
    was imported): seeds the trace with the state at attach and activates the probe. Everything
    seeded is marked `before attach`: PyTorch's segments as driver allocations labelled so, its
    live blocks as tensors whose operator is `before attach` (neither with a Python line:
    nothing of now made them), and one mark with the driver's free and total memory per
    device."""
    seed = getattr(_lib, "vramtrace_attach_seed", None)
    seed_block = getattr(_lib, "vramtrace_attach_seed_block", None)
    mark = getattr(_lib, "vramtrace_mark", None)
    if _tensor is None or seed is None or seed_block is None:
        _note(f"{lib_path} has no tensor ABI: tensors are not recorded")
        return False
    seed.argtypes = [ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64]
    seed_block.argtypes = [ctypes.c_int32] + [ctypes.c_uint64] * 4
    if mark is not None:
        mark.argtypes = [ctypes.c_char_p]
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        # Nothing of PyTorch's to see; the driver's allocations are recorded all the same.
        if mark is not None:
            mark(b"vramtrace attach: Python probe started; PyTorch has not initialised CUDA "
                 b"here, so only the driver's allocations are recorded")
        return False
    before = {}
    segments = blocks = 0
    for seg in torch.cuda.memory._snapshot().get("segments", []):
        dev = int(seg.get("device", 0))
        seed(dev, int(seg["address"]), int(seg["total_size"]))
        segments += 1
        for b in seg.get("blocks", []):
            if b.get("state") == "active_allocated":
                ptr, size = int(b["address"]), int(b["size"])
                before[ptr] = (dev, size, int(b.get("requested_size", size)))
                seed_block(dev, ptr, size, before[ptr][2], int(seg["address"]))
                blocks += 1
    if mark is not None:
        for dev in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(dev)
            mark(f"before attach: device {dev}: driver free {free} of {total} bytes; "
                 f"PyTorch {segments} segments, {blocks} live blocks".encode())
    try:
        return activate(before=before)
    except Exception as e:  # never break the program
        _note(f"not active after the attach: {e!r}")
        return False
