"""Name PyTorch tensors and code ranges in a vramtrace trace, from Python.

Works when the process runs under `vramtrace run` (the preload is loaded); otherwise every call
is a cheap no-op, so the calls can stay in production code.

    import vramtrace_probe as vt
    with vt.range("prefill/layer.3/gdn"):
        o = torch.empty_like(v)
        vt.annotate(o, "o")

Uses only ctypes: the preload exports `vramtrace_annotate`, `vramtrace_range_push` and
`vramtrace_range_pop` (see probes/preload/include/vramtrace.h).
"""
import contextlib
import ctypes

_lib = ctypes.CDLL(None)


def _sym(name, argtypes):
    try:
        f = getattr(_lib, name)
    except AttributeError:
        return None
    f.argtypes = argtypes
    f.restype = None
    return f


_annotate = _sym(
    "vramtrace_annotate",
    [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_uint32],
)
_push = _sym("vramtrace_range_push", [ctypes.c_char_p])
_pop = _sym("vramtrace_range_pop", [])


def loaded() -> bool:
    """True when the vramtrace preload is in this process."""
    return _annotate is not None


def annotate(tensor, name: str) -> None:
    """Give the allocation behind `tensor` a name, with the tensor's dtype and shape.

    With PyTorch's caching allocator a tensor is a piece of a larger driver allocation; the name
    then lands only if the tensor starts its segment. Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1
    for one driver allocation per tensor.
    """
    if _annotate is None:
        return
    shape = list(tensor.shape)
    arr = (ctypes.c_int64 * len(shape))(*shape)
    dtype = str(tensor.dtype).replace("torch.", "")
    _annotate(tensor.data_ptr(), name.encode(), dtype.encode(), arr, len(shape))


def push(name: str) -> None:
    """Open a named range on this thread: allocations inside it carry the range as their label."""
    if _push is not None:
        _push(name.encode())


def pop() -> None:
    """Close the innermost range of this thread."""
    if _pop is not None:
        _pop()


@contextlib.contextmanager
def range(name: str):  # noqa: A001 - mirrors nvtx.range
    """`with range("name"):` pushes on entry and pops on exit."""
    push(name)
    try:
        yield
    finally:
        pop()
