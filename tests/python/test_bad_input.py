"""Bad input to the Python adapter and the demo: clear errors, unchanged results.

Each test pins an input that once broke the adapter or the demo."""
import subprocess
import sys

import pytest
import torch

from teraio.core import Engine, Lifetime, Plan
from teraio.torch import OffloadRuntime, Profiler
from teraio.torch._ids import global_tensors

from conftest import TinyJob


class WithUnused(TinyJob):
    """TinyJob whose model also holds a parameter and a buffer that no
    iteration touches (a frozen head, an eval-only buffer)."""

    def __init__(self):
        super().__init__()
        self.model.unused_head = torch.nn.Linear(64, 64)
        self.model.register_buffer("unused_buffer", torch.ones(100))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, foreach=False)


def test_model_with_unused_parameter_is_profiled_and_trained(ssd_dir):
    """A global tensor no kernel accesses used to make Profiler.trace() fail
    ("tensor 2 is never accessed by any kernel").  It is now left out of the
    trace, the runtime binds the other global tensors by name, and training
    with offloading gives the same losses bit for bit."""
    ref = WithUnused()
    ref_losses = [ref.step(i).item() for i in range(len(ref.batches))]

    job = WithUnused()
    prof = Profiler(job.model, job.opt)
    losses = []
    for i in range(2):
        with prof.iteration():
            losses.append(job.step(i).item())
    trace = prof.trace()
    traced = {trace.tensor_name(i) for i in range(trace.n_tensors) if trace.tensor_is_global(i)}
    every = {name for _, _, name in global_tensors(job.model, job.opt)}
    unused = {n for n in every if n.startswith(("unused_head.", "unused_buffer"))}
    assert unused == {"unused_head.weight", "unused_head.bias", "unused_buffer"}  # no grad, no state
    assert traced == every - unused
    lt = Lifetime(trace)
    plan = Plan.build(trace, lt, lt.peak_bytes // 2, ssd_read_gbps=1.0, ssd_write_gbps=1.0)
    assert plan.n_migrations > 0
    engine = Engine([ssd_dir], capacity_bytes=2 * lt.peak_bytes + (16 << 20))
    rt = OffloadRuntime(job.model, job.opt, trace, plan, engine)
    for i in range(2, len(job.batches)):
        with rt.iteration():
            losses.append(job.step(i).item())
    stats = rt.stats()
    rt.close()
    assert losses == ref_losses
    assert stats["bytes_offloaded"] > 0 and not stats["diverged"]
    for a, b in zip(job.model.parameters(), ref.model.parameters()):
        assert torch.equal(a, b)
