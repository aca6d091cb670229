"""teraio — the storage layer of LLM training.

The C library libteraio does the work (trace, lifetime analysis, planning, the
I/O engine, the runtime); this package is the thin PyTorch adapter over it.
"""
from ._lib import TeraioError, features, version

__version__ = version()
__all__ = ["TeraioError", "version", "features", "__version__"]
