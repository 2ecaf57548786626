"""vramtrace, as installed from its wheel.

The `vramtrace` command is the CLI (`vramtrace run -- CMD`). This package holds what the CLI
preloads into a traced program, so that it can be set up by hand where no CLI starts the
program (a container's entry point, a systemd unit; see docs/deploy.md):

    LD_PRELOAD=$(python -m vramtrace --preload) VRAMTRACE_DIR=/traces python -m vllm.entrypoints.openai.api_server ...

`vramtrace.probe` is the Python probe (`vt.annotate(tensor, "o")`, `with vt.range("prefill"):`);
it is a no-op in a process without the preload.
"""
import os

__all__ = ["PRELOAD", "PYTHON_PROBE", "preload_path"]

_HERE = os.path.dirname(os.path.abspath(__file__))

#: The recorder, `libvramtrace_preload.so`, for `LD_PRELOAD`.
PRELOAD = os.path.join(_HERE, "libvramtrace_preload.so")
#: The PyTorch probe's autostart directory (`vramtrace run` puts it on `PYTHONPATH`).
PYTHON_PROBE = os.path.join(_HERE, "python", "autostart")


def preload_path() -> str:
    """The installed preload's path; raises FileNotFoundError naming it if the install lacks it."""
    if not os.path.isfile(PRELOAD):
        raise FileNotFoundError(
            f"vramtrace's preload {PRELOAD} is missing: the install is damaged; "
            "reinstall it (pip install --force-reinstall vramtrace)"
        )
    return PRELOAD
