"""teraio.torch.Profiler: the trace matches what the program actually did."""
import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from teraio import TeraioError
from teraio.core import Lifetime, Trace
from teraio.torch import Profiler


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not str(func).startswith("profiler."):
            self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_trace_has_every_kernel_and_global_tensor(tiny_job, tmp_path):
    tiny_job.step(0)  # creates gradients and optimizer state
    prof = Profiler(tiny_job.model, tiny_job.opt)
    with prof.iteration():
        tiny_job.step(1)
    with CountOps() as counter:
        tiny_job.step(2)
    trace = prof.save(str(tmp_path / "t.tio"))
    assert trace.n_kernels == len(counter.names)
    assert [trace.kernel_name(k) for k in range(trace.n_kernels)] == counter.names

    params = list(tiny_job.model.parameters())
    n_params = len(params)
    kinds = [trace._p.contents.tensors[i].kind for i in range(trace.n_tensors)]
    # ids: parameters, 3 buffers, gradients, then AdamW's step/exp_avg/exp_avg_sq per parameter
    assert kinds[:n_params] == [0] * n_params
    assert kinds[n_params + 3:2 * n_params + 3] == [1] * n_params
    assert kinds[2 * n_params + 3:5 * n_params + 3] == [2] * (3 * n_params)
    for i, p in enumerate(params):
        assert trace.tensor_bytes(i) == p.numel() * 4
        assert trace._p.contents.tensors[i].global_
    # Activations were saved for backward; a model this size has some.
    assert 3 in kinds[5 * n_params + 3:]

    loaded = Trace.load(str(tmp_path / "t.tio"))
    assert loaded.n_kernels == trace.n_kernels and loaded.n_tensors == trace.n_tensors
    assert loaded.kernel_ns() == trace.kernel_ns()


def test_memory_curve_peak_is_at_least_the_global_bytes(tiny_job):
    tiny_job.step(0)
    prof = Profiler(tiny_job.model, tiny_job.opt)
    with prof.iteration():
        tiny_job.step(1)
    lt = Lifetime(prof.trace())
    params = sum(p.numel() * 4 for p in tiny_job.model.parameters())
    # parameters + gradients + two AdamW moments are resident throughout
    assert min(lt.memory_curve()) >= 4 * params
    assert lt.peak_bytes > 4 * params


def test_trace_load_error_names_line(tmp_path):
    bad = tmp_path / "bad.tio"
    bad.write_text("teraio-trace 1\nthis is not a trace\n")
    try:
        Trace.load(str(bad))
    except TeraioError as e:
        assert "bad.tio:2" in str(e)
    else:
        raise AssertionError("garbled trace was accepted")


def test_free_kernel_records_when_a_tensor_is_really_freed(tmp_path):
    """Issue 13 item 1: the trace took every intermediate tensor as freed
    right after its last access, while a Python variable (or autograd, or
    the caller) held it longer, so the runtime measured more than planned.
    The profiler now records the kernel before which each storage died, and
    M[k] counts it until then.  A storage still alive when the step ends
    (`first`, which the caller keeps) is brought back then, so the trace has
    the last kernel access it (issue 24: a plan reads it back in time)."""
    w = torch.nn.Parameter(torch.ones(256))
    prof = Profiler(torch.nn.ParameterList([w]))

    def body():
        held = w * 2          # kernel 0; last used by kernel 1
        out = held + 1        # kernel 1; last used by kernel 2, freed after kernel 3
        first = out * 1.5     # kernel 2; last used by kernel 3, the caller keeps it
        out = first * 1.5     # kernel 3
        out = out * 1.5       # kernel 4
        del held              # freed before kernel 5
        out = out - 1         # kernel 5
        return first, out.sum()  # kernel 6

    with prof.iteration():
        kept = body()
    trace = prof.save(str(tmp_path / "t.tio"))
    assert trace.n_kernels == 7
    frees = sorted(trace.tensor_free_kernel(i) for i in range(trace.n_tensors))
    assert [f for f in frees if f] == [4, 5]  # kernel 1's output, `held`
    first = 3   # w is tensor 0, then each kernel's output in order: kernel 2's
    assert (first, 1) in trace.kernel_accesses(6) and trace.tensor_free_kernel(first) == 0
    assert all(trace.tensor_bytes(i) == 1024 for i in range(trace.n_tensors) if trace.tensor_free_kernel(i))
    # At kernel 4: w, `held`, `first`, kernel 3's and kernel 4's outputs,
    # 1 KiB each; taken as freed at their last access, `held` and `first`
    # would be missing.
    assert Lifetime(trace).memory_curve()[4] == 5 * 1024
    loaded = Trace.load(str(tmp_path / "t.tio"))
    assert [loaded.tensor_free_kernel(i) for i in range(loaded.n_tensors)] == \
        [trace.tensor_free_kernel(i) for i in range(trace.n_tensors)]
    assert (tmp_path / "t.tio").read_text().startswith("teraio-trace 3\n")
    del kept


def test_a_storage_resized_without_an_operator_is_not_written_from_freed_memory(tmp_path):
    """FSDP2 frees its unsharded parameters with untyped_storage().resize_(0),
    which no dispatch mode sees, and brings them back the same way.  The
    profiled steps' pager tracked such a storage at its old address; evicting
    it wrote the freed (unmapped) memory, and the README's FSDP2 example
    died of SIGSEGV in its first profiled step.  Now the pager asks before it
    writes: the resized storage is forgotten, not evicted, and tracked anew
    when an operator uses it again."""
    from teraio.core import Engine
    from teraio.torch.pager import Pager
    from teraio.torch.session import return_freed_memory
    return_freed_memory()   # released blocks go back to the OS: a stale read faults
    engine = Engine([str(tmp_path)], 64 << 20)
    pager = Pager(engine, capacity_bytes=1 << 20)
    pager.begin_step()
    gathered = torch.ones(128 * 1024)           # 512 KiB, the "unsharded parameter"
    pager.kernel_begin()
    pager.track(gathered.untyped_storage())
    gathered.untyped_storage().resize_(0)       # freed behind the pager's back
    pager.kernel_begin()
    other = torch.full((192 * 1024,), 2.0)      # 768 KiB: room must be made
    pager.reserve(other.untyped_storage().nbytes())
    pager.track(other.untyped_storage())
    s = pager.stats()
    assert s["evictions"] == 0 and s["tracked_bytes"] == other.untyped_storage().nbytes(), s
    gathered.untyped_storage().resize_(128 * 1024 * 4)   # brought back, then written
    pager.kernel_begin()
    pager.use(gathered.untyped_storage())
    gathered.fill_(3.0)
    pager.kernel_begin()
    pager.use(other.untyped_storage())          # evicts `gathered`, now at its new address
    assert pager.stats()["evictions"] >= 2 and not gathered.untyped_storage().nbytes()
    pager.fetch_all()
    assert torch.equal(gathered, torch.full((128 * 1024,), 3.0)) and torch.equal(other, torch.full((192 * 1024,), 2.0))
    pager.close()


def test_random_numbers_in_a_profiled_step_are_the_programs(tmp_path):
    """The profiled steps' pager sizes an operator's outputs from its meta
    kernel before it runs.  A factory has no tensor argument to make meta,
    so randn ran for real there and drew the program's random numbers: the
    first profiled step's randn gave other values than the plain run's, and
    a loop with input noise trained differently (the breaker's case)."""
    import teraio.torch

    def run(off_options):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(64, 64))
        opt = torch.optim.SGD([w], lr=0.1)
        off = teraio.torch.offload(torch.nn.ParameterList([w]), opt, **off_options) if off_options else None
        out = []
        for _ in range(4):
            with off.step() if off else contextlib.nullcontext():
                g = torch.Generator().manual_seed(0)
                x = torch.randn(32, 64) + torch.randn(32, 64, generator=g)
                loss = torch.tanh(x @ w).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            out.append(loss.item())
        if off:
            off.close()
        return out, w.detach().clone()

    plain = run(None)
    offloaded = run({"capacity": 0.8, "ssd": [str(tmp_path)]})
    assert offloaded[0] == plain[0] and torch.equal(offloaded[1], plain[1])


_COLLECTIVE_JOB = r'''
import json, os, socket, sys, torch, torch.distributed as dist
import teraio.torch
torch.set_num_threads(1)
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
def run(off_options):
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    off = teraio.torch.offload(m, opt, **off_options) if off_options else None
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(8):
        x = torch.randn(32, 256, generator=g)
        with off.step() if off else torch.enable_grad():
            loss = m(x).square().mean()
            loss.backward()
            for p in m.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
    r = off.report() if off else {}
    if off:
        off.close()
    return losses, {k: r.get(k) for k in ("planned_iterations", "reprofiles", "over_capacity_kernels")}
plain, _ = run(None)
got, r = run({"capacity": 0.3, "ssd": [sys.argv[1]]})
print(json.dumps({"same": got == plain, **r}))
'''


def test_a_collective_on_an_evicted_storage_gets_its_bytes_first(tmp_path):
    """The profiled steps' pager pins what a collective touches, but a storage
    it had evicted (0 bytes) was pinned as it was: the collective ran on
    freed memory.  Two gloo ranks died ("writev: Bad address"); one rank
    recorded 0-byte all_reduce outputs in the profiled steps, so their
    fingerprints never matched the planned ones and the session re-profiled
    step after step, over the capacity (the breaker's job).  Now the pager
    fetches it first."""
    import json
    import subprocess
    import sys
    script = tmp_path / "job.py"
    script.write_text(_COLLECTIVE_JOB)
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    import os
    from pathlib import Path
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2] / "python"),
                                                      os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(script), str(ssd)], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r == {"same": True, "planned_iterations": 6, "reprofiles": 0, "over_capacity_kernels": 0}, r
