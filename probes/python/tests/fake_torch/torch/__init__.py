"""A stand-in for the few pieces of PyTorch the probe uses (no CUDA here): a caching allocator
that updates its counter, then calls the gpu-trace allocation callbacks, as PyTorch's does; calls
the deallocation callbacks before the counter drops; and calls the OOM observers on a refusal."""
from . import _C, cuda  # noqa: F401

__version__ = "0.0+stand-in"


class Tensor:
    is_cuda = True
