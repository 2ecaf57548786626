"""How servers and launchers come to torch, each a way the probe once missed or might miss:
`python3 activation_prog.py MODE`. Each process that allocates makes five 1 MiB blocks through
the stand-in torch and prints `tensor PID PTR SIZE` per block; it knows nothing of vramtrace.

MODE:
- plain: `import torch`.
- find_spec: `importlib.util.find_spec("torch")` first (what transformers' is_torch_available
  does), then `import torch`.
- transformers: imports stand_in_transformers, which checks for torch with find_spec at import
  and imports it later through importlib, as transformers' lazy modules do.
- thread: torch imported on the main thread, the blocks allocated on a second one.
- spawn: a multiprocessing worker started with the spawn method checks for torch with find_spec,
  imports it and allocates; the parent never imports torch.
- fork: the parent imports torch, allocates two blocks, and a worker forked by multiprocessing
  allocates five.
- torchrun: a launcher that never imports torch starts two copies of this program (mode
  `rank`) with its own environment plus RANK, as torchrun does; each checks with find_spec
  first, then imports torch and allocates.
- none: imports torch and allocates nothing, but leaves a mark (a record: the process has a
  trace file).
- pth: torch was imported before any sitecustomize ran (the test puts `import torch` in a .pth
  file of the user site directory); the program only allocates.
- finder_ahead: the program puts its own finder first on sys.meta_path, which finds torch
  itself (as some import hooks do), imports torch, then a builtin module not imported yet, then
  allocates.
"""
import ctypes
import importlib.abc
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import threading

MIB = 1 << 20


def allocate(n=5):
    import torch

    for _ in range(n):
        ptr = torch.cuda.fake_alloc(MIB)
        os.write(1, f"tensor {os.getpid()} {ptr} {MIB}\n".encode())


def spawn_worker():
    assert importlib.util.find_spec("torch") is not None
    allocate()


def main(mode):
    if mode == "plain":
        import torch  # noqa: F401

        allocate()
    elif mode in ("find_spec", "rank"):
        assert importlib.util.find_spec("torch") is not None
        import torch  # noqa: F401

        allocate()
    elif mode == "transformers":
        import stand_in_transformers

        assert stand_in_transformers.is_torch_available()
        stand_in_transformers.load_model()
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
        assert p.exitcode == 0, p.exitcode
    elif mode == "fork":
        import multiprocessing as mp

        import torch  # noqa: F401

        allocate(2)
        p = mp.get_context("fork").Process(target=allocate)
        p.start()
        p.join()
        assert p.exitcode == 0, p.exitcode
    elif mode == "torchrun":
        children = [
            subprocess.Popen([sys.executable, __file__, "rank"], env={**os.environ, "RANK": str(r)})
            for r in range(2)
        ]
        assert [c.wait() for c in children] == [0, 0]
    elif mode == "pth":
        assert "torch" in sys.modules, "the .pth file did not import torch"
        allocate()
    elif mode == "finder_ahead":

        class Ahead(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name != "torch":
                    return None
                return importlib.machinery.PathFinder.find_spec(name, path, target)

        # Only the standard finders after the probe's: the first module imported after torch
        # is a builtin one, which only the finder right after the probe's finds (a finder that
        # removed itself there made importlib skip it: ModuleNotFoundError).
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "DistutilsMetaFinder"]
        sys.meta_path.insert(0, Ahead())
        import torch  # noqa: F401

        builtin = next(m for m in sys.builtin_module_names if m not in sys.modules)
        importlib.import_module(builtin)
        allocate()
    elif mode == "none":
        import torch  # noqa: F401

        ctypes.CDLL(None).vramtrace_mark(b"no tensors here")
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1])
