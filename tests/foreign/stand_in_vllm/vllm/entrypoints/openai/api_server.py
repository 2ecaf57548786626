"""A stand-in for `python -m vllm.entrypoints.openai.api_server` in tests/foreign/wheel.sh: no
vLLM, no GPU. Like vLLM it starts its engine worker with multiprocessing's spawn method; the
worker loads libcuda.so.1 (the stand-in driver on LD_LIBRARY_PATH) with ctypes, allocates
`--kv-bytes` for "the KV cache" and a 1 MiB activation, frees the activation, and exits. Prints
`served PID WORKER-PID` and exits 0 (it serves nothing)."""
import argparse
import ctypes
import multiprocessing as mp
import os


def worker(kv_bytes, q):
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    dev = ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    ctx = ctypes.c_void_p()
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    kv, act = ctypes.c_uint64(), ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(kv), ctypes.c_size_t(kv_bytes)) == 0
    assert cuda.cuMemAlloc_v2(ctypes.byref(act), ctypes.c_size_t(1 << 20)) == 0
    assert cuda.cuMemFree_v2(act) == 0
    q.put(os.getpid())


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="stand-in")
    ap.add_argument("--kv-bytes", type=int, default=64 << 20)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    w = ctx.Process(target=worker, args=(args.kv_bytes, q))
    w.start()
    pid = q.get(timeout=120)
    w.join()
    assert w.exitcode == 0, w.exitcode
    print(f"served {os.getpid()} {pid}", flush=True)
