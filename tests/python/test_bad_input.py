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
    engine = Engine([ssd_dir], space_bytes=2 * lt.peak_bytes + (16 << 20))
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


def run_demo(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "teraio.demo", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


@pytest.mark.parametrize("args, says", [
    # A capacity of 0, a negative one or NaN reached the planner after run A
    # (a negative one wrapped to 2^64 - x in ctypes: no offloading, exit 0).
    (["--capacity-fraction", "0"], "--capacity-fraction must be in (0, 1], got 0"),
    (["--capacity-fraction", "-1"], "--capacity-fraction must be in (0, 1], got -1"),
    (["--capacity-fraction", "nan"], "--capacity-fraction must be in (0, 1], got nan"),
    (["--capacity-fraction", "2"], "--capacity-fraction must be in (0, 1], got 2"),
    (["--bandwidth-derate", "0"], "--bandwidth-derate must be in (0, 1], got 0"),
    (["--plan-headroom", "1"], "--plan-headroom must be in [0, 1), got 1"),
    (["--iterations", "0"], "--iterations must be >= 4"),
    (["--validate-iterations", "4"], "--validate-iterations must be 0 or a positive multiple of 3"),
    (["--validate-capacity-fraction", "0"], "--validate-capacity-fraction must be in (0, 1], got 0"),
    # --layers 0 gave a model whose parameters no kernel touches; --heads 5
    # a traceback from a view; --batch 0 trained on nothing ("losses nan").
    (["--layers", "0"], "--layers must be >= 1"),
    (["--batch", "0"], "--batch must be >= 1"),
    (["--dim", "384", "--heads", "5"], "--dim (384) must be --heads (5) times an even head size"),
    (["--iterations", "x"], "argument --iterations: invalid int value: 'x'"),
])
def test_demo_bad_option_is_one_line(tmp_path, args, says):
    r = run_demo("--out", str(tmp_path / "d"), *args)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("teraio demo: ")
    assert says in r.stderr
    assert not (tmp_path / "d").exists()  # nothing ran


def test_demo_output_path_is_a_file_is_one_line(tmp_path):
    """--out naming a file used to end in a FileExistsError traceback."""
    f = tmp_path / "a-file"
    f.write_text("x")
    r = run_demo("--out", str(f))
    assert r.returncode == 1
    assert r.stderr == f"teraio demo: output directory '{f}': File exists\n"


def test_demo_ssd_that_takes_no_files_fails_before_run_a(tmp_path):
    """--ssd /proc passed the directory checks (root may write anywhere) and
    failed only in run B, after run A had trained for the whole run."""
    r = run_demo("--out", str(tmp_path / "d"), "--ssd", "/proc")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("teraio demo: ssd directory '/proc' ")
    assert not (tmp_path / "d" / "run_a.json").exists()


def profiled(job, ssd_dir):
    prof = Profiler(job.model, job.opt)
    for i in range(2):
        with prof.iteration():
            job.step(i)
    trace = prof.trace()
    lt = Lifetime(trace)
    plan = Plan.build(trace, lt, lt.peak_bytes // 2, ssd_read_gbps=1.0, ssd_write_gbps=1.0)
    engine = Engine([ssd_dir], space_bytes=2 * lt.peak_bytes + (16 << 20))
    return trace, lt, plan, engine


@pytest.mark.parametrize("capacity", [-5, 0, 1 << 64, (1 << 64) + 5, 2.5])
def test_plan_capacity_out_of_range_is_refused(ssd_dir, capacity):
    """ctypes wrapped a negative capacity to 2^64 - 5 (a plan that moves
    nothing, without a word) and 2^64 + 5 to 5."""
    trace, lt, _, _ = profiled(TinyJob(), ssd_dir)
    with pytest.raises(ValueError, match="capacity_bytes must be an integer"):
        Plan.build(trace, lt, capacity, ssd_read_gbps=1.0, ssd_write_gbps=1.0)


def test_trace_and_engine_sizes_out_of_range_are_refused(ssd_dir):
    from teraio.core import Trace
    with pytest.raises(ValueError, match="tensor bytes must be an integer in"):
        Trace.build("m", [(-1, "parameter", True, "w")], [("k", 1, [(0, 1)])])
    with pytest.raises(ValueError, match="kernel duration_ns must be an integer in"):
        Trace.build("m", [(4, "parameter", True, "w")], [("k", -1, [(0, 1)])])
    with pytest.raises(ValueError, match="space_bytes must be an integer in"):
        Engine([ssd_dir], space_bytes=-1)


def test_runtime_of_another_model_diverges_and_stays_correct(ssd_dir):
    """A trace and plan profiled on one model, applied to a bigger one: the
    globals that match by name and size are bound, the op sequence diverges,
    and the losses equal those of a run without offloading."""
    import dataclasses
    from conftest import TINY
    from teraio.models.llama import Llama

    class Bigger(TinyJob):
        def __init__(self):
            super().__init__()
            torch.manual_seed(5)
            self.model = Llama(dataclasses.replace(TINY, n_layers=3))
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, foreach=False)

    trace, _, plan, engine = profiled(TinyJob(), ssd_dir)
    ref = Bigger()
    ref_losses = [ref.step(i).item() for i in range(len(ref.batches))]
    job = Bigger()
    losses = [job.step(i).item() for i in range(2)]
    rt = OffloadRuntime(job.model, job.opt, trace, plan, engine)
    for i in range(2, len(job.batches)):
        with rt.iteration():
            losses.append(job.step(i).item())
    assert rt.stats()["diverged"]
    rt.close()
    assert losses == ref_losses


def test_runtime_used_after_close_says_so(ssd_dir):
    job = TinyJob()
    trace, _, plan, engine = profiled(job, ssd_dir)
    rt = OffloadRuntime(job.model, job.opt, trace, plan, engine)
    with rt.iteration():
        job.step(2)
    rt.close()
    job.step(3)  # every tensor is back: plain training works
    with pytest.raises(RuntimeError, match="OffloadRuntime is closed"):
        with rt.iteration():
            job.step(4)
    with pytest.raises(RuntimeError, match="OffloadRuntime is closed"):
        rt.fetch_all()
    rt.close()  # twice is fine


def test_profiler_discards_an_iteration_that_raised():
    """An iteration that raised left its partial kernels behind, and
    Profiler.trace() returned them as if it were a whole iteration."""
    job = TinyJob()
    prof = Profiler(job.model, job.opt)
    with prof.iteration():
        job.step(0)
    whole = prof.trace()
    with pytest.raises(ZeroDivisionError):
        with prof.iteration():
            job.model(job.batches[1][:, :-1], job.batches[1][:, 1:])  # forward only
            1 / 0
    assert prof.iterations == 1
    again = prof.trace()
    assert again.n_kernels == whole.n_kernels and again.n_tensors == whole.n_tensors
    assert [again.kernel_name(k) for k in range(again.n_kernels)] == \
        [whole.kernel_name(k) for k in range(whole.n_kernels)]


def _overcommit_refuses_huge():
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            return f.read().strip() in ("0", "2")
    except OSError:
        return False


@pytest.mark.skipif(not _overcommit_refuses_huge(), reason="the kernel would grant 1 TB lazily")
def test_demo_model_too_big_for_memory_is_one_line(tmp_path):
    """A model that cannot be allocated (1 TB of embedding) ended in a
    torch RuntimeError traceback from the child."""
    r = run_demo("--out", str(tmp_path / "d"), "--dim", "1000000000", "--heads", "2")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("teraio demo: ")
