"""teraio.torch.OffloadRuntime: training with offloading gives identical results."""
import contextlib
import importlib
import subprocess
import sys

import pytest
import torch

from teraio.core import Engine, Lifetime, Plan
from teraio.torch import OffloadRuntime, Profiler

from conftest import TinyJob


def profiled_runtime(job, ssd_dir, fraction=0.5, staging=None, kernel_time=None):
    prof = Profiler(job.model, job.opt, kernel_time=kernel_time)
    losses = []
    for i in range(2):
        with prof.iteration():
            loss = job.step(i)
        losses.append(loss.item())
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
    # the rest of the iteration ran under the pager: offloaded tensors came back on demand
    assert stats["paged_kernels"] > 0 and stats["paged_fetches"] > 0, stats
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


# ---- issue 12 item 1: tensor sizes that change between iterations --------------

class SmallNet(torch.nn.Module):
    """Embedding -> Linear -> Linear -> head, the model of the issue."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(256, 64)
        self.l1 = torch.nn.Linear(64, 128)
        self.l2 = torch.nn.Linear(128, 64)
        self.head = torch.nn.Linear(64, 256)

    def forward(self, x, y):
        h = self.head(torch.relu(self.l2(torch.relu(self.l1(self.emb(x))))))
        return torch.nn.functional.cross_entropy(h.flatten(0, 1), y.flatten())


def _small_job(seed=0):
    torch.manual_seed(seed)
    model = SmallNet()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)


def _small_step(model, opt, b):
    opt.zero_grad(set_to_none=False)
    loss = model(b[:, :-1], b[:, 1:])
    loss.backward()
    opt.step()
    return loss


def _small_plain(batches):
    model, opt = _small_job()
    return [_small_step(model, opt, b).item() for b in batches], model, opt


def _small_offloaded(batches, ssd_dir, fraction):
    """Profile the first two batches with fixed kernel times (so the plan
    does not depend on this machine's timing), plan at `fraction` of the
    peak and train on the rest under the runtime."""
    model, opt = _small_job()
    prof = Profiler(model, opt, kernel_time=lambda *a: 1000)
    losses = []
    for b in batches[:2]:
        with prof.iteration():
            loss = _small_step(model, opt, b)
        losses.append(loss.item())
    trace = prof.trace()
    lt = Lifetime(trace)
    plan = Plan.build(trace, lt, int(lt.peak_bytes * fraction), ssd_read_gbps=1.0, ssd_write_gbps=1.0)
    engine = Engine([ssd_dir], space_bytes=2 * lt.peak_bytes + (16 << 20))
    rt = OffloadRuntime(model, opt, trace, plan, engine)
    for b in batches[2:]:
        with rt.iteration():
            loss = _small_step(model, opt, b)
        losses.append(loss.item())
    stats = rt.stats()
    rt.close()
    return losses, model, opt, stats, plan


def _assert_same_training(plain, offloaded):
    (la, ma, oa), (lb, mb, ob) = plain, offloaded
    assert la == lb  # bit for bit
    for p, q in zip(ma.parameters(), mb.parameters()):
        assert torch.equal(p, q)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(oa.state[p][key], ob.state[q][key])


def _batches(sizes, seq=33, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (b, seq), generator=g) for b in sizes]


@pytest.mark.parametrize("fraction", [0.3, 0.4])
def test_batch_sizes_changing_between_iterations_never_corrupt_training(ssd_dir, fraction):
    """Batch sizes 4,4,4,4,3,4,4,4 with the batches kept in a list: the batch
    of 3 used to be bound as the trace's 4-row input, so the user's tensor
    was resized to 1056 bytes and overwritten, and losses differed from
    iteration 5 with diverged=False.  Now the 3-row iteration diverges (the
    input's size differs from the trace), nothing the program owns is moved,
    and the next iteration runs the plan again."""
    batches = _batches([4, 4, 4, 4, 3, 4, 4, 4])
    kept = [b.clone() for b in batches]
    plain = _small_plain(batches)
    losses, model, opt, stats, plan = _small_offloaded(batches, ssd_dir, fraction)
    _assert_same_training(plain, (losses, model, opt))
    for b, c in zip(batches, kept):
        assert b.untyped_storage().nbytes() == c.untyped_storage().nbytes()
        assert torch.equal(b, c)
    assert plan.n_migrations > 0 and stats["bytes_offloaded"] > 0
    assert stats["diverged_iterations"] == 1  # only the batch of 3


def test_last_smaller_batch_of_a_dataloader(ssd_dir):
    """A DataLoader with drop_last=False: each epoch ends with a batch of 2."""
    data = torch.randint(0, 256, (18, 33), generator=torch.Generator().manual_seed(3))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=False, drop_last=False)
    batches = [b for _ in range(2) for b in loader]
    assert [len(b) for b in batches] == [4, 4, 4, 4, 2] * 2
    plain = _small_plain(batches)
    losses, model, opt, stats, _ = _small_offloaded(batches, ssd_dir, 0.4)
    _assert_same_training(plain, (losses, model, opt))
    assert stats["diverged_iterations"] == 2
    assert stats["bytes_offloaded"] > 0


def test_alternating_sequence_lengths(ssd_dir):
    """Sequence lengths alternating 32/16 (plus one target token): every
    iteration of the other length diverges and runs on demand."""
    batches = [b for pair in zip(_batches([4] * 4, seq=33), _batches([4] * 4, seq=17, seed=2))
               for b in pair]
    plain = _small_plain(batches)
    losses, model, opt, stats, _ = _small_offloaded(batches, ssd_dir, 0.4)
    _assert_same_training(plain, (losses, model, opt))
    assert stats["diverged_iterations"] == 3  # iterations 3, 5, 7 (seq 16)


# ---- issue 12 item 3: model and optimizer used between iterations --------------

def _released_globals(rt):
    return [i for i in rt._released if i < rt._ids.n_global]


def test_plain_step_between_iterations_fetches_what_it_uses(ssd_dir):
    """A plain training step run between two rt.iteration() blocks used to
    crash in _single_tensor_adam: the optimizer state the plan keeps on SSD
    across the iteration boundary was a 0-byte storage there.  Operators
    between iterations now fetch what they read (fetches_outside), and the
    next iteration puts the tensors back where the plan has them."""
    ref = TinyJob()
    ref_losses = [ref.step(i).item() for i in range(len(ref.batches))]
    job = TinyJob()
    rt, plan, lt, losses, _engine = profiled_runtime(job, ssd_dir, kernel_time=lambda *a: 1000)
    with rt.iteration():
        loss = job.step(2)
    losses.append(loss.item())
    assert _released_globals(rt), "the plan should keep some global tensor away between iterations"
    losses.append(job.step(3).item())  # plain step, no iteration
    for i in range(4, len(job.batches)):
        with rt.iteration():
            loss = job.step(i)
        losses.append(loss.item())
    stats = rt.stats()
    rt.close()
    assert losses == ref_losses
    for p, q in zip(job.model.parameters(), ref.model.parameters()):
        assert torch.equal(p, q)
    assert stats["fetches_outside"] > 0 and stats["bytes_fetched_outside"] > 0
    assert stats["diverged_iterations"] == 0


def test_checkpoint_while_offloaded_holds_the_true_values(ssd_dir, tmp_path):
    """torch.save(optimizer.state_dict()) without fetch_all() used to write a
    truncated checkpoint (840 KB instead of 1.4 MB) that torch.load refused.
    state_dict() now fetches first: the saved values equal the plain run's,
    and a parameter norm read between iterations is the true one."""
    ref = TinyJob()
    for i in range(3):
        ref.step(i)
    job = TinyJob()
    rt, _, _, _, _engine = profiled_runtime(job, ssd_dir, kernel_time=lambda *a: 1000)
    with rt.iteration():
        job.step(2)
    assert _released_globals(rt)
    norms = [p.norm().item() for p in job.model.parameters()]
    assert norms == [p.norm().item() for p in ref.model.parameters()]
    torch.save({"model": job.model.state_dict(), "opt": job.opt.state_dict()}, tmp_path / "ck.pt")
    rt.close()
    ck = torch.load(tmp_path / "ck.pt")
    want = {"model": ref.model.state_dict(), "opt": ref.opt.state_dict()}
    assert ck["model"].keys() == want["model"].keys()
    for k, v in want["model"].items():
        assert torch.equal(ck["model"][k], v), k
    for p, state in want["opt"]["state"].items():
        for k, v in state.items():
            assert torch.equal(ck["opt"]["state"][p][k], v), (p, k)


def test_runtime_used_from_another_thread_is_refused(ssd_dir):
    """Issue 12 item 9: fetch_all() from a second thread deadlocked, and a
    parameter read there could be freed under it.  Every call from another
    thread raises a clear error and changes nothing."""
    import threading
    job = TinyJob()
    rt, _, _, _, _engine = profiled_runtime(job, ssd_dir, kernel_time=lambda *a: 1000)
    with rt.iteration():
        job.step(2)
    errors = []

    def other():
        for call in (rt.fetch_all, rt.stats, rt.close, lambda: rt.iteration().__enter__()):
            try:
                call()
            except RuntimeError as e:
                errors.append(str(e))

    th = threading.Thread(target=other)
    th.start()
    th.join()
    assert len(errors) == 4 and all("another thread" in e for e in errors), errors
    assert _released_globals(rt)  # nothing was fetched
    with rt.iteration():
        job.step(3)
    rt.close()


# ---- a storage whose last reference another thread drops ------------------------

class _Spill(torch.nn.Module):
    """Linear layers with a large no-grad intermediate (`big`, 256 KiB, as large as any activation) whose
    last use is a sum; `keep` receives it after that use when the step is
    told to hold it, as a collective's worker thread holds its buffer."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(64, 256)
        self.l2 = torch.nn.Linear(256, 64)

    def step(self, opt, x, keep=None):
        opt.zero_grad(set_to_none=False)
        h = self.l1(x)
        with torch.no_grad():
            big = h.detach().repeat(1, 1)
            s = big.sum()
        if keep is not None:
            keep.append(big)
        del big
        loss = self.l2(torch.relu(h)).pow(2).mean() + 0 * s
        loss.backward()
        opt.step()
        return loss


def _spill_runtime(ssd_dir):
    """Profiled (two steps, `big` freed after its sum) and planned at 0.7 of the peak."""
    torch.manual_seed(0)
    model = _Spill()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randn(256, 64)
    prof = Profiler(model, opt, kernel_time=lambda *a: 1000)
    for _ in range(2):
        with prof.iteration():
            model.step(opt, x)
    trace = prof.trace()
    lt = Lifetime(trace)
    plan = Plan.build(trace, lt, int(lt.peak_bytes * 0.7), ssd_read_gbps=1.0, ssd_write_gbps=1.0)
    assert plan.fits
    engine = Engine([ssd_dir], space_bytes=2 * lt.peak_bytes + (16 << 20))
    return model, opt, x, plan, OffloadRuntime(model, opt, trace, plan, engine), engine


def test_a_storage_another_thread_drops_is_gone_before_the_next_kernel(ssd_dir, monkeypatch):
    """FSDP2 on gloo: the reduce-scatter's 12 MiB buffer died on gloo's worker
    thread, which waited for the GIL to drop its last reference and got it
    inside the next kernel_begin, so that kernel counted it: 13% over the
    capacity in about half the runs.  Before a kernel, a storage the trace
    has freed but still bound makes the adapter yield the GIL; here the
    yield is where the "other thread" drops `big`, and no kernel holds more
    than the plan."""
    offload = importlib.import_module("teraio.torch.runtime")  # the module, not the function
    model, opt, x, plan, rt, _engine = _spill_runtime(ssd_dir)
    keep, yields = [], []

    def other_thread_runs():
        yields.append(len(keep))
        keep.clear()

    monkeypatch.setattr(offload, "_yield_gil", other_thread_runs)
    planned = plan.planned_curve()
    for _ in range(3):
        curve = []
        rt.record_curve(curve)
        with rt.iteration():
            model.step(opt, x, keep)
        assert len(curve) == len(planned)
        assert max(c - p for c, p in zip(curve, planned)) <= 0
    stats = rt.stats()
    rt.close()
    assert yields == [1, 1, 1]                 # one yield per step, with `big` held
    assert stats["frees_waited"] == 3
    assert stats["peak_resident_bytes"] <= stats["capacity_bytes"]
    assert stats["over_capacity_kernels"] == 0 and not stats["diverged"]


def test_a_storage_the_program_keeps_is_counted_and_named(ssd_dir, monkeypatch, caplog):
    """The program itself keeps `big` past the free the trace recorded: the
    adapter yields once per step, for at most _YIELD_S, and the memory counts
    against the capacity, the log naming the tensor held past its free."""
    import logging
    offload = importlib.import_module("teraio.torch.runtime")  # the module, not the function
    model, opt, x, plan, rt, _engine = _spill_runtime(ssd_dir)
    calls = []
    monkeypatch.setattr(offload, "_yield_gil", lambda: calls.append(1))
    with caplog.at_level(logging.INFO, logger="teraio"):
        for _ in range(2):
            keep = []
            with rt.iteration():
                model.step(opt, x, keep)
    stats = rt.stats()
    rt.close()
    assert stats["frees_waited"] == 2 and len(calls) >= 2
    assert stats["over_capacity_kernels"] > 0
    assert stats["peak_resident_bytes"] > stats["capacity_bytes"]
    held = [r.getMessage() for r in caplog.records if "over the capacity" in r.getMessage()]
    assert held and "held past the kernel the trace frees it at, such as tensor" in held[0], held
    assert "(256.00 KiB)" in held[0], held


def test_fruitless_waits_stop_at_the_iteration_budget(ssd_dir, monkeypatch):
    """Waits that end with the storage still held take at most
    _YIELD_BUDGET_S per iteration; with the budget spent (0 here) a kernel
    does not wait at all, and the kept storage is still counted."""
    offload = importlib.import_module("teraio.torch.runtime")
    model, opt, x, plan, rt, _engine = _spill_runtime(ssd_dir)
    calls = []
    monkeypatch.setattr(offload, "_yield_gil", lambda: calls.append(1))
    monkeypatch.setattr(offload, "_YIELD_BUDGET_S", 0.0)
    keep = []
    with rt.iteration():
        model.step(opt, x, keep)
    stats = rt.stats()
    rt.close()
    assert calls == [] and stats["frees_waited"] == 0
    assert stats["over_capacity_kernels"] > 0


def _plain_then_planned(step, w, opt, plan_of, ssd_dir, tmp_path, planned: int, space_bytes: int = 64 << 20,
                        planned_step=None):
    """`step` (one training step of parameter `w` under `opt`) run plainly
    for 2 + `planned` steps, then from the same start profiled for 2 steps
    and run for `planned` steps under the plan whose lines after the header
    `plan_of(trace, lifetime)` gives (`planned_step`, default `step`, in
    those).  Returns (plain losses, teraio's losses, plain final w, the
    runtime's stats); w is teraio's final value."""
    start = w.detach().clone()
    plain = [step() for _ in range(2 + planned)]
    plain_w = w.detach().clone()
    with torch.no_grad():
        w.copy_(start)
    prof = Profiler(torch.nn.ParameterList([w]), opt)
    losses = []
    for _ in range(2):
        with prof.iteration():
            losses.append(step())
    trace = prof.trace()
    lt = Lifetime(trace)
    (tmp_path / "p.plan").write_text(f"teraio-plan 1\nkernels {trace.n_kernels} tensors {trace.n_tensors} "
                                     f"capacity {lt.peak_bytes}\n" + "".join(l + "\n" for l in plan_of(trace, lt)))
    plan = Plan.load(str(tmp_path / "p.plan"), trace, lt)
    engine = Engine([ssd_dir], space_bytes=space_bytes)
    rt = OffloadRuntime(torch.nn.ParameterList([w]), opt, trace, plan, engine)
    for _ in range(planned):
        with rt.iteration():
            losses.append((planned_step or step)())
    stats = rt.stats()
    rt.close()
    return plain, losses, plain_w, stats


def _uses(trace, i) -> list[int]:
    return [k for k in range(trace.n_kernels) if any(j == i for j, _ in trace.kernel_accesses(k))]


def test_a_storage_the_program_frees_with_resize_is_not_written_from_freed_memory(ssd_dir, tmp_path):
    """FSDP2 frees its unsharded parameters with untyped_storage().resize_(0)
    after their forward and re-allocates them the same way for the backward;
    no dispatch mode sees either.  A plan's offload in that gap wrote the
    freed memory (measured under the README's FSDP2 example: every planned
    step released storages that were already 0 bytes; from 64 KiB on, freed
    memory is unmapped).  Now the runtime checks each storage before the
    kernel that starts its write: the freed one is unbound, and bound again
    at its next use.  A plan that moves exactly that storage over exactly
    that gap; the losses stay the plain run's."""
    from teraio.torch.runtime import OffloadRuntime as RT
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(256, 256))
    opt = torch.optim.SGD([w], lr=0.01)
    gathered = torch.empty(16, 256, 256)       # 4 MiB, lives across steps, as FSDP2's unsharded parameter

    def step():
        gathered.untyped_storage().resize_(16 * 256 * 256 * 4)   # "all-gather" into it
        with torch.no_grad():
            gathered.copy_(w.expand(16, 256, 256))
        s1 = gathered.sum()
        y = torch.tanh(w @ w)
        gathered.untyped_storage().resize_(0)                     # freed after the forward
        z = [torch.sin(y * i).sum() for i in range(6)]
        gathered.untyped_storage().resize_(16 * 256 * 256 * 4)   # re-gathered for the backward
        with torch.no_grad():
            gathered.copy_(w.expand(16, 256, 256))
        loss = (sum(z) + y.sum()) / 1e4 + (s1 + gathered.sum()) * 0
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    def plan_of(trace, lt):
        g = next(i for i in range(trace.n_tensors) if trace.tensor_bytes(i) == 4 << 20)
        a, b = _uses(trace, g)[1:3]                 # its sum in the forward, its copy_ after the gap
        k = next(k for k in range(a, b) if trace.kernel_name(k) == "aten.mul.Tensor")  # y * 0, after the free
        return [f"offload {g} {k} {k + 1} ssd {4 << 20}", f"prefetch {g} {b - 1} {b} ssd {4 << 20}"]

    stale = []
    real = RT._release

    def release(self, ctx, tensor):
        st = self._storage(tensor)
        if st is not None and st.nbytes() != self._trace_bytes[tensor]:
            stale.append(tensor)
        return real(self, ctx, tensor)

    RT._release = release
    try:
        plain, losses, plain_w, _ = _plain_then_planned(step, w, opt, plan_of, ssd_dir, tmp_path, planned=3)
    finally:
        RT._release = real
    assert losses == plain and torch.equal(w.detach(), plain_w)
    assert not stale, stale


def test_a_storage_freed_while_its_write_is_in_flight_is_held_until_written(ssd_dir, tmp_path):
    """A 64 MiB intermediate is held after its last use; the plan writes it
    out in that tail period (a lone offload, due before its free in the
    trace), and in the planned steps the program frees it earlier, two
    operators after the write begins (the same operators: a free is no
    kernel).  The engine reads a storage's memory on its own threads until
    the write completes; before the runtime held the storage over its write,
    the program's free unmapped that memory under the write and the process
    died of SIGSEGV (6 of 6 runs, found by a breaker).  Now the storage is
    let go once written, and the losses are the plain run's."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(256, 256))
    opt = torch.optim.SGD([w], lr=0.01)
    n = (64 << 20) // 4

    def step(early=False):
        big = w[0, 0].expand(n) * 0.5               # 64 MiB
        s = big.sum()                               # its last use
        y = torch.tanh(w @ w)                       # the write begins at the mm
        if early:
            del big                                 # freed while it is written
        z = y * 2
        big = None                                  # the trace's free
        loss = (z.sum() + s) / 1e4
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    def plan_of(trace, lt):
        names = [trace.kernel_name(k) for k in range(trace.n_kernels)]
        last = names.index("aten.sum.default")      # big.sum()
        big = next(i for i, _ in trace.kernel_accesses(last) if trace.tensor_bytes(i) == n * 4)
        mm = names.index("aten.mm.default", last)
        free = names.index("aten.sum.default", mm)  # z.sum(): the kernel before which big was freed
        return [f"offload {big} {mm} {free - 1} ssd {n * 4}"]

    plain, losses, plain_w, stats = _plain_then_planned(step, w, opt, plan_of, ssd_dir, tmp_path, planned=2,
                                                        space_bytes=256 << 20,
                                                        planned_step=lambda: step(early=True))
    assert stats["bytes_offloaded"] == 2 * n * 4    # the write ran in both planned steps
    assert losses == plain and torch.equal(w.detach(), plain_w)


def test_a_storage_resized_to_0_while_its_write_is_in_flight_is_not_read_after(ssd_dir, tmp_path):
    """FSDP2 frees a gathered parameter with untyped_storage().resize_(0)
    right after its last use, with no operator the runtime sees.  Here a
    64 MiB "gathered" storage is moved out over its gap by a plan whose write
    begins at the kernel after its last use, and the program frees it one
    operator later, while the write is in flight.  Nothing could hold those
    bytes: the engine read freed memory (SIGSEGV).  Now a resize of a storage
    being written waits for the write first (the storage is unbound, and
    bound again when the program re-gathers it), and the losses are the
    plain run's."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(256, 256))
    opt = torch.optim.SGD([w], lr=0.01)
    n = 256 * 256 * 256                                 # 64 MiB
    gathered = torch.empty(256, 256, 256)

    def step():
        gathered.untyped_storage().resize_(n * 4)      # "all-gather" into it
        with torch.no_grad():
            gathered.copy_(w.expand(256, 256, 256))
        s1 = gathered.sum()                             # its last use before the gap
        y = torch.tanh(w @ w)                           # the write begins at the mm
        gathered.untyped_storage().resize_(0)           # freed, the write in flight
        z = [torch.sin(y * i).sum() for i in range(6)]
        gathered.untyped_storage().resize_(n * 4)      # re-gathered for the backward
        with torch.no_grad():
            gathered.copy_(w.expand(256, 256, 256))
        loss = (sum(z) + y.sum()) / 1e4 + (s1 + gathered.sum()) * 0
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    def plan_of(trace, lt):
        g = next(i for i in range(trace.n_tensors) if trace.tensor_bytes(i) == n * 4)
        a, b = _uses(trace, g)[1:3]                     # its sum, its copy_ after the gap
        mm = next(k for k in range(a, b) if trace.kernel_name(k) == "aten.mm.default")
        return [f"offload {g} {mm} {b - 2} ssd {n * 4}", f"prefetch {g} {b - 1} {b} ssd {n * 4}"]

    plain, losses, plain_w, _ = _plain_then_planned(step, w, opt, plan_of, ssd_dir, tmp_path, planned=2,
                                                    space_bytes=256 << 20)
    assert losses == plain and torch.equal(w.detach(), plain_w)
