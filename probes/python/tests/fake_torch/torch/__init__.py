"""A stand-in for the few pieces of PyTorch the probe uses (no CUDA here): a caching allocator
that updates its counter, then calls the gpu-trace allocation callbacks, as PyTorch's does; calls
the deallocation callbacks before the counter drops; and calls the OOM observers on a refusal."""
from . import _C, cuda  # noqa: F401

__version__ = "0.0+stand-in"


class Tensor:
    is_cuda = True


uint8 = "uint8"


class _Block(Tensor):
    """What `empty` returns: a block of the stand-in allocator, given back when dropped."""

    def __init__(self, nbytes, device):
        self._nbytes = nbytes
        self._device = device
        self._ptr = cuda.fake_alloc(nbytes, device)

    def data_ptr(self):
        return self._ptr

    def __del__(self):
        cuda.fake_free(self._ptr, self._nbytes, self._device)


def empty(n, dtype=None, device="cuda"):
    """`n` bytes (uint8 only) on `device` ("cuda" or "cuda:N")."""
    assert dtype == uint8, "the stand-in's empty() knows uint8 only"
    index = int(device.split(":")[1]) if ":" in device else 0
    return _Block(n, index)
