"""PyTorch's caching allocator, tensor by tensor, into the vramtrace trace while the program runs.

`vramtrace run` activates this for Python programs (probes/python/autostart/sitecustomize.py
calls `activate()` right after torch's module has executed, however it was reached;
`--no-torch-probe` turns it off). Nothing is imported into a program that never imports torch.
Whether it started, and why not, goes into the trace as a standing note (`vramtrace_note`) and,
when it could not, once on stderr (docs/architecture.md, "How the PyTorch probe starts").

Two ways to record each block (same trace, same clock):
- **Native capture** (the section at the end of this file; chosen when it checks out): the
  preload records each block itself, from a trace tracker attached to the caching allocator and
  the allocator's own report of each block's size, with no Python call per tensor: its block
  and requested bytes, stream, device and the allocating thread's Python line, exact with any
  number of threads. Attached once CUDA is initialised, after one tensor of a known size has
  shown that what the preload reads agrees with PyTorch's own figures; otherwise (or with
  `VRAMTRACE_TORCH_CAPTURE=callbacks`) the callbacks below, and stderr and the trace say why.
- **Callbacks**, through the preload's `vramtrace_tensor` (described below).

The allocator's refusals go through the OOM observer either way.

`vramtrace attach` runs `attach()` inside a live interpreter (seeding the trace with the state
at attach and naming it from the Python objects holding it) and, at detach, `detach()`, which
turns the probe off again (both at the end of this file).

What the callbacks record:
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

On the callback path sizes come from one counter per device, so two threads allocating on the
same device at the same moment can swap sizes (native capture cannot). The counters are
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

try:
    # A NOTE record in the trace (flag 1: a standing note, written into the file whenever the
    # process has one, and into a fork child's): whether the probe started here, and why not.
    _note_c = _lib.vramtrace_note
    _note_c.argtypes = [ctypes.c_char_p, ctypes.c_uint32]
    _note_c.restype = None
except AttributeError:  # not under the preload, or one older than this probe
    _note_c = None
_STANDING = 1

ALLOC, FREE, REFUSED = 1, 2, 3
_state = {"active": False, "detached": False}
# What was reported, for VRAMTRACE_TORCH_PROBE_STATS=1 (a line on stderr at exit).
counts = {"alloc": 0, "free": 0, "refused": 0, "alloc_bytes": 0, "unsized": 0, "shapes": 0}
_lock = threading.Lock()


def _note(text):
    """A line on stderr when the probe cannot do what `vramtrace run` asked of it."""
    sys.stderr.write(f"vramtrace: torch probe: {text}\n")


def _trace_note(text):
    """`text` as this process's standing NOTE in the trace (what `vramtrace summary` shows)."""
    if _note_c is not None:
        _note_c(text.encode("utf-8", "replace")[:256], _STANDING)


def not_active(reason):
    """Says once, on stderr and in the trace, that the probe did not start and why."""
    if _state.get("said"):
        return
    _state["said"] = True
    text = f"not active: {reason}; tensors are not recorded"
    _note(text)
    _trace_note("torch probe: " + text)


def pause(why=None):
    """Pauses tensor capture in this process, whichever way it records (native or callbacks):
    blocks handed out from now on are not recorded; blocks recorded before are still followed
    to their release; the allocator's refusals and the driver's events are recorded as always.
    The trace says when (a NOTE, with `why`), so a reader knows the tensor detail missing there
    was not lost. For keeping a warm-up, or a benchmark's reference turns, out of a trace.
    Returns whether capture was paused already."""
    return _set_paused(1, why)


def resume(why=None):
    """Resumes tensor capture after `pause()`; returns whether it was paused."""
    return _set_paused(0, why)


def _set_paused(paused, why):
    fn = getattr(_lib, "vramtrace_tensor_pause", None)
    if fn is None:
        raise RuntimeError("this vramtrace preload cannot pause tensor capture (too old)")
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p]
    fn.restype = ctypes.c_int
    return bool(fn(paused, None if why is None else str(why).encode("utf-8", "replace")[:256]))


def _cuda_built(torch):
    """Whether this torch has CUDA, asked without initialising CUDA: `is_available()` would
    (PyTorch's docs: it poisons fork), and a program that imports torch, forks and uses CUDA in
    the child must work as it does without us."""
    built = getattr(torch.cuda, "_is_compiled", None)
    if built is not None:
        return built()
    return torch.backends.cuda.is_built()


def activate(shapes=None, before=None):
    """Start recording tensor events; a no-op on a second call. Returns whether it started;
    when it cannot (no preload, a torch without CUDA, a preload older than this probe), it says
    why, once, on stderr and in the trace.

    `before`: blocks live before activation, {pointer: (device, block bytes, requested bytes)}
    (`vramtrace attach` seeds them from PyTorch's snapshot), so that their frees are paired and
    move the counters' baseline by what they free."""
    if _state["active"]:
        return True
    if _tensor is None:
        not_active("the vramtrace preload is not loaded in this process (LD_PRELOAD lost its "
                   "libvramtrace_preload.so, or the process was started without it)")
        return False
    import torch

    if not _cuda_built(torch):
        not_active(f"this torch ({getattr(torch, '__version__', '?')}) is built without CUDA")
        return False
    if _block is None:
        not_active("the preload is older than this probe (no vramtrace_tensor_block)")
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
        if _state["detached"]:  # no work per event after `detach()`
            return
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
        if _state["detached"]:
            return
        with _lock:
            dev, size, requested = sizes.pop(ptr, (get_device(), 0, 0))
            if dev in baseline:
                baseline[dev] = (baseline[dev][0] - size, baseline[dev][1] - requested)
            counts["free"] += 1
        _block(FREE, dev, ptr, 0, 0)

    def on_oom(device, alloc, allowed, device_free):
        if _state["detached"]:  # PyTorch keeps its observers for good
            return
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
        def callbacks():
            from torch.cuda import _gpu_trace

            _gpu_trace.register_callback_for_memory_allocation(on_alloc)
            _gpu_trace.register_callback_for_memory_deallocation(on_free)
            _state["callbacks"] = (on_alloc, on_free)
            torch._C._activate_gpu_trace()
            _state["gpu_trace"] = True

        # Native capture when it checks out, else the callbacks (the section below).
        _choose_capture(torch, callbacks)

        def observe_ooms():
            try:
                torch._C._cuda_attach_out_of_memory_observer(on_oom)
            except AttributeError:
                _note("this torch has no out-of-memory observer: allocator OOMs are not recorded")
            except Exception as e:  # never break CUDA's initialisation
                _note(f"allocator OOMs are not recorded: {type(e).__name__}: {e}")

        # After CUDA's initialisation, as native capture: PyTorch's binding initialises CUDA
        # (`lazyInitDevice`, torch/csrc/cuda/Module.cpp THCPModule_attachOutOfMemoryObserver)
        # before it hands the observer to each device's allocator, so attaching it right after
        # `import torch` initialised CUDA in every traced program, one that forks workers
        # afterwards included.
        _after_cuda_init(torch, observe_ooms)
    # With the caching allocator off every tensor is a driver allocation, recorded with its
    # Python frames by the preload itself; the allocator's counters do not move, so there is
    # no block to record (an --torch-shapes description still lands on the driver allocation).
    if shapes and _annotate_op is None:
        _note("this preload has no vramtrace_annotate_op: --torch-shapes records nothing")
    elif shapes:
        _state["shapes"] = _shapes_mode(torch)
        _state["shapes"].__enter__()
    if os.environ.get("VRAMTRACE_TORCH_PROBE_STATS") == "1":
        import atexit

        def stats_line():
            _note(" ".join(f"{k}={v}" for k, v in counts.items()) + f" sizes={native.source}"
                  + f" capture={capture['how']}" + _self_time())

        _state["atexit"] = stats_line
        atexit.register(stats_line)
    # The live blocks, for the naming of the state at attach (`_name_before_attach`).
    _state["sizes"] = sizes
    _state["active"] = True
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_child)
    mode = "caching allocator off: tensors are driver allocations" if uncached else "caching allocator"
    _trace_note(f"torch probe: active (torch {getattr(torch, '__version__', '?')}, {mode})")
    return True


def _self_time():
    """Native capture's own steps, mean ns per call (`VRAMTRACE_SELF_TIME=1`), for the stats
    line: ` self_ns tracker=… libc10=… report=… frames=… write=… table=… miss=…`; empty when the preload timed nothing
    (the switch off, read by the preload alone) or has no such function."""
    get = getattr(_lib, "vramtrace_self_time", None)
    if get is None:
        return ""
    names = ("tracker", "libc10", "report", "frames", "write", "table", "miss")
    out = (ctypes.c_uint64 * (2 * len(names)))()
    get.restype = ctypes.c_uint32
    n = min(len(names), get(out, len(names)))
    parts = [f"{names[i]}={out[2 * i] / out[2 * i + 1]:.0f}x{out[2 * i + 1]}"
             for i in range(n) if out[2 * i + 1]]
    return " self_ns " + " ".join(parts) if parts else ""


def _after_fork_child():
    """A fork child keeps the callbacks (they are the parent's Python objects) and records into
    its own trace file; a lock another thread held at the fork is not held in the child."""
    global _lock
    _lock = threading.Lock()


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
    return {name: at for name, (at, _size) in _symtab_entries(path, names).items()}


def _symtab_entries(path, names):
    """(`st_value`, `st_size`) of each of `names` defined in the `.symtab` of the ELF64
    little-endian file at `path` (names missing are left out; an unreadable or foreign file
    gives {})."""
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
            for st_name, _info, _other, shndx, value, size in struct.iter_unpack(
                    "<IBBHQQ", m[sh[4]:sh[4] + sh[5]]):
                if st_name in wanted and shndx != 0 and value != 0:
                    out[wanted[st_name]] = (value, size)
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


# --- Native capture (issue 19) ------------------------------------------------------------
# Each block recorded by the preload itself, with no Python callback per tensor: a trace
# tracker attached to PyTorch's caching allocator and the allocator's own call to
# `c10::reportMemoryUsageToProfiler`, which the preload also exports (probes/preload/src/
# torch_tracker.rs; docs/architecture.md, "PyTorch's caching allocator, natively"). Chosen when
# the layouts it reads check out against PyTorch's own figures for one tensor of a known size;
# otherwise the callbacks above, said on stderr and in the trace.

# An odd request: its block (333,824 bytes, rounded up to 512) differs from it, so the check
# tells the block's size from the bytes asked for.
_NATIVE_CHECK_BYTES = 333_333
# Checks made before giving up on native capture.
_NATIVE_CHECKS = 5
_ALLOCATOR = _NativeCounters.ALLOCATOR
# `NativeCachingAllocator::attachAllocatorTraceTracker`: the TraceEntry type moved from
# c10::cuda::CUDACachingAllocator (2.5) to c10::CachingDeviceAllocator (2.11), which changes
# the mangled name, not the call.
_ATTACH = (
    "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator27attachAllocatorTraceTracker"
    "ESt8functionIFvRKNS_22CachingDeviceAllocator10TraceEntryEEE",
    "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator27attachAllocatorTraceTracker"
    "ESt8functionIFvRKNS1_10TraceEntryEEE",
)
_VTABLE = "_ZTVN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocatorE"
_ATTACH_ERRORS = {
    -1: "the caching allocator is not set up yet",
    -2: "the allocator in use is not PyTorch's native caching allocator",
    -3: "attachAllocatorTraceTracker is not in the native allocator's vtable",
    -4: "a tracker was already attached",
}
# How tensors are being recorded, for VRAMTRACE_TORCH_PROBE_STATS=1.
capture = {"how": "callbacks (not chosen yet)"}


def _choose_capture(torch, callbacks):
    """Native capture once CUDA is initialised (the allocator attaches its tracker to the
    devices it has then; `torch.cuda._lazy_call` runs us right after initialisation, on
    whichever thread initialises, or now if that is done), else `callbacks()`.
    `VRAMTRACE_TORCH_CAPTURE=callbacks` keeps the callbacks."""
    if os.environ.get("VRAMTRACE_TORCH_CAPTURE") == "callbacks":
        capture["how"] = "callbacks (VRAMTRACE_TORCH_CAPTURE=callbacks)"
        callbacks()
        return

    def choose():
        try:
            why = _start_native(torch)
        except Exception as e:  # never break CUDA's initialisation
            why = f"{type(e).__name__}: {e}"
        if why is None:
            capture["how"] = "native"
            return
        capture["how"] = f"callbacks ({why})"
        text = f"native tensor capture off ({why}); tensors recorded through the allocator callbacks"
        _note(text)
        try:
            _lib.vramtrace_torch_native_enable(0, b"torch probe: " + text.encode())
        except AttributeError:
            pass
        try:
            callbacks()
        except Exception as e:
            _note(f"tensors are not recorded: {type(e).__name__}: {e}")

    _after_cuda_init(torch, choose)


def _after_cuda_init(torch, fn):
    """`fn()` once CUDA is initialised: now if it is, else through `torch.cuda._lazy_call`,
    right after initialisation on whichever thread initialises (`fn` must not raise there: it
    would surface as the program's own CUDA error)."""
    lazy = getattr(torch.cuda, "_lazy_call", None)
    if lazy is None or torch.cuda.is_initialized():
        fn()
    else:
        lazy(fn)


def _start_native(torch):
    """Attaches the preload's tracker and checks it; None when native capture is on, else why
    not (then it is off)."""
    try:
        attach = _lib.vramtrace_torch_native_attach
        last = _lib.vramtrace_torch_native_last
        enable = _lib.vramtrace_torch_native_enable
    except AttributeError:
        return "the preload has no native capture"
    attach.argtypes = [ctypes.c_uint64] * 4
    attach.restype = ctypes.c_int
    last.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
    last.restype = None
    enable.argtypes = [ctypes.c_int, ctypes.c_char_p]
    enable.restype = ctypes.c_int
    if torch.cuda.get_allocator_backend() != "native":
        return f"allocator backend {torch.cuda.get_allocator_backend()!r}, not the native caching allocator"
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so")
    if not os.path.exists(path):
        return f"no {path}"
    lib = ctypes.PyDLL(path)
    allocator = ctypes.addressof(ctypes.c_void_p.in_dll(lib, _ALLOCATOR))
    at = _symtab_entries(path, [_ALLOCATOR, _VTABLE, *_ATTACH])
    method = next((name for name in _ATTACH if name in at), None)
    if _ALLOCATOR not in at or _VTABLE not in at or method is None:
        return "attachAllocatorTraceTracker or the allocator's vtable is not in libc10_cuda.so's symbol table"
    base = allocator - at[_ALLOCATOR][0]
    rc = attach(allocator, base + at[method][0], base + at[_VTABLE][0], at[_VTABLE][1])
    if rc != 0:
        return _ATTACH_ERRORS.get(rc, f"attach answered {rc}")
    # The counters are the device's: another thread's block between the two readings (a
    # server attached while it serves) spoils one check, not a layout; a layout that differs
    # fails every time.
    for _ in range(_NATIVE_CHECKS):
        why = _native_check(torch, last)
        if why is None:
            break
    if why is None and enable(1, None) != 1:
        why = "the preload did not turn native capture on"
    return why


def _native_check(torch, last):
    """Allocates and frees one tensor of `_NATIVE_CHECK_BYTES` on the current device and
    compares what reached the preload (the tracker's ALLOC and FREE_REQUESTED entries, the
    allocator's reports) with PyTorch's own figures: the tensor's pointer, its stream, the
    device, and the moves of `allocated_bytes` (the block) and `requested_bytes`. None when all
    agree, else the first difference."""
    dev = torch.cuda.current_device()
    stats = torch._C._cuda_memoryStats

    def counters():
        s = stats(dev)
        return (s["allocated_bytes"]["all"]["current"],
                s.get("requested_bytes", {}).get("all", {}).get("current", 0))

    out = (ctypes.c_uint64 * 14)()

    def seen():
        last(out)
        v = [int(x) for x in out]
        as_signed = lambda x: x - (1 << 64) if x >= 1 << 63 else x  # noqa: E731
        return {"alloc": (v[0], as_signed(v[1]), v[2], v[3], v[4]),
                "free": (v[5], as_signed(v[6]), v[7], v[8], v[9]),
                "report": (v[10], as_signed(v[11]), as_signed(v[12]))}

    seen()  # forget anything earlier on this thread
    a0, r0 = counters()
    t = torch.empty(_NATIVE_CHECK_BYTES, dtype=torch.uint8, device=f"cuda:{dev}")
    a1, r1 = counters()
    got = seen()
    ptr = t.data_ptr()
    stream = torch.cuda.current_stream(dev).cuda_stream
    del t
    a2, _ = counters()
    got_free = seen()
    block = a1 - a0
    checks = [
        ("requested_bytes", r1 - r0, _NATIVE_CHECK_BYTES),
        ("the tracker's ALLOC entry (action, device, address, bytes asked, stream)",
         got["alloc"], (0, dev, ptr, _NATIVE_CHECK_BYTES, stream)),
        ("the allocator's report (pointer, block bytes, device)", got["report"], (ptr, block, dev)),
        ("the tracker's FREE_REQUESTED entry", got_free["free"], (1, dev, ptr, _NATIVE_CHECK_BYTES, stream)),
        ("the allocator's report of the free", got_free["report"], (ptr, -block, dev)),
        ("allocated_bytes after the free", a2, a0),
    ]
    for what, have, want in checks:
        if have != want:
            why = f"layout check: {what} is {have}, PyTorch's figures say {want}"
            if what.startswith("the allocator's report") and have[2] == -1 and getattr(
                    sys, "_vramtrace_preload", None):
                why += (" (attached late: vramtrace attach hooks c10::reportMemoryUsageToProfiler "
                        "in place only when a trampoline page is within reach of both libcuda and "
                        "libc10; its output says why it left it alone)")
            return why
    if block < _NATIVE_CHECK_BYTES:
        return f"layout check: a block of {block} bytes for {_NATIVE_CHECK_BYTES} asked"
    return None


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
        # The segment's live blocks first, then the segment: from the moment the segment is
        # in the trace, so are they (a reader's moment at the segment's arrival, the peak of
        # driver bytes when nothing new is allocated later, sees them in it).
        for b in seg.get("blocks", []):
            if b.get("state") == "active_allocated":
                ptr, size = int(b["address"]), int(b["size"])
                before[ptr] = (dev, size, int(b.get("requested_size", size)))
                seed_block(dev, ptr, size, before[ptr][2], int(seg["address"]))
                blocks += 1
        seed(dev, int(seg["address"]), int(seg["total_size"]))
        segments += 1
    if mark is not None:
        for dev in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(dev)
            mark(f"before attach: device {dev}: driver free {free} of {total} bytes; "
                 f"PyTorch {segments} segments, {blocks} live blocks".encode())
    try:
        active = activate(before=before)
    except Exception as e:  # never break the program
        _note(f"not active after the attach: {e!r}")
        return False
    if before and os.environ.get("VRAMTRACE_ATTACH_NAMES") != "0":
        _start_naming(torch, before, mark)
    return active


# --- Detach (issue 21) ----------------------------------------------------------------------
# `vramtrace attach`'s detach schedules `detach()` the same way as `attach()` (a pending call in
# the main thread, GIL held) and waits for it to report through the preload
# (`vramtrace_attach_python_done`), so that it can say when it did not run in time.

# What `detach()` reports, bit by bit (the CLI reads them: probes/attach/src/lib.rs, PythonDetach).
DETACH_RAN, DETACH_GPU_TRACE_STAYS, DETACH_NATIVE_OFF, DETACH_ERROR, DETACH_REMOVED = 1, 2, 4, 8, 16


def detach():
    """Deactivates the probe in this process: the allocator callbacks are taken out of
    `torch.cuda._gpu_trace`'s registries, native capture (if on) is turned off, the
    `--torch-shapes` mode is left, a naming walk still running stops, and the callbacks
    PyTorch keeps for good (the OOM observer) return at once. What cannot be undone: once
    `torch._C._activate_gpu_trace()` ran, PyTorch calls into its (now empty) callback lists on
    every block, taking the GIL each time (it has no switch to turn that off). Reports to the
    preload; returns the bits reported."""
    flags = DETACH_RAN
    _state["detached"] = True
    _state["active"] = False
    stop = _naming.get("stop")
    if stop is not None:
        stop.set()
    ours = _state.pop("callbacks", None)
    if ours:
        try:
            from torch.cuda import _gpu_trace

            for registry in list(vars(_gpu_trace).values()):
                kept = getattr(registry, "callback_list", None)
                if isinstance(kept, list) and any(cb in kept for cb in ours):
                    # One slice assignment: a thread firing the list sees it before or after.
                    kept[:] = [cb for cb in kept if cb not in ours]
                    flags |= DETACH_REMOVED
        except Exception as e:
            _note(f"detach: the allocator callbacks could not be removed: {type(e).__name__}: {e}")
            flags |= DETACH_ERROR
    if _state.get("gpu_trace"):
        flags |= DETACH_GPU_TRACE_STAYS
    if capture["how"] == "native":
        try:
            _lib.vramtrace_torch_native_enable(0, None)
            flags |= DETACH_NATIVE_OFF
        except AttributeError:
            pass
    capture["how"] = "off (detached)"
    shapes = _state.pop("shapes", None)
    if shapes is not None:
        try:
            shapes.__exit__(None, None, None)
        except Exception as e:  # entered on another thread's mode stack
            _note(f"detach: --torch-shapes mode not left: {type(e).__name__}: {e}")
            flags |= DETACH_ERROR
    line = _state.pop("atexit", None)
    if line is not None:
        import atexit

        atexit.unregister(line)
    _state.pop("sizes", None)
    _report_detach(flags)
    return flags


def _report_detach(flags):
    done = getattr(_lib, "vramtrace_attach_python_done", None)
    if done is not None:
        done.argtypes = [ctypes.c_uint32]
        done.restype = None
        done(flags)


# --- Naming the state at attach --------------------------------------------------------------
# The blocks seeded from PyTorch's snapshot have no Python line (nothing of now made them). The
# Python objects holding them say what they are: every module's parameters and buffers, and the
# attributes of other objects that hold CUDA tensors (directly, or in a list, tuple or dict).
# Each tensor's storage is matched to the seeded block it lies in, and the block is named
# through the preload's `vramtrace_annotate` (an ANNOTATE record: the reader names the block at
# that address).
#
# The walk runs in a thread of its own and must cost the program next to nothing. A walk that
# looked at every object's attributes in Python held the GIL for seconds in total, a slice at a
# time, and each slice made the program's threads wait for the GIL (a served batch took 19 s
# instead of 3 on the H200 while it ran). So the heap is never walked in Python: the objects are
# listed once (`gc.get_objects`), and each pass over them is one C-level expression per chunk
# (`map` over `gc.get_referents`, set lookups, `compress`) that keeps only the objects
# referring to a tensor in a seeded block, then to such an object; only those few are looked
# at in Python, to find the attribute's name. `gc.get_referents` reads an object's references
# without materialising its `__dict__`. Between chunks the walk sleeps, so it is not runnable
# (docs/architecture.md, "Attaching to a running process").

_naming = {}
# Objects per C-level pass before the GIL is given back (a few ms), and how long the walk then
# sleeps.
_NAMING_CHUNK = 20_000
_NAMING_PAUSE = 0.005
# Items of one list, tuple or dict looked at by name.
_NAMING_ITEMS = 4096


def _start_naming(torch, before, mark):
    annotate = getattr(_lib, "vramtrace_annotate", None)
    if annotate is None:
        if mark is not None:
            mark(b"before attach: not named: this preload has no vramtrace_annotate")
        return
    annotate.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_char_p,
                         ctypes.POINTER(ctypes.c_int64), ctypes.c_uint32]
    annotate.restype = None
    stop = threading.Event()
    _naming["stop"] = stop
    def walk():
        try:
            _name_before_attach(torch, dict(before), annotate, mark, stop)
        except Exception as e:  # never a traceback in the program's stderr
            _note(f"the state at attach is not named: {type(e).__name__}: {e}")
            if mark is not None:
                mark(f"before attach: not named: {type(e).__name__}: {e}".encode())

    t = threading.Thread(target=walk, name="vramtrace-names", daemon=True)
    _naming["thread"] = t
    t.start()


def _name_before_attach(torch, before, annotate, mark, stop):
    """The walk (its own thread): names each seeded block that a module or another object
    holds, and leaves a mark saying how many were named and what the walk cost."""
    import bisect
    import gc
    import time
    import types
    from itertools import chain, compress, repeat
    from operator import not_

    started = time.monotonic()
    starts = sorted(before)
    Tensor, Module = torch.Tensor, torch.nn.Module
    held_most = [0.0]
    passes = [0]

    def block_of(t):
        try:
            if not t.is_cuda:
                return None
            storage = t.untyped_storage()
            ptr, n = storage.data_ptr(), storage.nbytes()
        except Exception:
            return None
        i = bisect.bisect_right(starts, ptr) - 1
        if i < 0:
            return None
        base = starts[i]
        if ptr + max(n, 1) > base + before[base][1]:
            return None
        return base

    def rest(t1):
        """After a stretch holding the GIL: sleeps; True when the walk is to stop."""
        held_most[0] = max(held_most[0], time.monotonic() - t1)
        passes[0] += 1
        time.sleep(_NAMING_PAUSE)
        return stop.is_set()

    t0 = time.monotonic()
    objects = gc.get_objects()
    listing = time.monotonic() - t0
    if rest(t0):
        return
    # Everything that will hold tensors is made after the listing, so no pass finds it.
    names = {}  # block pointer -> ((rank, bytes), label, tensor)

    def offer(t, rank, label):
        base = block_of(t)
        if base is None:
            return
        key = (rank, getattr(t, "nbytes", 0))
        old = names.get(base)
        if old is None or key > old[0]:
            names[base] = (key, label, t)

    def chunks():
        for i in range(0, len(objects), _NAMING_CHUNK):
            yield objects[i:i + _NAMING_CHUNK]

    kinds = set()
    for c in chunks():
        t1 = time.monotonic()
        kinds.update(map(type, c))
        if rest(t1):
            return

    def subclass(k, base):
        try:  # a metaclass's __subclasscheck__ may raise
            return issubclass(k, base)
        except Exception:
            return False

    tensor_kinds = {k for k in kinds if subclass(k, Tensor)}
    module_kinds = {k for k in kinds if subclass(k, Module)}
    # The objects whose references are read: lists, tuples, dicts and instances of classes
    # with a __dict__. Never a frame, generator or coroutine: another thread may be executing
    # it, and reading its references then reads a stack that is changing under it (CPython
    # gh-101975, gh-125603; a served model crashed so on the H200, docs/validation.md). Never
    # a tensor, a type, a module or a function either: none holds a tensor by attribute.
    unsafe = (type, type(sys), types.FunctionType, types.FrameType, types.GeneratorType,
              types.CoroutineType, types.AsyncGeneratorType, Tensor)
    scanned_kinds = {k for k in kinds
                     if (subclass(k, (list, tuple, dict)) or getattr(k, "__dictoffset__", 0))
                     and not subclass(k, unsafe)}
    del kinds
    tensors, modules, scanned = [], [], []
    for c in chunks():
        t1 = time.monotonic()
        kind = list(map(type, c))
        tensors.extend(compress(c, map(tensor_kinds.__contains__, kind)))
        modules.extend(compress(c, map(module_kinds.__contains__, kind)))
        scanned.extend(compress(c, map(scanned_kinds.__contains__, kind)))
        del kind
        if rest(t1):
            return
    objects = scanned
    del scanned

    # Module parameters and buffers, from the root modules: rank 2.
    t1 = time.monotonic()
    children = set()
    for m in modules:
        try:
            children.update(map(id, m.children()))
        except Exception:
            pass
    roots = [m for m in modules if id(m) not in children]
    del modules, children
    if rest(t1):
        return
    for root in roots:
        t1 = time.monotonic()
        try:
            named = [(n, p, "") for n, p in root.named_parameters()]
            named += [(n, b, " (buffer)") for n, b in root.named_buffers()]
        except Exception:
            named = []
        for name, t, what in named:
            if t is not None:
                offer(t, 2, f"weights: {name}{what}")
        del named
        if rest(t1):
            return

    # The other tensors in seeded blocks, and who refers to them.
    t1 = time.monotonic()
    wanted = {}
    for t in tensors:
        base = block_of(t)
        if base is not None and names.get(base, ((0,),))[0][0] < 2:
            wanted[id(t)] = t
    del tensors
    if rest(t1):
        return

    def referring_to(ids):
        """The listed objects that refer to an object of `ids`, one C-level pass per chunk."""
        found = []
        for c in chunks():
            t1 = time.monotonic()
            refs = map(gc.get_referents, c)
            found.extend(compress(c, map(not_, map(ids.isdisjoint, map(map, repeat(id), refs)))))
            if rest(t1):
                return None
        return found

    def items(o):
        """(key, value) of a list, tuple or dict, at most _NAMING_ITEMS."""
        if isinstance(o, dict):
            return list(o.items())[:_NAMING_ITEMS]
        if isinstance(o, (list, tuple)):
            return list(enumerate(o[:_NAMING_ITEMS]))
        return []

    def attributes(o):
        """An instance's attributes (its `__dict__`), or none."""
        if isinstance(o, (type, dict, list, tuple)) or type(o) is type(sys):
            return {}
        try:
            d = object.__getattribute__(o, "__dict__")
        except Exception:
            return {}
        return d if isinstance(d, dict) else {}

    skip_module_keys = ("_parameters", "_buffers", "_modules")

    # Every pass runs before any instance's attributes are read: reading `__dict__` makes an
    # instance keep its attributes in a new dict, which no pass would then find.
    holders = referring_to(set(wanted)) if wanted else []
    if holders is None:
        return
    # Lists, tuples and dicts holding a wanted tensor: named by their owner's attribute.
    containers = {id(h): h for h in holders if isinstance(h, (dict, list, tuple))}
    owners = referring_to(set(containers)) if containers else []
    if owners is None:
        return
    # Dicts holding such a container: an instance's __dict__ where it is not kept inline (before
    # Python 3.12, or once materialised), named by one more pass.
    outer = {id(o): o for o in owners
             if isinstance(o, dict) and id(o) not in containers}
    instances = referring_to(set(outer)) if outer else []
    if instances is None:
        return
    t1 = time.monotonic()
    for o in chain(holders, owners, instances):
        if isinstance(o, (dict, list, tuple)):
            continue  # a container in a container, or a module's globals: not named
        cls = type(o).__name__
        module = isinstance(o, Module)
        attrs = attributes(o)
        for k, v in list(attrs.items()):
            if module and k in skip_module_keys:
                continue
            if id(v) in wanted:
                offer(v, 1, f"{cls}.{k}")
            elif id(v) in containers:
                for i, x in items(v):
                    if id(x) in wanted:
                        offer(x, 1, f"{cls}.{k}[{i!r}]")
    del holders, owners, instances, containers, wanted, outer
    rest(t1)
    objects = None

    live = _state.get("sizes")
    named_bytes = {1: 0, 2: 0}
    count = 0
    for base, ((rank, _), label, t) in sorted(names.items()):
        if stop.is_set():
            break
        if live is not None and base not in live:
            continue  # freed since the attach: the name would land on another block
        dtype = str(getattr(t, "dtype", "")).replace("torch.", "").encode() or None
        shape = [int(x) for x in getattr(t, "shape", ())]
        arr = (ctypes.c_int64 * len(shape))(*shape)
        annotate(base, label.encode("utf-8", "replace")[:200], dtype, arr, len(shape))
        named_bytes[rank] += before[base][1]
        count += 1
    total = sum(b[1] for b in before.values())
    if mark is not None and not stop.is_set():
        mark((f"before attach: named {count} of {len(before)} live blocks from Python objects "
              f"({named_bytes[2] + named_bytes[1]} of {total} bytes: {named_bytes[2]} module "
              f"parameters and buffers, {named_bytes[1]} other objects' attributes); "
              f"{len(roots)} root modules; the walk took "
              f"{(time.monotonic() - started) * 1e3:.0f} ms, listing the objects "
              f"{listing * 1e3:.1f} ms, at most {held_most[0] * 1e3:.1f} ms between giving "
              f"the GIL back, {passes[0]} times").encode())
    _naming["done"] = count
