"""Python multiprocessing with the spawn start method (as vLLM starts its workers): two worker
processes each allocate through libcuda via ctypes (dlopen + dlsym) and print what they got."""
import ctypes
import multiprocessing as mp
import os


def work(size):
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    dev = ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    ctx = ctypes.c_void_p()
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    ptr = ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)) == 0
    assert cuda.cuMemFree_v2(ptr) == 0
    # One write(2) per line: the two workers share the pipe, and print() writes the text and the
    # newline separately, so their lines could interleave.
    os.write(1, f"worker {os.getpid()} {ptr.value} {size}\n".encode())


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    workers = [ctx.Process(target=work, args=(size,)) for size in (111111, 222222)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
        assert w.exitcode == 0, w.exitcode
    print("parent", os.getpid(), flush=True)
