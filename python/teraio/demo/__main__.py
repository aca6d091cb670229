"""python -m teraio.demo (see teraio/demo/__init__.py)."""
import sys

from .cli import main

if __name__ == "__main__":  # not when multiprocessing's spawn imports it in a child
    sys.exit(main())
