"""The stand-in's `torch.nn`: a Module that registers parameters, buffers and submodules as
PyTorch's does (`_parameters`, `_buffers`, `_modules`) and names them the same way."""
from . import Tensor


class Parameter(Tensor):
    """A parameter: the block it wraps, as PyTorch's Parameter shares its tensor's storage."""

    def __init__(self, data):
        self.data = data

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def nbytes(self):
        return self.data.nbytes

    @property
    def shape(self):
        return self.data.shape

    def data_ptr(self):
        return self.data.data_ptr()

    def untyped_storage(self):
        return self.data.untyped_storage()


class Module:
    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_modules", {})

    def __setattr__(self, name, value):
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        for d in ("_parameters", "_buffers", "_modules"):
            table = self.__dict__.get(d, {})
            if name in table:
                return table[name]
        raise AttributeError(name)

    def register_buffer(self, name, tensor):
        self._buffers[name] = tensor

    def _named(self, table, prefix=""):
        for name, t in getattr(self, table).items():
            yield prefix + name, t
        for name, m in self._modules.items():
            yield from m._named(table, prefix + name + ".")

    def named_parameters(self, prefix="", recurse=True):
        return self._named("_parameters", prefix)

    def named_buffers(self, prefix="", recurse=True):
        return self._named("_buffers", prefix)

    def children(self):
        return iter(self._modules.values())
