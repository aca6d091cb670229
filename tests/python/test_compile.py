"""teraio.torch.compile: offloading inside torch.compile gives the results of
torch.compile without teraio, bit for bit.

Compilation dominates the cost here, so each model is compiled once per
side (plain Inductor, Inductor with teraio) in a module fixture that the
tests share; Inductor's graph cache makes the teraio side's graphs without
migrations cost nothing.
"""
import logging
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from teraio.torch.compile import ops as _compile_ops
from teraio.torch.compile import CompiledOffload
from teraio.torch._ids import global_tensors

from conftest import TINY, TinyJob
from teraio.models.llama import Llama


class OneLayerJob(TinyJob):
    """conftest's tiny Llama job with one layer: half the graph to compile."""

    def __init__(self, **kw):
        super().__init__(**kw)
        torch.manual_seed(0)
        cfg = type(TINY)(**{**TINY.__dict__, "n_layers": 1})
        self.model = Llama(cfg)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, foreach=False)


def test_kernel_begin_passes_opcheck():
    a, b = torch.randn(4, 8), torch.randn(3)
    w = nn.Parameter(torch.randn(5))
    for args in (([a, b], [], None, 0, 1), ([], [b], torch.empty(0), 3, 0), ([w], [a[1:]], torch.empty(0), 1, 7)):
        result = torch.library.opcheck(_compile_ops.kernel_begin, args)
        assert set(result.values()) == {"SUCCESS"}, result


def test_kernel_begin_survives_dead_code_elimination():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.ops.aten.relu.default, (x,))
    g.call_function(torch.ops.aten.neg.default, (y,))  # dead: no user
    tok = g.call_function(_compile_ops.kernel_begin, ([x], [], None, 0, 1))
    g.call_function(_compile_ops.kernel_begin, ([], [y], tok, 0, 2))
    g.output(y)
    g.eliminate_dead_code()
    targets = [n.target for n in g.nodes if n.op == "call_function"]
    assert targets == [torch.ops.aten.relu.default, _compile_ops.kernel_begin, _compile_ops.kernel_begin]


# ---- a tiny Llama, trained with and without teraio ---------------------------

STEPS = 5


def plain_compiled_losses(job, steps):
    job.model.compile(dynamic=False)
    return [job.step(i).item() for i in range(steps)]


def allocated_peaks(prof, marks: list[str]) -> list[int]:
    """The most bytes the CPU allocator had out during each marked
    record_function range, from a profile that saw every allocation (it
    started before the tensors existed: the allocator does not report
    frees of blocks it saw no allocation of)."""
    events = sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns())
    ranges = [next(e for e in events if e.name() == m) for m in marks]
    peaks, live = [0] * len(marks), 0
    for e in events:
        if e.name() == "[memory]":
            live += e.nbytes()
            for x, r in enumerate(ranges):
                if r.start_ns() <= e.start_ns() <= r.end_ns():
                    peaks[x] = max(peaks[x], live)
    return peaks


@pytest.fixture(scope="module")
def llama_runs(tmp_path_factory):
    torch.use_deterministic_algorithms(True)
    torch._dynamo.reset()
    ref = OneLayerJob(iterations=STEPS, batch=16)
    ref_losses = plain_compiled_losses(ref, STEPS)
    ssd = tmp_path_factory.mktemp("ssd")
    losses = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        job = OneLayerJob(iterations=STEPS, batch=16)
        # The planner assumes a fast SSD so that the plan does not depend on
        # this machine's load; a slower one only makes the deadlines wait.
        off = CompiledOffload(job.model, job.opt, capacity=0.5, ssd=[str(ssd)], ssd_gbps=(8.0, 8.0))
        for i in range(STEPS):
            with torch.profiler.record_function(f"step{i}"), off.step():
                loss = job.step(i)
            losses.append(loss.item())
    off.fetch_all()
    batches = sum(b.untyped_storage().nbytes() for b in job.batches)
    yield {"ref": ref, "ref_losses": ref_losses, "job": job, "off": off, "losses": losses,
           "report": off.report(), "batches_bytes": batches,
           "allocated_peaks": allocated_peaks(prof, [f"step{i}" for i in range(2, STEPS)])}
    off.close()


def test_compiled_training_with_offloading_matches_plain_compile(llama_runs):
    r = llama_runs
    rep = r["report"]
    plan = rep["plans"][0]
    assert plan["fits"] and plan["migrations"] > 0
    assert rep["profiled_iterations"] == 2 and rep["planned_iterations"] == STEPS - 2
    assert rep["diverged_iterations"] == 0
    assert r["losses"] == r["ref_losses"]  # bit for bit
    for p, q in zip(r["job"].model.parameters(), r["ref"].model.parameters()):
        assert torch.equal(p, q)
        sa, sb = r["job"].opt.state[p], r["ref"].opt.state[q]
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
    # Every planned offload and prefetch ran, every step.
    moves = r["off"].plan.migrations()
    per_step = sum(m["bytes"] for m in moves if m["kind"] == "offload")
    # plus, once, the tensors the plan keeps away across the step boundary (prefetched before their
    # offload in kernel order): the first planned step's begin puts them where the plan starts
    away_at_0 = sum(o["bytes"] for o in moves if o["kind"] == "offload" and any(
        p["kind"] == "prefetch" and p["tensor"] == o["tensor"] and p["trigger"] < o["trigger"] for p in moves))
    assert per_step * (STEPS - 2) <= rep["bytes_offloaded"] <= per_step * (STEPS - 2) + away_at_0
    assert rep["bytes_prefetched"] == per_step * (STEPS - 2)
    # and, once, what the profiled steps' pager left on the SSD at the hand-over and the plan
    # has resident first: fetched at its first use in the first planned step
    globals_bytes = sum(t.untyped_storage().nbytes() for t, _, _ in global_tensors(r["job"].model, r["job"].opt))
    assert rep["bytes_fetched_urgent"] <= globals_bytes
    assert 0 < rep["peak_resident_bytes"] <= plan["capacity_bytes"]
    assert rep["over_capacity_kernels"] == 0


def test_allocator_never_holds_more_than_the_capacity(llama_runs):
    """The capacity, checked by the CPU allocator itself: the bytes out at
    any moment of a planned step (all tensors of the process, the job's
    whole list of input batches included) stay within the capacity, and
    the runtime's own resident peak is within 2% of that measure."""
    r = llama_runs
    cap = r["report"]["plans"][0]["capacity_bytes"]
    peaks = r["allocated_peaks"]
    assert max(peaks) <= cap + r["batches_bytes"], (peaks, cap)
    assert abs(max(peaks) - r["report"]["peak_resident_bytes"]) <= 0.02 * cap


def _compiled_sources(off):
    """(graph info, generated Python source) of every graph compiled with
    kernel_begin calls."""
    from teraio.torch.compile import _graphs
    out = []
    for info, ref in _graphs:
        if ref() is off:
            fn = off._variant(info, off._entry)
            if fn is not info.plain:
                out.append((info, fn.source_code))
    return out


def test_released_activation_is_never_read_again_in_the_forward_code(llama_runs):
    """An activation offloaded in the forward graph is next used in the
    backward graph only, so nothing in the forward orders its release but
    teraio's own dependencies: Inductor could drop the calls (no user reads
    their results) or move them before the tensor's last reader.  In the
    code Inductor generated, every planned call is there, in plan order, and
    no kernel reads a released activation after the call that released it."""
    off = llama_runs["off"]
    entry = off._entry
    released = {}  # fwd kernel index (trace) -> activation ids released there
    for m in entry.plan.migrations():
        if m["kind"] == "offload" and not entry.trace.tensor_is_global(m["tensor"]):
            released.setdefault(m["deadline"], set()).add(m["tensor"])
    fwd = [(info, src) for info, src in _compiled_sources(off) if info.kind == "forward"]
    assert len(fwd) == 1
    info, src = fwd[0]
    inst = next(x for x in entry.instances if x.info.key == info.key)
    call = src[src.index("def call(self, args):"):]
    lines = call.splitlines()
    op_lines = [(n, line) for n, line in enumerate(lines) if "= torch.ops.teraio.kernel_begin.default(" in line]
    planned = sorted(entry.ops[info.key])
    assert [int(re.search(r", (\d+)\)$", line).group(1)) for _, line in op_lines] == planned
    checked = 0
    for n, line in op_lines:
        j = int(re.search(r", (\d+)\)$", line).group(1))
        gone = released.get(inst.offset + j, set())
        lists = re.search(r"\(\[([^\]]*)\], \[([^\]]*)\]", line).groups()
        bufs = [b for part in lists for b in part.split(", ") if b]
        for buf, i in zip(bufs, inst.op_ids[j]):
            if i not in gone:
                continue
            later = [x for x in lines[n + 1:] if re.search(rf"\b{buf}\b", x)
                     and not x.strip().startswith(("del ", "return ", "#", "assert_"))
                     and "teraio.kernel_begin" not in x]
            assert later == [], f"{buf} read after its release at kernel {j}: {later[:2]}"
            checked += 1
    assert checked > 0


def test_every_view_of_a_moved_storage_is_named_in_its_call(llama_runs, tmp_path):
    """Regression (segfault in the compiled demo): the inputs and the targets
    are two views of one batch tensor, tokens[:, :-1] and tokens[:, 1:], so
    two placeholders of the backward graph.  The call that released the batch
    named only the first, Inductor ordered it after that one's readers only,
    and the loss kernel then read the targets from released storage.  Every
    call names every local storage of each tensor it moves; with a slow SSD
    (1 GB/s) the plan moves the batch, and training matches plain compile."""
    torch._dynamo.reset()
    job = OneLayerJob(iterations=STEPS, batch=16)
    off = CompiledOffload(job.model, job.opt, capacity=0.5, ssd=[str(tmp_path)], ssd_gbps=(1.0, 1.0))
    losses = []
    for i in range(STEPS):
        with off.step():
            losses.append(job.step(i).item())
    entry = off._entry
    aliased = 0
    for inst in entry.instances:
        for j, (mv, rd) in entry.ops[inst.info.key].items():
            for s in mv:
                same = [x for x, i in enumerate(inst.ids) if i == inst.ids[s]]
                assert set(same) <= set(mv), (inst.info.kind, j, s, same, mv)
                aliased += len(same) > 1
    off.close()
    assert aliased > 0  # the batch's two views are moved in this job
    assert losses == llama_runs["ref_losses"]


def test_capacity_below_the_eager_optimizer_step_says_what_it_needs(llama_runs, tmp_path):
    """With the optimizer step eager, its kernel holds every parameter,
    gradient and optimizer state at once: a smaller capacity is refused with
    that floor named."""
    torch._dynamo.reset()
    job = OneLayerJob(iterations=2, batch=16)
    off = CompiledOffload(job.model, job.opt, capacity=1 << 16, ssd=[str(tmp_path)])
    with off.step():
        job.step(0)
    with pytest.raises(Exception, match=r"below kernel \d+ \(teraio\.eager\)'s need"):
        with off.step():
            job.step(1)
    off.close()


# ---- a model with a graph break, and a change of shapes ----------------------

class Breaky(nn.Module):
    """Two compiled regions: the graph break splits the forward in two."""

    def __init__(self, dim=32, depth=3):
        super().__init__()
        self.a = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
        self.b = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))

    def forward(self, x, y):
        for layer in self.a:
            x = torch.tanh(layer(x))
        torch._dynamo.graph_break()
        for layer in self.b:
            x = torch.tanh(layer(x))
        return F.mse_loss(x, y)


# Batch sizes per step: a, profiled and planned; b, new shapes (recompiled)
# for four steps (diverged twice, then profiled and planned); a again.
SCHEDULE = [256] * 5 + [128] * 4 + [256] * 2


def breaky_job():
    torch.manual_seed(0)
    model = Breaky()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(b, 32, generator=g), torch.randn(b, 32, generator=g)) for b in SCHEDULE]

    def step(i):
        opt.zero_grad(set_to_none=False)
        loss = model(*data[i])
        loss.backward()
        opt.step()
        return loss
    model.data = data
    return model, opt, step


def breaky_loss(model, i):
    """breaky_job's model's loss on its i-th batch."""
    return model(*model.data[i])


@pytest.fixture(scope="module")
def breaky_runs(tmp_path_factory):
    torch.use_deterministic_algorithms(True)
    torch._dynamo.reset()
    model, _, step = breaky_job()
    model.compile(dynamic=False)
    ref_losses = [step(i).item() for i in range(len(SCHEDULE))]
    model, opt, step = breaky_job()
    off = CompiledOffload(model, opt, capacity=0.5, ssd=[str(tmp_path_factory.mktemp("ssd"))],
                          ssd_gbps=(8.0, 8.0))
    losses, reports = [], []
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("teraio").addHandler(handler)
    try:
        for i in range(len(SCHEDULE)):
            with off.step():
                loss = step(i)
            losses.append(loss.item())
            reports.append(off.report())
    finally:
        logging.getLogger("teraio").removeHandler(handler)
    off.fetch_all()
    yield {"ref_losses": ref_losses, "losses": losses, "reports": reports, "off": off,
           "warnings": [r.getMessage() for r in records if r.levelno >= logging.WARNING]}
    off.close()


def test_graph_break_offloads_across_the_break(breaky_runs):
    r = breaky_runs
    first = r["reports"][4]["plans"][0]
    assert first["regions"] == 4 and first["graphs"] == 4  # two forwards, two backwards
    assert first["fits"] and first["migrations"] > 0
    assert r["losses"][:5] == r["ref_losses"][:5]
    # Tensors of both regions moved: planned calls in both forward graphs.
    plan = next(iter(r["off"]._plans.values()))
    fwd_keys = [inst.info.key for inst in plan.instances if inst.info.kind == "forward"]
    assert len(fwd_keys) == 2 and all(plan.ops.get(k) for k in fwd_keys)
    assert r["reports"][4]["planned_iterations"] == 3
    assert r["reports"][4]["bytes_offloaded"] > 0


def test_shape_change_reprofiles_and_stays_correct(breaky_runs):
    r = breaky_runs
    assert r["losses"] == r["ref_losses"]  # bit for bit, across both shapes
    reps = r["reports"]
    # Batch 128: steps 5 and 6 diverge (said once), step 7 is profiled
    # (reprofile_after=2, profile_iterations for a re-profile: 1), step 8 runs its plan.
    assert reps[6]["diverged_iterations"] == 2 and reps[6]["reprofiles"] == 1
    assert any("left its plan" in w for w in r["warnings"])
    # the diverged steps keep the capacity: from the region that left the plan, the rest
    # of the step runs under a pager (eager code and each region's code paged)
    assert reps[5]["paged_kernels"] > 0 and reps[6]["paged_kernels"] > reps[5]["paged_kernels"]
    assert reps[6]["paged_over_capacity_kernels"] == 0
    assert reps[7]["profiled_iterations"] == 3 and len(reps[7]["plans"]) == 2
    assert reps[8]["planned_iterations"] == 4
    # Batch 256 again: at step 9's first region the session switches to the
    # kept 256 plan, without profiling and without leaving the plan.
    assert reps[-1]["profiled_iterations"] == 3 and reps[-1]["reprofiles"] == 1
    assert reps[-1]["diverged_iterations"] == 2 and reps[-1]["plan_switches"] == 1
    assert reps[-1]["planned_iterations"] == 6
    assert all(p["fits"] for p in reps[-1]["plans"])
    assert reps[-1]["over_capacity_kernels"] == 0 and reps[-1]["paged_over_capacity_kernels"] == 0


# ---- a block compiled once and run per layer; the optimizer step compiled ----

class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.l1, self.l2 = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.l2(torch.tanh(self.l1(x)))


class Blocks(nn.Module):
    def __init__(self, dim=32, depth=3):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))

    def forward(self, x, y):
        for b in self.blocks:
            x = b(x)
        return F.mse_loss(x, y)


def blocks_losses(steps, off=None):
    torch.manual_seed(0)
    model = Blocks()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(512, 32, generator=g), torch.randn(512, 32, generator=g)) for _ in range(steps)]
    kw = {} if off is None else {"backend": off(model, opt).backend}
    for b in model.blocks:
        b.compile(dynamic=False, **kw)
    opt_step = torch.compile(opt.step, dynamic=False, **kw)
    session = getattr(off, "session", None)
    losses = []
    for i in range(steps):
        with session.step() if session else torch.enable_grad():
            opt.zero_grad(set_to_none=False)
            loss = model(*data[i])
            loss.backward()
            opt_step()
        losses.append(loss.item())
    return losses


def test_a_block_run_per_layer_and_a_compiled_optimizer_step(tmp_path):
    """One compiled block graph runs at two places of the step (two
    instances, each with its own kernel offsets and tensors) and the
    optimizer step is a compiled region too; losses match Inductor alone."""
    torch._dynamo.reset()
    ref = blocks_losses(6)

    class Make:
        def __call__(self, model, opt):
            self.session = CompiledOffload(model, opt, capacity=0.5, ssd=[str(tmp_path)], compile_model=False,
                                           ssd_gbps=(8.0, 8.0))
            return self.session
    make = Make()
    got = blocks_losses(6, make)
    off = make.session
    rep = off.report()
    assert got == ref
    entry = off._entry
    kinds = [x.info.kind for x in entry.instances]
    fwd = [x.info.key for x in entry.instances if x.info.kind == "forward"]
    # Blocks 2 and 3 run one graph (block 1's input needs no gradient: its own).
    assert len(fwd) == 3 and max(fwd.count(k) for k in fwd) == 2
    assert kinds[-1] == "inference"                    # the optimizer step
    moved = {entry.trace.tensor_name(m["tensor"]) for m in entry.plan.migrations()}
    assert any(n and n.endswith(".exp_avg") for n in moved)
    assert rep["planned_iterations"] == 4 and rep["diverged_iterations"] == 0
    assert rep["plans"][0]["fits"] and rep["over_capacity_kernels"] == 0
    off.close()


def test_a_graph_with_symbolic_shapes_is_not_planned():
    """Dynamic shapes make tensor sizes symbolic: such a graph is marked
    unplannable (the session then says so once and runs it as compiled)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from teraio.torch.compile.graph import GraphInfo
    gm = make_fx(lambda x: (x * 2).sum(0), tracing_mode="symbolic")(torch.randn(5, 3))
    info = GraphInfo(0, gm, "inference")
    assert info.unplannable and "symbolic" in info.unplannable
    static = GraphInfo(0, make_fx(lambda x: (x * 2).sum(0))(torch.randn(5, 3)), "inference")
    assert static.unplannable is None and static.names == ["aten.mul.Tensor", "aten.sum.dim_IntList"]
    assert static.storage_bytes == [60, 60, 12]


def test_one_call_offload_with_compile_is_the_compiled_path(tmp_path):
    import teraio.torch
    model = nn.Linear(4, 4)
    off = teraio.torch.offload(model, None, capacity=0.5, ssd=[str(tmp_path)], compile=True)
    assert isinstance(off, CompiledOffload) and off.report()["mode"] == "compiled"
    off.close()


def test_compiled_demo_reports_mode_compiled_and_identical_losses(tmp_path):
    """`python -m teraio.demo --compile` on a tiny model: runs CA (Inductor)
    and CB (teraio's compiled path) in their own processes."""
    import json
    import subprocess
    import sys
    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "teraio.demo", "--compile", "--out", str(out), "--iterations", "5",
                        "--dim", "64", "--layers", "1", "--heads", "4", "--ffn-dim", "128", "--seq-len", "64",
                        "--batch", "8"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["mode"] == "compiled"
    assert s["losses_identical"] is True and s["iterations_compared"] == 5
    assert s["capacity_bytes"] <= 0.5 * s["peak_bytes_no_offload"] + 1
    assert 0 < s["peak_resident_bytes"] <= s["capacity_bytes"] and s["over_capacity_kernels"] == 0
    assert s["bytes_offloaded"] > 0 and s["plan_migrations"] > 0 and not s["diverged"]
    assert "teraio demo (compiled)" in r.stdout
    r = subprocess.run([sys.executable, "-m", "teraio.demo", "--compile", "--sweep"], capture_output=True, text=True)
    assert r.returncode == 2 and "--compile and --sweep cannot be combined" in r.stderr


def test_post_grad_passes_off_is_refused_when_the_session_is_made(tmp_path):
    """teraio reads each graph where Inductor's post-grad passes leave it:
    with them off it could plan nothing, and says so at once rather than
    running without offloading."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    with torch._inductor.config.patch(use_post_grad_passes=False):
        with pytest.raises(ValueError, match="use_post_grad_passes is off"):
            CompiledOffload(model, torch.optim.SGD(model.parameters(), lr=0.1), capacity=0.5, ssd=str(tmp_path))


def test_a_step_run_inside_the_programs_dispatch_mode_that_ends_early(tmp_path):
    """The program wraps each step in a dispatch mode of its own and ends one
    step early (no backward, no optimizer step).  That step leaves its plan
    with global tensors away, and the runtime pushed its guard between steps
    on top of the program's mode; the mode's exit popped the guard instead of
    itself, and reading a parameter after the step read released memory
    (SIGSEGV, found by a breaker).  Now the tensors come back instead of
    being guarded under a foreign mode: the parameters read between steps
    are their true values, the losses are plain torch.compile's, and the
    mode stack is empty after each step and after close()."""
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

    class ProgramMode(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls):
            return True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def run(off_kw):
        torch.use_deterministic_algorithms(True)
        torch._dynamo.reset()
        model, opt, step = breaky_job()
        off = None
        if off_kw is None:
            model.compile(dynamic=False)
        else:
            off = CompiledOffload(model, opt, **off_kw)
        losses, read = [], []
        for i in range(6):
            with ProgramMode():
                with off.step() if off is not None else torch.enable_grad():
                    opt.zero_grad(set_to_none=False)
                    loss = breaky_loss(model, i)
                    if i != 4:
                        loss.backward()
                        opt.step()
            assert _get_current_dispatch_mode_stack() == [], i
            losses.append(loss.item())
            with torch.no_grad():
                read.append([p.detach().clone() for p in model.parameters()])
        if off is not None:
            off.close()
        assert _get_current_dispatch_mode_stack() == []
        return losses, read

    plain, plain_read = run(None)
    got, got_read = run(dict(capacity=0.5, ssd=[str(tmp_path)], ssd_gbps=(8.0, 8.0)))
    assert got == plain
    assert all(torch.equal(a, b) for r, s in zip(plain_read, got_read) for a, b in zip(r, s))


def test_an_eval_pass_of_a_transformers_model_compiles_under_teraio(tmp_path):
    """transformers' GPT-2 in eval under no_grad: its inference graph keeps
    real (empty) tensor constants, and copying the graph under Inductor's
    fake mode raised "Attempted to set the storage of a tensor on device
    meta to a storage on different device cpu" (found by a breaker).  Now
    the eval loss is plain torch.compile's."""
    transformers = pytest.importorskip("transformers")

    def eval_loss(teraio_on):
        torch._dynamo.reset()
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64)
        model = transformers.GPT2LMHeadModel(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
        off = None
        if teraio_on:
            off = CompiledOffload(model, opt, capacity=0.85, ssd=[str(tmp_path)], ssd_gbps=(8.0, 8.0))
        else:
            model.compile(dynamic=False)
        ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))
        model.eval()
        with torch.no_grad():
            loss = model(ids, labels=ids).loss.item()
        if off is not None:
            off.close()
        return loss

    assert eval_loss(True) == eval_loss(False)
