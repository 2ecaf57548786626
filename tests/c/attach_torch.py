"""A Python program vramtrace attaches to, on the stand-in torch (probes/python/tests/fake_torch
on PYTHONPATH) and the stand-in driver: before the attach it builds what a server holds, a
module with parameters and a buffer, a paged cache's keys and values (transformers'
PagedAttentionCache's attribute names), an engine's static buffers (ContinuousBatchingIOs',
one a view into another) and a tensor no object holds an attribute of; prints each as
"H <what> <block pointer> <block bytes>"; then allocates and frees a tensor in a loop, printing
"T0 <i> <ptr> <bytes> <probing before> <probing after>" (1 when the probe's allocation callback
is registered or its native capture is on, before and after the allocation), and at the end
"callbacks <allocation> <deallocation>" (the callbacks registered) and "capture <how>". argv[1]: iterations; argv[2]: milliseconds between them; argv[3], if given:
seconds the main thread then sleeps once, in one call, as soon as the probe is active (an
interpreter that reaches no pending call meanwhile), printing "blocked" and "unblocked"."""
import ctypes
import sys
import time

cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0

import torch  # noqa: E402  the stand-in
from torch.cuda import _gpu_trace  # noqa: E402

MIB = 1 << 20


def empty(n):
    return torch.empty(n, dtype=torch.uint8, device="cuda")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Parameter(empty(1 * MIB))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Parameter(empty(3 * MIB))
        self.layers = Layers()
        self.register_buffer("inv_freq", empty(4096))


class Layers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Block()
        self.b = Block()


class PagedAttentionCache:
    def __init__(self, layers):
        self.key_cache = [empty(2 * MIB) for _ in range(layers)]
        self.value_cache = [empty(2 * MIB) for _ in range(layers)]


class ContinuousBatchingIOs:
    def __init__(self):
        self._bulk_input_tensor = empty(64 * 1024)
        self.input_ids = self._bulk_input_tensor.narrow_bytes(0, 4096)
        self.output_ids = empty(8192)


model = Model()
cache = PagedAttentionCache(2)
ios = ContinuousBatchingIOs()
scratch = [empty(512 * 1024)]


def show(what, t):
    print(f"H {what} {t.data_ptr()} {t.nbytes}", flush=True)


for name, p in model.named_parameters():
    show(f"weights:{name}", p)
for name, b in model.named_buffers():
    show(f"weights:{name}", b)
for i, t in enumerate(cache.key_cache + cache.value_cache):
    show(f"kv:{i}", t)
show("engine:_bulk_input_tensor", ios._bulk_input_tensor)
show("engine:output_ids", ios.output_ids)
show("unnamed:scratch", scratch[0])
print("ready", flush=True)



def probing():
    m = sys.modules.get("vramtrace_torch")
    native = m is not None and m.capture.get("how") == "native"
    return len(_gpu_trace.alloc_callbacks) + int(native)


n = int(sys.argv[1])
for i in range(n):
    before = probing()
    t = empty(1000 + 512 * i)
    after = probing()
    print(f"T0 {i} {t.data_ptr()} {t.nbytes} {before} {after}", flush=True)
    del t
    if len(sys.argv) > 3 and after == 1:
        print("blocked", flush=True)
        time.sleep(float(sys.argv.pop(3)))
        print("unblocked", flush=True)
    time.sleep(int(sys.argv[2]) / 1000)
print(f"callbacks {len(_gpu_trace.alloc_callbacks)} {len(_gpu_trace.free_callbacks)}", flush=True)
m = sys.modules.get("vramtrace_torch")
print(f"capture {m.capture.get('how') if m else None}", flush=True)
# Given back before the interpreter shuts down (the stand-in cannot import then).
del model, cache, ios, scratch, p, b
print("done", flush=True)
