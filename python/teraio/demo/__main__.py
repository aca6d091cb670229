"""python -m teraio.demo (see teraio/demo/__init__.py)."""
import sys

from .cli import main

sys.exit(main())
