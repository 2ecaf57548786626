"""`python -m vramtrace --preload` prints the installed preload's path (for LD_PRELOAD);
`python -m vramtrace --python-probe` the PyTorch probe's autostart directory (for PYTHONPATH)."""
import sys

from . import PYTHON_PROBE, preload_path


def main(argv):
    if argv == ["--preload"]:
        try:
            print(preload_path())
        except FileNotFoundError as e:
            print(f"vramtrace: {e}", file=sys.stderr)
            return 1
        return 0
    if argv == ["--python-probe"]:
        print(PYTHON_PROBE)
        return 0
    print("usage: python -m vramtrace --preload | --python-probe\n"
          "(the CLI itself is the `vramtrace` command)", file=sys.stderr)
    return 2


sys.exit(main(sys.argv[1:]))
