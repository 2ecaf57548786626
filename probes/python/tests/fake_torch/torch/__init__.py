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

    dtype = "uint8"

    def data_ptr(self):
        return self._ptr

    @property
    def nbytes(self):
        return self._nbytes

    @property
    def shape(self):
        return (self._nbytes,)

    def untyped_storage(self):
        return _Storage(self)

    def narrow_bytes(self, offset, n):
        """A view of `n` bytes at `offset`: its own data pointer, this block's storage."""
        return _View(self, offset, n)

    def __del__(self):
        cuda.fake_free(self._ptr, self._nbytes, self._device)


class _Storage:
    """What `untyped_storage()` gives: the block's pointer and bytes."""

    def __init__(self, block):
        self._block = block

    def data_ptr(self):
        return self._block._ptr

    def nbytes(self):
        return self._block._nbytes


class _View(Tensor):
    def __init__(self, base, offset, n):
        self._base, self._offset, self._n = base, offset, n

    dtype = "uint8"

    def data_ptr(self):
        return self._base._ptr + self._offset

    @property
    def nbytes(self):
        return self._n

    @property
    def shape(self):
        return (self._n,)

    def untyped_storage(self):
        return self._base.untyped_storage()


def empty(n, dtype=None, device="cuda"):
    """`n` bytes (uint8 only) on `device` ("cuda" or "cuda:N")."""
    assert dtype == uint8, "the stand-in's empty() knows uint8 only"
    index = int(device.split(":")[1]) if ":" in device else 0
    return _Block(n, index)


from . import nn  # noqa: E402,F401
