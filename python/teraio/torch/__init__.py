"""teraio.torch — the PyTorch adapter.

* :func:`offload` — the one call: profiles, plans, runs and re-plans.  It
  returns a :class:`~teraio.torch.session.Session`: an
  :class:`~teraio.torch.eager.EagerSession`, or with ``compile=True`` a
  :class:`~teraio.torch.compile.CompiledSession`.
* :class:`Profiler` (teraio.torch.profiler) records an iteration's kernels
  and tensors as a trace.
* :class:`OffloadRuntime` (teraio.torch.runtime, over libteraio's
  runtime.h) executes an offload plan while training runs.

Imports point one way: session <- eager, compile; runtime and profiler
below them; this module picks a driver.
"""
from __future__ import annotations

import torch

from .eager import EagerSession
from .profiler import Profiler
from .runtime import OffloadRuntime
from .session import Session, ssd_dirs

Offload = EagerSession  # the name before teraio.torch.session

__all__ = ["offload", "Session", "EagerSession", "Offload", "Profiler", "OffloadRuntime", "ssd_dirs"]


def offload(model: torch.nn.Module, optimizer=None, capacity=0.5, ssd=None, *, compile: bool = False,
            **options) -> Session:
    """Offload `model`'s and `optimizer`'s tensors to SSD (and host memory,
    with ``host_cap_bytes``) so that at most ``capacity`` bytes stay
    resident at every kernel of every planned step.

    ``capacity``: bytes (int), or a share of the profiled peak (float in
    (0, 1]).  ``ssd``: one or more directories (one per SSD; tensors are
    striped over them); under torchrun ``{rank}`` and ``{local_rank}`` in a
    directory are this process's ("/mnt/nvme{local_rank}/teraio"), or ``ssd``
    is one list of directories per local rank (see :func:`ssd_dirs`).  The
    directories must exist.  Options: ``profile_iterations`` (2),
    ``reprofile_after`` (2), ``max_plans`` (4), ``host_cap_bytes`` (0),
    ``bandwidth_share`` (0.7: the share of the SSD bandwidth the planner may
    book), ``ssd_gbps`` ((read, write) GB/s; default: measured through the
    engine), ``space_bytes`` (SSD space; default twice the peak), ``safe``
    (True), ``staging`` (default: on for device memory), ``name``.  Every
    option is checked here.  See teraio.torch.session.

    ``compile=True``: the model is compiled (``torch.compile`` with
    teraio's backend; ``compile_model=False`` leaves that to you, with
    ``session.backend``) and the migrations are calls in the compiled
    program instead of a dispatch mode (teraio.torch.compile,
    docs/compile.md), with the same options and methods."""
    if not isinstance(compile, bool):
        raise TypeError(f"teraio.torch.offload: compile must be True or False, got {compile!r}")
    if "compile_model" in options and not isinstance(options["compile_model"], bool):
        raise TypeError(f"teraio.torch.offload: compile_model must be True or False, got {options['compile_model']!r}")
    if compile:
        from .compile import CompiledSession
        return CompiledSession(model, optimizer, capacity, ssd, **options)
    if "compile_model" in options:
        raise TypeError("teraio.torch.offload: compile_model is an option of compile=True")
    return EagerSession(model, optimizer, capacity, ssd, **options)
