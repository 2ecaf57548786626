"""The attach's naming walk (`_name_before_attach` in vramtrace_torch.py) on a stand-in heap:
it names the seeded blocks a module's parameters, an instance's attribute, a list attribute
and a dict attribute hold, and never reads the references of a frame, a generator or a
coroutine (another thread may be executing one: reading its references then reads a stack that
is changing, which crashed a server on the H200). Prints "ok" and the names; exits 1 on a
failed check."""
import gc
import importlib.util
import os
import sys
import threading
import time
import types

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "vramtrace_torch_under_test", os.path.join(here, "..", "vramtrace_torch.py"))
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)
probe._NAMING_PAUSE = 0.0

torch = types.ModuleType("torch")
torch.nn = types.ModuleType("torch.nn")


class Tensor:
    is_cuda = True

    def __init__(self, ptr, nbytes):
        self.ptr, self.nbytes, self.shape, self.dtype = ptr, nbytes, (nbytes,), "uint8"

    def untyped_storage(self):
        return Storage(self)


class Storage:
    def __init__(self, t):
        self.t = t

    def data_ptr(self):
        return self.t.ptr

    def nbytes(self):
        return self.t.nbytes


class Module:
    def __init__(self):
        self._parameters, self._buffers, self._modules = {}, {}, {}

    def children(self):
        return iter(self._modules.values())

    def named_parameters(self):
        return iter(self._parameters.items())

    def named_buffers(self):
        return iter(())


torch.Tensor, torch.nn.Module = Tensor, Module
MIB = 1 << 20
before, tensors = {}, []
for i in range(8):
    ptr = (1 << 40) + i * 2 * MIB
    before[ptr] = (0, MIB, MIB)
    tensors.append(Tensor(ptr, MIB))


class PagedAttentionCache:
    def __init__(self):
        self.key_cache = [tensors[0], tensors[1]]


class ContinuousBatchingIOs:
    def __init__(self):
        self.output_ids = tensors[2]
        self.by_name = {"scratch": tensors[3]}


model = Module()
model._parameters["embed"] = tensors[4]
cache, ios = PagedAttentionCache(), ContinuousBatchingIOs()


def holding(t):
    """A generator that holds a tensor in a local while suspended."""
    x = t
    while True:
        yield x


suspended = holding(tensors[5])
next(suspended)
frame = sys._getframe()  # a frame object the collector lists
stop = threading.Event()


def busy(t):
    """Another thread, executing generators while the walk runs."""
    while not stop.is_set():
        for _ in holding(t):
            break


thread = threading.Thread(target=busy, args=(tensors[6],), daemon=True)
thread.start()
del tensors

read = set()
real = gc.get_referents


def spy(*objs):
    read.update(map(type, objs))
    return real(*objs)


gc.get_referents = spy
names = {}


def annotate(base, label, dtype, arr, n):
    names[base] = label.decode()


marks = []
probe._state["sizes"] = None
probe._name_before_attach(torch, before, annotate, marks.append, threading.Event())
gc.get_referents = real
stop.set()
thread.join()

failed = False
unsafe = read & {types.FrameType, types.GeneratorType, types.CoroutineType,
                 types.AsyncGeneratorType}
if unsafe:
    print("read the references of", sorted(t.__name__ for t in unsafe))
    failed = True
want = {
    0: "PagedAttentionCache.key_cache[0]",
    1: "PagedAttentionCache.key_cache[1]",
    2: "ContinuousBatchingIOs.output_ids",
    3: "ContinuousBatchingIOs.by_name['scratch']",
    4: "weights: embed",
}
for i, label in want.items():
    got = names.get((1 << 40) + i * 2 * MIB)
    if got != label:
        print(f"block {i}: {got!r}, wanted {label!r}")
        failed = True
# The generator's local is not named (nothing reads a generator); the busy thread's argument
# may be (`Thread._args[0]`, while the thread runs).
if not marks or not any(f"named {n} of 8 live blocks".encode() in marks[-1] for n in (5, 6)):
    print("mark:", marks)
    failed = True
print("names", sorted(names.values()))
print("fail" if failed else "ok")
sys.exit(1 if failed else 0)
