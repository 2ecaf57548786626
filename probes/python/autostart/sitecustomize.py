"""Put on PYTHONPATH by `vramtrace run`: activates probes/python/vramtrace_torch.py right after
the program's torch module has finished executing (nothing is imported before that, and nothing
at all in a program that never imports torch), then runs the environment's own sitecustomize,
if any.

The finder stays first on `sys.meta_path` until torch's module has actually executed (and
then for good, inert: see _activate). An `importlib.util.find_spec("torch")` (which
transformers and many others call to see whether torch is installed) gets a spec whose loader
activates the probe when executed; that spec thrown away changes nothing, and the next
`import torch` gets another. Should torch be imported
past it, the next module imported after torch starts the probe. A torch imported before
this file ran (a `.pth` file, the environment's own sitecustomize) is activated here. When the
probe cannot start it says why, once on stderr and in the trace (vramtrace_torch.not_active)."""
import importlib.abc
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_PROBE_DIR = os.path.dirname(_HERE)
_tried = []


def _activate():
    """Starts the probe once per process (a fork child inherits it started)."""
    if _tried:
        return
    _tried.append(True)
    # The finder stays on sys.meta_path, inert (it returns None at once): removing it here,
    # often inside its own find_spec while importlib iterates that very list, would make
    # importlib skip the finder after it for this lookup (a builtin module then not found).
    sys.path.insert(0, _PROBE_DIR)
    try:
        import vramtrace_torch
    except Exception as e:  # never break the program
        sys.stderr.write(f"vramtrace: torch probe: not active: cannot import it from {_PROBE_DIR}: "
                         f"{type(e).__name__}: {e}; tensors are not recorded\n")
        return
    finally:
        sys.path.remove(_PROBE_DIR)
    try:
        vramtrace_torch.activate()
    except Exception as e:  # never break the program
        vramtrace_torch.not_active(f"{type(e).__name__}: {e}")


def _torch_executed():
    """torch is in sys.modules and its module has finished executing."""
    m = sys.modules.get("torch")
    return m is not None and not getattr(getattr(m, "__spec__", None), "_initializing", False)


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds torch with the finders after it and makes the spec's loader start the probe once
    torch's module has executed. Every other name is left to the others; but once torch has
    executed without passing through here (a finder put ahead of this one found it, a loader
    that is a class was not wrapped), the next module looked for starts the probe."""

    def find_spec(self, name, path=None, target=None):
        if _tried:
            return None
        if name != "torch":
            if "torch" in sys.modules and _torch_executed():
                _activate()
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None or isinstance(loader, type):
            # A loader shared by every module it loads (a class) is not touched: the probe
            # starts when the next module is looked for (above).
            return spec

        def exec_then_activate(module):
            exec_module(module)  # if torch fails to import, the finder stays for a retry
            if getattr(module, "__name__", None) != "torch":
                return
            try:
                del loader.exec_module
            except AttributeError:
                pass
            _activate()

        loader.exec_module = exec_then_activate
        return spec


_FINDER = _AfterTorch()

if os.environ.get("VRAMTRACE_TORCH_PROBE", "1") != "0":
    if _torch_executed():
        _activate()  # imported before us (a .pth file): start now
    else:
        sys.meta_path.insert(0, _FINDER)


def _run_own_sitecustomize():
    """The environment's own sitecustomize, which ours shadows on sys.path, run as site would
    have run it. site is importing us at this moment, and its import machinery takes
    sys.modules["sitecustomize"] back when we return: the entry must still be there (removing
    it made every program print "Error in sitecustomize ... KeyError: 'sitecustomize'" when the
    environment had none). When there is one, it takes our place there, as without us."""
    import importlib.util
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
