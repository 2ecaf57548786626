"""What transformers does with torch, reduced: at import it asks whether torch is installed with
`importlib.util.find_spec` (transformers' utils/import_utils.py `_is_package_available`), and
imports it only when a model is loaded, through importlib (its `_LazyModule`)."""
import importlib
import importlib.util

_torch_available = importlib.util.find_spec("torch") is not None


def is_torch_available():
    return _torch_available


def load_model():
    return importlib.import_module("torch")
