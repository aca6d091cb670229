"""teraio.torch — the PyTorch adapter.

* :func:`offload` — the one call: profiles, plans, runs and re-plans
  (teraio.torch.session).
* :class:`Profiler` records an iteration's kernels and tensors as a trace.
* :class:`OffloadRuntime` executes an offload plan while training runs.
"""
from .offload import OffloadRuntime
from .profiler import Profiler
from .session import Offload, offload

__all__ = ["offload", "Offload", "Profiler", "OffloadRuntime"]
