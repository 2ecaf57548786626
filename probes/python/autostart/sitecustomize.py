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


def _run_own_sitecustomize():
    """The environment's own sitecustomize, which ours shadows on sys.path, run as site would
    have run it. site is importing us at this moment, and its import machinery takes
    sys.modules["sitecustomize"] back when we return: the entry must still be there (removing
    it made every program print "Error in sitecustomize ... KeyError: 'sitecustomize'" when the
    environment had none). When there is one, it takes our place there, as without us."""
    from importlib.machinery import PathFinder

    path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    ours = sys.modules["sitecustomize"]
    theirs = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = theirs
    try:
        spec.loader.exec_module(theirs)
    except BaseException:
        sys.modules["sitecustomize"] = ours
        raise  # site reports it, as it would have without us


_run_own_sitecustomize()
