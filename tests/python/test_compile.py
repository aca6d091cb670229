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

from teraio.torch import _compile_ops
from teraio.torch.compile import CompiledOffload

from conftest import TinyJob


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


@pytest.fixture(scope="module")
def llama_runs(tmp_path_factory):
    torch.use_deterministic_algorithms(True)
    torch._dynamo.reset()
    ref = TinyJob(iterations=STEPS, batch=16)
    ref_losses = plain_compiled_losses(ref, STEPS)
    ssd = tmp_path_factory.mktemp("ssd")
    job = TinyJob(iterations=STEPS, batch=16)
    # The planner assumes a fast SSD so that the plan does not depend on this
    # machine's load; a slower one only makes the deadlines wait.
    off = CompiledOffload(job.model, job.opt, capacity=0.5, ssd=[str(ssd)], ssd_gbps=(8.0, 8.0))
    losses = []
    for i in range(STEPS):
        with off.step():
            loss = job.step(i)
        losses.append(loss.item())
    off.fetch_all()
    yield {"ref": ref, "ref_losses": ref_losses, "job": job, "off": off, "losses": losses,
           "report": off.report()}
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
    assert rep["bytes_offloaded"] == per_step * (STEPS - 2)
    assert rep["bytes_prefetched"] + rep["bytes_fetched_urgent"] == per_step * (STEPS - 2)
    assert 0 < rep["peak_resident_bytes"] <= plan["capacity_bytes"]
    assert rep["over_capacity_kernels"] == 0


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


def test_capacity_below_the_eager_optimizer_step_says_what_it_needs(llama_runs, tmp_path):
    """With the optimizer step eager, its kernel holds every parameter,
    gradient and optimizer state at once: a smaller capacity is refused with
    that floor named."""
    torch._dynamo.reset()
    job = TinyJob(iterations=2, batch=16)
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
    return model, opt, step


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
    assert reps[7]["profiled_iterations"] == 3 and len(reps[7]["plans"]) == 2
    assert reps[8]["planned_iterations"] == 4
    # Batch 256 again: at step 9's first region the session switches to the
    # kept 256 plan, without profiling and without leaving the plan.
    assert reps[-1]["profiled_iterations"] == 3 and reps[-1]["reprofiles"] == 1
    assert reps[-1]["diverged_iterations"] == 2 and reps[-1]["plan_switches"] == 1
    assert reps[-1]["planned_iterations"] == 6
    assert all(p["fits"] for p in reps[-1]["plans"])
    assert reps[-1]["over_capacity_kernels"] == 0
