"""teraio.torch — the PyTorch adapter: profile an iteration, run with a plan.

* :class:`Profiler` records an iteration's kernels and tensors as a trace.
* :class:`OffloadRuntime` executes an offload plan while training runs.
"""
from .offload import OffloadRuntime
from .profiler import Profiler

__all__ = ["Profiler", "OffloadRuntime"]
