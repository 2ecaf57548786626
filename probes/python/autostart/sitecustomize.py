"""Put on PYTHONPATH by `vramtrace run`: activates probes/python/vramtrace_torch.py right after
the program's `import torch` finishes (nothing is imported before that, and nothing at all in a
program that never imports torch), then runs the environment's own sitecustomize, if any."""
import importlib.abc
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _AfterTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_activate(module):
            exec_module(module)
            try:
                sys.path.insert(0, os.path.dirname(_HERE))
                import vramtrace_torch

                vramtrace_torch.activate()
            except Exception as e:  # never break the program
                sys.stderr.write(f"vramtrace: torch probe not active: {e}\n")
            finally:
                sys.path.remove(os.path.dirname(_HERE))

        spec.loader.exec_module = exec_then_activate
        return spec


if os.environ.get("VRAMTRACE_TORCH_PROBE", "1") != "0":
    sys.meta_path.insert(0, _AfterTorch())

# The environment's own sitecustomize, which ours shadows.
del sys.modules["sitecustomize"]
_path = sys.path[:]
try:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    import sitecustomize  # noqa: F401
except ImportError:
    pass
finally:
    sys.path[:] = _path
