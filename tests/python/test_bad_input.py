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
    # --layers 0 gave a model whose parameters no kernel touches; --heads 5
    # a traceback from a view; --batch 0 trained on nothing ("losses nan").
    (["--layers", "0"], "--layers must be >= 1"),
    (["--batch", "0"], "--batch must be >= 1"),
    (["--heads", "5"], "--dim (384) must be --heads (5) times an even head size"),
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
