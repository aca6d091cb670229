"""teraio.torch.session: one session for eager and compiled steps.

The eager and the compiled path used to be two hand-kept classes that had
drifted: ``ssd`` as one directory and ``{local_rank}`` templates were taken
by the eager path only, a capacity of 2^64 was refused by the eager path
only, the two plan caches trimmed by different rules, and the compiled path
checked the capacity again in Python with its own figures.  Each case here
runs on both paths.
"""
import contextlib
import ast
import re
import pathlib

import pytest
import torch
import torch.nn as nn

import teraio.torch
from teraio.core import Lifetime, Plan, Trace
from teraio.torch.compile import CompiledSession
from teraio.torch.eager import EagerSession
from teraio.torch.session import PlanEntry, Session

PATHS = [False, True]  # compile=


def _model():
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


@pytest.mark.parametrize("compile", PATHS)
def test_ssd_as_one_directory_is_taken_by_both_paths(tmp_path, compile):
    model, opt = _model()
    with teraio.torch.offload(model, opt, capacity=0.5, ssd=str(tmp_path), compile=compile,
                              compile_model=False) if compile else \
            teraio.torch.offload(model, opt, capacity=0.5, ssd=str(tmp_path)) as off:
        assert off.ssd == [str(tmp_path)]
        assert off.report()["mode"] == ("compiled" if compile else "eager")


@pytest.mark.parametrize("compile", PATHS)
def test_local_rank_template_is_filled_on_both_paths(tmp_path, monkeypatch, compile):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    (tmp_path / "nvme1").mkdir()
    model, opt = _model()
    kw = {"compile_model": False} if compile else {}
    off = teraio.torch.offload(model, opt, capacity=0.5, ssd=[str(tmp_path / "nvme{local_rank}")],
                               compile=compile, **kw)
    assert off.ssd == [str(tmp_path / "nvme1")]
    off.close()
    # one list per local rank: LOCAL_RANK picks the second
    (tmp_path / "b").mkdir()
    off = teraio.torch.offload(model, opt, capacity=0.5, ssd=[[str(tmp_path / "a")], [str(tmp_path / "b")]],
                               compile=compile, **kw)
    assert off.ssd == [str(tmp_path / "b")]
    off.close()


@pytest.mark.parametrize("compile", PATHS)
@pytest.mark.parametrize("capacity, err, says", [
    (2**64, ValueError, "< 2^64"), (0, ValueError, "> 0 bytes"), (1.5, ValueError, "(0, 1]"),
    (True, TypeError, "capacity must be bytes")])
def test_capacity_is_checked_alike_on_both_paths(tmp_path, compile, capacity, err, says):
    model, opt = _model()
    kw = {"compile_model": False} if compile else {}
    with pytest.raises(err, match=re.escape(says)):
        teraio.torch.offload(model, opt, capacity=capacity, ssd=[str(tmp_path)], compile=compile, **kw)


@pytest.mark.parametrize("compile", PATHS)
@pytest.mark.parametrize("option, value, says", [
    ("bandwidth_share", "0.5", "bandwidth_share must be a number in"),
    ("space_bytes", -1, "space_bytes must be bytes"),
    ("profile_iterations", True, "profile_iterations must be an integer >= 1"),
    ("ssd_gbps", (1.0,), "ssd_gbps must be"),
])
def test_options_are_checked_when_the_session_is_made(tmp_path, compile, option, value, says):
    model, opt = _model()
    kw = {"compile_model": False} if compile else {}
    with pytest.raises(ValueError, match=says):
        teraio.torch.offload(model, opt, capacity=0.5, ssd=[str(tmp_path)], compile=compile,
                             **{option: value}, **kw)


class _KeyedDriver(Session):
    """A driver whose steps run the sequence the test names (`keys`), each
    profiled one planned from the same small real trace: what remains is the
    session's own cache and re-profile rules."""

    mode = "keyed"

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.keys = []
        self.made = []

    def _profile_begin(self):
        pass

    def _profile_end(self, exc):
        return self.keys.pop(0), None

    def _plan_profile(self, key, profile, capacity_of):
        trace = Trace.build("keyed", [(4096, "parameter", True, "w"), (8192, "activation", False, None)],
                            [("a", 1000, [(0, 1), (1, 2)]), ("b", 1000, [(0, 1)]), ("c", 1000, [(1, 1)])])
        lt = Lifetime(trace)
        cap = capacity_of(lt)
        return PlanEntry(key, trace, lt, Plan.build(trace, lt, cap, ssd_read_gbps=1.0, ssd_write_gbps=1.0), cap)

    def _make_runtime(self, entry):
        self.made.append(entry.key)
        return _NullRuntime()

    def _run_begin(self):
        pass

    def _run_end(self, exc):
        return self.keys.pop(0), True


class _NullRuntime:
    """A runtime that moves nothing and counts nothing."""
    _p = None

    def stats(self):
        return {}

    def close(self):
        pass


def test_plan_cache_trimming_is_the_sessions_one_rule(tmp_path):
    """max_plans=2: plans are dropped least recently used first, never the
    one in use; neither driver has a rule of its own."""
    for driver in (EagerSession, CompiledSession):
        for name in ("_plan", "_after", "_use", "_expected_after", "report", "close", "_enter", "_exit"):
            assert getattr(driver, name) is getattr(Session, name), (driver, name)
    model, opt = _model()
    s = _KeyedDriver(model, opt, capacity=1.0, ssd=[str(tmp_path)], profile_iterations=1, reprofile_after=1,
                    max_plans=2, ssd_gbps=(1.0, 1.0))

    def step(key):
        s.keys.append(key)
        with s.step():
            pass

    step("A")                 # profiled, planned, A runs next
    step("B")                 # under A, B seen once and expected: profiled next
    step("B")                 # profiled, planned
    step("A")                 # under B: A was followed by B last time, so B runs next
    assert list(s._plans) == ["A", "B"] and s._entry.key == "B"
    step("A")                 # A followed by B, then by A: A runs next
    assert list(s._plans) == ["B", "A"] and s._entry.key == "A"
    step("C")                 # under A, C expected next: profiled
    step("C")                 # planned: B (least recently used) dropped, A kept
    assert list(s._plans) == ["A", "C"]
    assert s.made == ["A", "B", "A", "C"]
    rep = s.report()
    assert rep["profiled_iterations"] == 3 and rep["reprofiles"] == 2
    assert [p["key"] for p in rep["plans"]] == ["A", "C"]
    # B, dropped from the cache, is still in the report: the plans' counts add up to the top level's
    assert [p["key"] for p in rep["retired_plans"]] == ["B"]
    every = rep["plans"] + rep["retired_plans"]
    assert sum(p["iterations"] for p in every) == rep["planned_iterations"] > 0


def test_an_exception_entering_a_step_leaves_the_next_step_runnable(tmp_path):
    """Ctrl-C while step() was entering left it marked as running for the
    rest of the process."""
    model, opt = _model()
    off = teraio.torch.offload(model, opt, capacity=0.5, ssd=[str(tmp_path)])
    real = off._profile_begin

    def interrupted():
        raise KeyboardInterrupt

    off._profile_begin = interrupted
    with pytest.raises(KeyboardInterrupt):
        with off.step():
            pass
    off._profile_begin = real
    with off.step():
        model(torch.randn(2, 8)).sum().backward()
    assert off.report()["profiled_iterations"] == 1
    with pytest.raises(RuntimeError, match="close\\(\\) inside a step"):
        with off.step():
            off.close()
    off.close()


def test_ctrl_c_inside_a_callback_is_a_keyboard_interrupt(tmp_path, monkeypatch):
    """A Ctrl-C that lands in the allocate callback (Python code the C runtime
    calls) was printed as ignored by ctypes and the step failed with "Cannot
    allocate memory".  Now it is the KeyboardInterrupt, and the next step runs."""
    from teraio.torch.runtime import OffloadRuntime
    real, armed = OffloadRuntime._allocate, []

    def allocate(self, *args):
        if armed:
            armed.clear()
            raise KeyboardInterrupt
        return real(self, *args)

    monkeypatch.setattr(OffloadRuntime, "_allocate", allocate)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    off = teraio.torch.offload(model, opt, capacity=0.6, ssd=[str(tmp_path)])
    x = torch.randn(32, 64)

    def step():
        with off.step():
            model(x).square().sum().backward()
            opt.step()
            opt.zero_grad()

    for _ in range(3):
        step()
    assert off.report()["planned_iterations"] == 1 and off.report()["bytes_prefetched"] > 0
    armed.append(True)
    with pytest.raises(KeyboardInterrupt):
        step()
    assert not armed                                  # it was raised inside the callback
    opt.zero_grad()   # the interrupted backward may have left gradients the next step would add to
    for _ in range(2):
        step()
    rep = off.report()
    assert rep["planned_iterations"] >= 3 and rep["over_capacity_kernels"] == 0
    off.close()


def test_compiled_report_counts_a_step_over_its_capacity(tmp_path):
    """The compiled path's resident bytes come from the C runtime: a step run
    under a plan made for the whole peak (it moves nothing) but held to half
    of it is counted over the capacity, kernel by kernel."""
    from test_compile import OneLayerJob

    class Oversized(CompiledSession):
        def _build_plan(self, trace, lt, cap, **kw):
            plan = super()._build_plan(trace, lt, lt.peak_bytes, **kw)
            plan._p.contents.capacity_bytes = cap  # the runtime holds it to `cap`
            return plan

    assert torch._C._len_torch_dispatch_stack() == 0, "a dispatch mode left by an earlier test"
    torch._dynamo.reset()
    job = OneLayerJob(iterations=4, batch=16)
    off = Oversized(job.model, job.opt, capacity=0.5, ssd=[str(tmp_path)], ssd_gbps=(8.0, 8.0))
    for i in range(4):
        with off.step():
            job.step(i)
    rep = off.report()
    off.close()
    cap = rep["plans"][0]["capacity_bytes"]
    assert rep["planned_iterations"] == 2 and rep["plans"][0]["migrations"] == 0
    assert rep["over_capacity_kernels"] >= 2            # at least one per step
    assert rep["peak_resident_bytes"] > cap
    assert rep["over_capacity_bytes_max"] == rep["peak_resident_bytes"] - cap


def _imports(path: pathlib.Path, package: str) -> set[str]:
    """The teraio.torch modules `path` imports (anywhere in it)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")
            base = base[:len(base) - node.level + 1]
            mod = ".".join(base + ([node.module] if node.module else []))
            names = [mod] if node.module else [f"{mod}.{a.name}" for a in node.names]
            out.update(names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return {m for m in out if m.startswith("teraio.torch")}


def test_no_circle_of_imports_in_teraio_torch():
    root = pathlib.Path(teraio.torch.__file__).parent
    modules = {}
    for f in root.rglob("*.py"):
        rel = f.relative_to(root.parent.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        package = name if rel.name == "__init__" else name.rsplit(".", 1)[0]
        modules[name] = _imports(f, package)
    graph = {m: {d for d in deps if d in modules and d != m} for m, deps in modules.items()}
    assert "teraio.torch.compile.session" in graph and "teraio.torch.eager" in graph
    state = {}

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                raise AssertionError("import circle: " + " -> ".join(path + [m, d]))
            if d not in state:
                visit(d, path + [m])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


@pytest.mark.parametrize("compile", PATHS)
def test_a_second_session_on_a_live_sessions_model_is_refused(tmp_path, compile):
    """Issue 26 item 1: two sessions on one model, steps alternating, turned
    AdamW's step counter to garbage (OverflowError) and nested steps crashed.
    The second offload() is refused, naming the live session, until it is
    closed; another model beside it is fine."""
    model, opt = _model()
    kw = {"compile_model": False} if compile else {}
    a = teraio.torch.offload(model, opt, capacity=0.5, ssd=[str(tmp_path)], name="first", compile=compile, **kw)
    with pytest.raises(RuntimeError, match="the model is driven by a live session \\('first'\\)"):
        teraio.torch.offload(model, None, capacity=0.5, ssd=[str(tmp_path)], compile=compile, **kw)
    other = nn.Linear(8, 8)
    with pytest.raises(RuntimeError, match="the optimizer is driven by a live session"):
        teraio.torch.offload(other, opt, capacity=0.5, ssd=[str(tmp_path)], compile=compile, **kw)
    b = teraio.torch.offload(other, None, capacity=0.5, ssd=[str(tmp_path)], compile=compile, **kw)
    b.close()
    a.close()
    c = teraio.torch.offload(model, opt, capacity=0.5, ssd=[str(tmp_path)], compile=compile, **kw)
    c.close()


def test_a_failed_replan_keeps_the_previous_plan(tmp_path, caplog):
    """Issue 26 item 2: a new batch size needed a larger engine, its creation
    failed (ENOSPC), and the old engine was already closed: every later step
    ran profiled, with nothing offloaded and no log line.  Now the failure is
    said once, the sequence is marked as not plannable, and the old plan
    runs on: its steps planned, the new shape's on demand, losses as plain."""
    import logging

    from teraio._lib import TeraioError

    def job():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        return m, torch.optim.AdamW(m.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(1)
    sizes = [32, 32, 32, 64, 64, 64, 32, 32]
    data = [torch.randn(b, 64, generator=g) for b in sizes]
    step = _mlp_step
    m, o = job()
    plain = [step(m, o, x) for x in data]
    m, o = job()
    off = teraio.torch.offload(m, o, capacity=0.9, ssd=[str(tmp_path)])
    got = []
    with caplog.at_level(logging.WARNING, logger="teraio"):
        for i, x in enumerate(data):
            if i == 3:  # from the re-plan on, no engine can be made
                def no_space(*a, **k):
                    raise TeraioError(-28, "engine: cannot preallocate: No space left on device")
                off._engine_for = no_space
            with off.step():
                got.append(step(m, o, x))
    rep = off.report()
    off.close()
    assert got == plain
    assert rep["reprofiles"] == 1 and len(rep["unplannable"]) == 1
    assert "No space left on device" in next(iter(rep["unplannable"].values()))
    assert sum("cannot be planned" in r.getMessage() for r in caplog.records) == 1
    assert rep["plans"][0]["iterations"] >= 2          # the old shape's steps ran its plan
    assert rep["profiled_iterations"] == 3



def test_numpy_and_pickling_while_profiled_steps_page(tmp_path):
    """Found by a breaker: .numpy() on a parameter makes its storage
    unresizable, and the pager's next eviction of it failed every later step
    ("the release callback failed"); torch.save(model) failed on the hook
    teraio put on the model (a lambda).  Now such a storage stays resident,
    the model pickles (its teraio hooks as no-ops), and training equals the
    plain run."""
    import io

    def job():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
        return m, torch.optim.SGD(m.parameters(), lr=0.01, foreach=False)

    g = torch.Generator().manual_seed(1)
    data = [torch.randn(128, 64, generator=g) for _ in range(6)]
    step = _mlp_step
    m, o = job()
    plain = [step(m, o, x) for x in data]
    m, o = job()
    off = teraio.torch.offload(m, o, capacity=400_000, ssd=[str(tmp_path)], profile_iterations=3)
    got = []
    for i, x in enumerate(data):
        with off.step():
            got.append(step(m, o, x))
        if i == 0:
            float(m[0].weight.detach().numpy().sum())  # the weight's storage is numpy's now too
        saved = _saved(m)                               # the whole module, hooks included
    copy = torch.load(io.BytesIO(saved), weights_only=False)
    assert all(torch.equal(p, q) for p, q in zip(copy.parameters(), m.parameters()))
    off.close()
    assert got == plain


def _saved(m) -> bytes:
    import io
    buf = io.BytesIO()
    torch.save(m, buf)
    return buf.getvalue()


def _mlp_step(m, o, x) -> float:
    """One training step of the MLP jobs above: the mean square of the output."""
    o.zero_grad()
    loss = (m(x) ** 2).mean()
    loss.backward()
    o.step()
    return loss.item()



def _state_hash(model, opt) -> str:
    import hashlib
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    for st in opt.state.values():
        for v in st.values():
            h.update(v.detach().numpy().tobytes() if torch.is_tensor(v) else repr(v).encode())
    return h.hexdigest()


def test_a_monitoring_thread_reads_inside_reading(tmp_path):
    """Issue 26 item 4: a second thread that read parameters or optimizer state
    while the main thread trained got SIGSEGV (a storage released under it).
    Inside ``off.reading()`` it waits for a step boundary, where every tensor
    is back and none moves: each of its many reads is the model and optimizer
    of some step of the run without teraio, exactly, and the losses are that
    run's."""
    import threading

    def job():
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(6)])
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3), torch.randn(64, 256)

    def train(model, opt, x, off, after=None):
        losses = []
        for _ in range(16):
            with off.step() if off is not None else contextlib.nullcontext():
                loss = model(x).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            losses.append(loss.item())
            if after:
                after()
        return losses

    model, opt, x = job()
    states = {_state_hash(model, opt)}
    plain = train(model, opt, x, None, after=lambda: states.add(_state_hash(model, opt)))
    model, opt, x = job()
    off = teraio.torch.offload(model, opt, capacity=0.5, ssd=[str(tmp_path)])
    seen, errors, stop = [], [], threading.Event()

    def monitor():
        try:
            while not stop.is_set():
                with off.reading(timeout=60):
                    seen.append(_state_hash(model, opt))
                    # docs/runtime.md's snapshot: state_dict()'s hooks have nothing to fetch here
                    snap = {k: v.clone() for k, v in model.state_dict().items()}
                    osd = opt.state_dict()
                    assert len(snap) == 12 and len(osd["state"]) in (0, 12)
        except BaseException as e:  # noqa: BLE001 (reported by the assertion below)
            errors.append(e)

    t = threading.Thread(target=monitor)
    t.start()
    got = train(model, opt, x, off)
    rep = off.report()
    stop.set()
    off.close()                       # a reader waiting now goes on: everything is back
    t.join(timeout=60)
    assert not errors and not t.is_alive(), errors
    assert got == plain
    assert rep["planned_iterations"] >= 10 and rep["bytes_offloaded"] > 0
    assert len(seen) >= 8 and set(seen) <= states, (len(seen), len(set(seen) - states))
    assert len(set(seen)) >= 4          # reads at many different steps
    # from the driving thread, between steps, it is fetch_all()
    with off.reading():
        pass
