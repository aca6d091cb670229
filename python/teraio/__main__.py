"""`python -m teraio` and the `teraio` console script: run the C command.

The command-line tool is the C program built with the library (installed next
to this package as ``teraio/_bin/teraio``, or ``build/bin/teraio`` in a source
checkout); this wrapper only finds it and replaces the process with it.
"""
import os
import sys
from pathlib import Path


def _binary() -> str:
    here = Path(__file__).resolve().parent
    for cand in (here / "_bin" / "teraio", here.parent.parent / "build" / "bin" / "teraio"):
        if cand.exists():
            return str(cand)
    sys.stderr.write("teraio: the teraio binary was not found (build it with 'make')\n")
    sys.exit(1)


def main() -> None:
    exe = _binary()
    # `teraio advise --model` runs the tracer in this Python.
    os.environ.setdefault("TERAIO_PYTHON", sys.executable)
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
