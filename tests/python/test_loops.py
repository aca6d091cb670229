"""Training loops people write, with teraio.torch.offload around each step.

Each loop runs twice on the tiny HF Llama of test_hf_models, once plainly
and once offloaded at half the profiled peak, and the losses (and where it
matters the parameters, optimizer state and checkpoints) must be equal bit
for bit, with the resident bytes within the capacity at every kernel of
every planned step (issue 13 item 6)."""
import io

import pytest
import torch
import torch.nn as nn

import teraio.torch

from test_hf_models import STEPS, assert_same, assert_within_capacity, hf_step as plain_step, run_loop, \
    tiny_batches, tiny_model

pytest.importorskip("transformers")

SHARE = 0.5


@pytest.fixture(autouse=True)
def deterministic():
    torch.use_deterministic_algorithms(True)


def options(ssd_dir):
    """teraio.torch.offload's options for these loops."""
    return {"capacity": SHARE, "ssd": [ssd_dir]}


def test_gradient_accumulation(ssd_dir):
    """Four micro-batches per optimizer step, gradients summed by backward."""
    def step(model, opt, micro):
        opt.zero_grad()
        for mb in micro:
            loss = model(input_ids=mb, labels=mb).loss / len(micro)
            loss.backward()
        opt.step()
        return loss

    batches = [tiny_batches(4, seed=10 + i) for i in range(STEPS)]
    plain = run_loop(step, batches)
    off = run_loop(step, batches, off_options=options(ssd_dir))
    assert_same(plain, off)
    assert_within_capacity(off[4])


def test_activation_checkpointing(ssd_dir):
    """torch.utils.checkpoint, non-reentrant (HF gradient checkpointing):
    the backward pass recomputes each layer's forward."""
    def setup(model):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})

    plain = run_loop(plain_step, tiny_batches(), model_setup=setup)
    off = run_loop(plain_step, tiny_batches(), off_options=options(ssd_dir), model_setup=setup)
    assert_same(plain, off)
    assert_within_capacity(off[4])


def test_autocast_bfloat16(ssd_dir):
    """torch.autocast("cpu", dtype=torch.bfloat16) around the forward pass:
    the casted weights autocast caches live until the region ends."""
    def step(model, opt, batch):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        return loss

    plain = run_loop(step, tiny_batches())
    off = run_loop(step, tiny_batches(), off_options=options(ssd_dir))
    assert_same(plain, off)
    assert_within_capacity(off[4])


def test_eval_between_steps(ssd_dir):
    """model.eval() and a torch.no_grad() evaluation after every training
    step, outside off.step(): the evaluation reads the true parameters
    (fetched on demand where the plan keeps them away between steps)."""
    held_out = tiny_batches(1, seed=99)[0]

    def evaluate(model, opt, i):
        model.eval()
        with torch.no_grad():
            loss = model(input_ids=held_out, labels=held_out).loss.item()
        model.train()
        return loss

    plain = run_loop(plain_step, tiny_batches(), between=evaluate)
    off = run_loop(plain_step, tiny_batches(), off_options=options(ssd_dir), between=evaluate)
    assert_same(plain, off)
    assert_within_capacity(off[4])


def test_checkpoint_while_offloaded_and_resume(ssd_dir):
    """model.state_dict() and optimizer.state_dict() saved between planned
    steps, while tensors are offloaded: the saved values equal the plain
    run's, and training resumed from that checkpoint (fresh model and
    optimizer, offloaded again) continues bit-identically."""
    saved = {}

    def checkpoint(model, opt, i):
        if i == 3:  # after two planned steps
            buf = io.BytesIO()
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
            saved[len(saved)] = buf.getvalue()
        return None

    batches = tiny_batches(7)
    plain = run_loop(plain_step, batches, between=checkpoint)
    off = run_loop(plain_step, batches, off_options=options(ssd_dir), between=checkpoint)
    assert_same(plain, off)
    ref, ck = (torch.load(io.BytesIO(saved[i])) for i in (0, 1))
    for k, v in ref["model"].items():
        assert torch.equal(ck["model"][k], v), k
    assert ck["opt"]["param_groups"] == ref["opt"]["param_groups"]
    for p, state in ref["opt"]["state"].items():
        for k, v in state.items():
            assert torch.equal(ck["opt"]["state"][p][k], v), (p, k)

    model = tiny_model("llama")
    model.load_state_dict(ck["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt.load_state_dict(ck["opt"])
    with teraio.torch.offload(model, opt, capacity=SHARE, ssd=[ssd_dir]) as off2:
        losses = []
        for b in batches[4:]:
            with off2.step():
                losses.append(plain_step(model, opt, b).item())
    assert losses == plain[0][4:]
    for p, q in zip(model.parameters(), plain[2].parameters()):
        assert torch.equal(p, q)


def test_new_sequence_is_profiled_and_its_plan_kept(ssd_dir):
    """Sequence lengths alternating 32/16: steps 0 and 1 are profiled (the
    plan is for length 16), steps 2 and 4 (length 32) diverge and run on
    demand, length 32 is profiled at step 6 once it was seen twice and is
    expected next, and from then on each step runs its own length's plan,
    switching without profiling."""
    long, short = tiny_batches(6, seq=32), tiny_batches(6, seq=16, seed=2)
    batches = [b for pair in zip(long, short) for b in pair]
    plain = run_loop(plain_step, batches)
    off = run_loop(plain_step, batches, off_options=options(ssd_dir))
    assert_same(plain, off)
    r = off[4]
    assert (r["profiled_iterations"], r["reprofiles"], r["diverged_iterations"]) == (3, 1, 2)
    assert r["plan_switches"] == 5  # after steps 7, 8, 9, 10 and 11
    # steps that followed each plan (8, 10; and 3, 5, 7, 9, 11), and those that left it (2 and 4)
    assert sorted((p["iterations"], p["diverged_iterations"]) for p in r["plans"]) == [(2, 0), (5, 2)]
    assert all(p["fits"] for p in r["plans"])


def test_offload_call_refuses_bad_use(ssd_dir):
    """The one call's misuse is one clear error each: bad options, a
    capacity below the working-set floor (named when the plan is made),
    a step inside a step, use from another thread or after close()."""
    import threading

    from test_offload import _batches, _small_job, _small_step

    model, opt = _small_job()
    for kwargs, err, says in [({"capacity": 0}, ValueError, "capacity must be > 0"),
                              ({"capacity": 1.5}, ValueError, "share of the peak must be in (0, 1]"),
                              ({"capacity": "half"}, TypeError, "capacity must be bytes"),
                              ({"capacity": 0.5, "ssd": []}, ValueError, "one or more directories"),
                                  ({"capacity": 0.5, "ssd": [ssd_dir + "/nope"]}, ValueError,
                                   "nope' does not exist"),
                              ({"capacity": 0.5, "max_plans": 0}, ValueError, "max_plans must be")]:
        kwargs.setdefault("ssd", [ssd_dir])
        with pytest.raises(err, match=says.replace("(", r"\(").replace(")", r"\)")):
            teraio.torch.offload(model, opt, **kwargs)
    batches = _batches([4] * 3)
    off = teraio.torch.offload(model, opt, capacity=4096, ssd=[ssd_dir])  # below the floor
    with off.step():
        _small_step(model, opt, batches[0])
    with pytest.raises(ValueError, match="no plan for capacity 4096 bytes: "):
        with off.step():
            _small_step(model, opt, batches[1])
    with pytest.raises(RuntimeError, match="already running"):
        with off.step():
            with off.step():
                pass
    errors = []
    th = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, off.report)))
    th.start()
    th.join()
    assert "another thread" in str(errors[0].value)
    off.close()
    with pytest.raises(RuntimeError, match="closed"):
        off.step().__enter__()


def test_steps_that_leave_their_plan_keep_the_capacity(ssd_dir):
    """Sequence lengths 64 and 128 in turn, with an eval step (no_grad, no
    optimizer) every third step, all inside off.step(): a step that leaves
    its plan (the wrong plan expected, an eval pass, a sequence not planned)
    goes on under the pager, which evicts on demand, so no kernel of any
    planned or diverged step exceeds the capacity (issue 24 item 5), and the
    losses and parameters equal the plain run's bit for bit."""
    batches = [tiny_batches(1, seq=64 if i % 2 == 0 else 128, seed=10 + i)[0] for i in range(18)]

    def run(off_options=None):
        n = iter(range(len(batches)))

        def step(model, opt, batch):
            if next(n) % 3 != 2:
                return plain_step(model, opt, batch)
            model.eval()
            with torch.no_grad():
                loss = model(input_ids=batch, labels=batch).loss
            model.train()
            return loss
        return run_loop(step, batches, off_options=off_options)

    plain, off = run(), run(options(ssd_dir))
    assert_same(plain, off)
    r = off[4]
    assert r["diverged_iterations"] >= 4, r
    assert r["paged_kernels"] > 0 and r["paged_evictions"] > 0, r
    assert r["over_capacity_kernels"] == 0, r
    assert r["paged_over_capacity_kernels"] == 0, r
    # The pager's overhead: what one operator makes is on top of the capacity until it
    # returns; here the largest is an attention matrix at length 128 (batch 4, 4 heads, fp32).
    biggest = max(p["capacity_bytes"] for p in r["plans"])
    one_output = 4 * 4 * 128 * 128 * 4
    assert r["peak_resident_bytes"] <= biggest + one_output, (r["peak_resident_bytes"], biggest)


def test_state_dict_inside_a_diverged_step(ssd_dir):
    """state_dict() inside a step that left its plan fetches what the pager
    evicted; storages that died in the step are forgotten first (it raised
    "the allocate callback failed" for a dead slot; found by a breaker)."""
    batches = tiny_batches(3, seq=16) + tiny_batches(1, seq=32, seed=5)

    def step(model, opt, batch):
        opt.zero_grad()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        sd = model.state_dict()
        opt.step()
        return loss + 0 * next(iter(sd.values())).sum()

    plain = run_loop(step, batches)
    off = run_loop(step, batches, off_options=options(ssd_dir))
    assert_same(plain, off)
    assert off[4]["diverged_iterations"] == 1 and off[4]["paged_kernels"] > 0


def test_report_says_each_plan_against_its_own_capacity(tmp_path):
    """Issue 25 item 2: with two plans of different capacities, report() read
    the last plan's capacity beside the peak over all plans.  Each plan now
    has its own capacity, measured peak, kernels over it, and its planned and
    diverged steps; the top-level worst ratio is of a plan to its own."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(64, 64), *[nn.Linear(64, 64) for _ in range(4)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    off = teraio.torch.offload(model, opt, capacity=0.5, ssd=[str(tmp_path)])
    for i in range(18):
        x = torch.randint(0, 64, (4, 64 if i % 2 == 0 else 128))
        with off.step():
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    rep = off.report()
    off.close()
    plans = rep["plans"]
    assert len(plans) == 2 and plans[0]["capacity_bytes"] != plans[1]["capacity_bytes"]
    for p in plans:
        assert 0 < p["peak_resident_bytes"] <= p["capacity_bytes"], p
        assert p["over_capacity_kernels"] == 0 and p["planned_iterations"] > 0
        assert p["peak_to_capacity"] == p["peak_resident_bytes"] / p["capacity_bytes"]
    assert sum(p["planned_iterations"] for p in plans) == rep["planned_iterations"]
    assert sum(p["diverged_iterations"] for p in plans) == rep["diverged_iterations"]
    assert rep["peak_to_capacity_max"] == max(p["peak_to_capacity"] for p in plans) <= 1
    # the top-level bytes are of different plans: the peak is the larger plan's
    assert rep["peak_resident_bytes"] == max(p["peak_resident_bytes"] for p in plans)


def test_a_storage_grown_in_place_keeps_its_bytes(tmp_path):
    """A buffer grown with resize_ inside the step (a new allocation at another
    address) lost its bytes: the pager and the plan still had its old address
    and size, and evicting it wrote freed memory and brought back too few
    bytes (NaN).  Now the pager tracks it anew, a plan made from an earlier
    size is not bound to it, and a planned step that grows a bound storage
    leaves its plan there; the values and losses are the plain run's."""

    class Growing(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Sequential(*[nn.Linear(128, 128) for _ in range(4)])
            self.register_buffer("acc", torch.zeros(16))

        def forward(self, x):
            y = self.lin(x)
            if self.acc.numel() < 16 * 64:
                self.acc.resize_(self.acc.numel() * 2)
                self.acc[self.acc.numel() // 2:] = 1.0
            return y.square().mean() + self.acc.sum() * 0

    def run(offload):
        torch.manual_seed(0)
        m = Growing()
        opt = torch.optim.AdamW(m.lin.parameters(), lr=1e-3)
        off = teraio.torch.offload(m, opt, capacity=0.5, ssd=[str(tmp_path)]) if offload else None
        x, losses, sums = torch.randn(64, 128), [], []
        for _ in range(8):
            with off.step() if off is not None else torch.enable_grad():
                loss = m(x)
                loss.backward()
                opt.step()
                opt.zero_grad()
            losses.append(loss.item())
            sums.append(m.acc.sum().item())
        if off is not None:
            off.close()
        return losses, sums

    plain, got = run(False), run(True)
    assert got == plain
    assert plain[1][-1] == 1008.0
