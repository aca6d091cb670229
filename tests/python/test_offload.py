"""teraio.torch.OffloadRuntime: training with offloading gives identical results."""
import subprocess
import sys

import pytest
import torch

from teraio.core import Engine, Lifetime, Plan
from teraio.torch import OffloadRuntime, Profiler

from conftest import TinyJob


def profiled_runtime(job, ssd_dir, fraction=0.5, staging=None):
    prof = Profiler(job.model, job.opt)
    losses = []
    for i in range(2):
        with prof.iteration():
            losses.append(job.step(i).item())
    trace = prof.trace()
    lt = Lifetime(trace)
    capacity = int(lt.peak_bytes * fraction)
    plan = Plan.build(trace, lt, capacity, ssd_read_gbps=1.0, ssd_write_gbps=1.0)
    engine = Engine([ssd_dir], space_bytes=2 * lt.peak_bytes + (16 << 20))
    rt = OffloadRuntime(job.model, job.opt, trace, plan, engine, staging=staging)
    return rt, plan, lt, losses, engine


def params_bytes(model):
    return [p.detach().clone() for p in model.parameters()]


def test_losses_and_parameters_identical_with_offloading(ssd_dir):
    ref = TinyJob()
    ref_losses = [ref.step(i).item() for i in range(len(ref.batches))]

    job = TinyJob()
    rt, plan, lt, losses, _engine = profiled_runtime(job, ssd_dir)
    assert plan.n_migrations > 0
    for i in range(2, len(job.batches)):
        with rt.iteration():
            loss = job.step(i)
        losses.append(loss.item())
    stats = rt.stats()
    rt.close()  # brings everything back
    assert losses == ref_losses  # bit-for-bit
    for a, b in zip(params_bytes(job.model), params_bytes(ref.model)):
        assert torch.equal(a, b)
    for p, q in zip(job.model.parameters(), ref.model.parameters()):
        sa, sb = job.opt.state[p], ref.opt.state[q]
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
    assert stats["bytes_offloaded"] > 0
    assert stats["bytes_prefetched"] > 0
    assert not stats["diverged"]


def test_offloaded_tensor_is_released_and_restored(ssd_dir):
    job = TinyJob()
    rt, plan, lt, _, _engine = profiled_runtime(job, ssd_dir, fraction=0.5)
    with rt.iteration():
        job.step(2)
    # After an iteration, the tensors the plan keeps offloaded across the
    # iteration boundary have no memory; their bytes come back on fetch_all.
    released = sorted(rt._released)
    assert released, "the plan should offload some global tensor over the iteration boundary"
    i = released[0]
    st = rt._ids.get(i)
    assert st.nbytes() == 0
    rt.fetch_all()
    assert st.nbytes() == job_tensor_bytes(plan, i)
    rt.close()


def job_tensor_bytes(plan, i):
    return plan.trace.tensor_bytes(i)


def test_divergence_falls_back_to_on_demand_and_stays_correct(ssd_dir):
    ref = TinyJob()
    ref_losses = [ref.step(i).item() for i in range(4)]
    job = TinyJob()
    rt, _, _, losses, _engine = profiled_runtime(job, ssd_dir)
    with rt.iteration():
        loss = job.step(2)
    losses.append(loss.item())
    with rt.iteration():
        torch.ones(3).add_(1)  # an operator the profile never saw: the sequence diverges
        losses.append(job.step(3))
    losses[-1] = losses[-1].item()
    stats = rt.stats()
    rt.close()
    assert stats["diverged"]
    assert stats["stalls"] > 0  # offloaded tensors were fetched on demand
    assert losses == ref_losses


def test_cli_version_runs():
    out = subprocess.run([sys.executable, "-m", "teraio", "version"], capture_output=True, text=True)
    assert out.returncode == 0
    assert out.stdout.startswith("teraio 0.1.0")


def _train_with_runtime(job, ssd_dir, staging, iterations):
    rt, plan, lt, losses, engine = profiled_runtime(job, ssd_dir, staging=staging)
    for i in range(2, iterations):
        with rt.iteration():
            loss = job.step(i)
        losses.append(loss.item())
    stats = rt.stats()
    rt.close()
    return losses, stats


def test_staged_transfers_give_identical_results(ssd_dir):
    """The staging path (used for device memory without GPUDirect Storage),
    forced on CPU tensors: bytes go tensor -> staging buffer -> SSD and back."""
    ref = TinyJob()
    ref_losses = [ref.step(i).item() for i in range(len(ref.batches))]
    job = TinyJob()
    losses, stats = _train_with_runtime(job, ssd_dir, True, len(job.batches))
    assert losses == ref_losses
    assert stats["bytes_offloaded"] > 0 and stats["bytes_prefetched"] > 0
    for p, q in zip(job.model.parameters(), ref.model.parameters()):
        assert torch.equal(p.detach(), q.detach())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_model_offloads_through_pinned_staging(ssd_dir, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)

    def cuda_job():
        job = TinyJob()
        job.model.cuda()
        job.opt = torch.optim.AdamW(job.model.parameters(), lr=1e-3, foreach=False)
        job.batches = [b.cuda() for b in job.batches]
        return job

    ref = cuda_job()
    ref_losses = [ref.step(i).item() for i in range(len(ref.batches))]
    job = cuda_job()
    losses, stats = _train_with_runtime(job, ssd_dir, None, len(job.batches))
    assert losses == ref_losses
    assert stats["bytes_offloaded"] > 0
