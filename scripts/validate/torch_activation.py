"""The PyTorch probe's activation on the GPU, one way of reaching torch per MODE (issue 19
item 1); run under `vramtrace run` by scripts/validate/torch_activation.sh. Each process that
allocates makes five 1 MiB CUDA tensors and prints `tensor PID`; the script then checks that
`vramtrace summary --json` says `recorded: 5 tensor events` for each of those pids.

MODE: plain, find_spec (importlib.util.find_spec("torch") first), transformers (`import
transformers` first, which calls find_spec("torch")), thread (the tensors made on a second
thread), spawn (a multiprocessing spawn worker), fork (the parent imports torch without touching
CUDA, a fork worker allocates), torchrun (run under torchrun --nproc-per-node 2).
"""
import importlib.util
import os
import sys
import threading


def allocate():
    import torch

    keep = [torch.empty(1 << 20, dtype=torch.uint8, device="cuda") for _ in range(5)]
    torch.cuda.synchronize()
    print("tensor", os.getpid(), flush=True)
    return keep


def spawn_worker():
    allocate()


def main(mode):
    if mode == "plain":
        import torch  # noqa: F401

        allocate()
    elif mode == "find_spec":
        assert importlib.util.find_spec("torch") is not None
        import torch  # noqa: F401

        allocate()
    elif mode == "transformers":
        import transformers  # noqa: F401

        allocate()
    elif mode == "thread":
        import torch  # noqa: F401

        t = threading.Thread(target=allocate)
        t.start()
        t.join()
    elif mode == "spawn":
        import multiprocessing as mp

        p = mp.get_context("spawn").Process(target=spawn_worker)
        p.start()
        p.join()
        assert p.exitcode == 0
    elif mode == "fork":
        import multiprocessing as mp

        import torch  # noqa: F401  (CUDA untouched in the parent: the child may use it)

        p = mp.get_context("fork").Process(target=allocate)
        p.start()
        p.join()
        assert p.exitcode == 0
    elif mode == "torchrun":
        assert importlib.util.find_spec("torch") is not None
        allocate()
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1])
