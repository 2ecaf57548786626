"""What a benchmark turn is, for the processes that take turns in several modes (issue 19's
cost benchmarks: decode_bench.py --turns, serve_bench.sh's toggled server). One definition, so
that the decode and serve figures compare the same things:
  on       as started (under `vramtrace run`: tensor capture on)
  off      tensor capture paused (`vramtrace_torch.pause()`; the preload and its tracker stay in)
  history  paused, and PyTorch's recorder on (`_record_memory_history(stacks="python")`)
`enter(mode)` before the turn's work, `leave(mode)` after it."""
import sys

MODES = ("on", "off", "history")


def _probe():
    """The PyTorch probe, when `vramtrace run` started it in this process."""
    return sys.modules.get("vramtrace_torch")


def enter(mode, why):
    """Starts a turn in `mode` (`why` goes into the trace's note when capture is paused)."""
    if mode not in MODES:
        raise ValueError(f"unknown turn mode {mode!r} (one of {', '.join(MODES)})")
    probe = _probe()
    if mode != "on" and probe is not None:
        probe.pause(why)
    if mode == "history":
        import torch

        torch.cuda.memory._record_memory_history(stacks="python")


def leave(mode):
    """Ends a turn in `mode`: the process is as started again."""
    if mode == "history":
        import torch

        torch.cuda.memory._record_memory_history(enabled=None)
    probe = _probe()
    if mode != "on" and probe is not None:
        probe.resume()
