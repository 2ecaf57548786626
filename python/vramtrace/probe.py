"""The Python probe (`probes/python/vramtrace_probe.py`) as `vramtrace.probe`:

    from vramtrace import probe as vt
    with vt.range("prefill/layer.3/gdn"):
        o = torch.empty_like(v)
        vt.annotate(o, "o")

One module object with `import vramtrace_probe` where that is on the path too.
"""
import importlib.util
import os
import sys

if "vramtrace_probe" in sys.modules:
    _mod = sys.modules["vramtrace_probe"]
else:
    _path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "vramtrace_probe.py")
    _spec = importlib.util.spec_from_file_location("vramtrace_probe", _path)
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules["vramtrace_probe"] = _mod
    _spec.loader.exec_module(_mod)

sys.modules[__name__] = _mod
