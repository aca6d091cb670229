"""teraio under Hugging Face's Trainer (teraio.torch.trainer.OffloadCallback)
and Accelerate (teraio.torch.accelerate.offload), each against the same job
without teraio, bit for bit: transformers' GPT-2 as it comes (sdpa
attention, dropout on), gradient accumulation 2, an evaluation every 2
optimizer steps, a checkpoint, and a resume from it, at capacity 0.5."""
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

from teraio.torch import _config  # noqa: E402

VOCAB, SEQ, BATCH = 256, 32, 4
STEPS, SAVE_AT = 8, 4


@pytest.fixture(autouse=True)
def deterministic(monkeypatch):
    """One thread, deterministic algorithms, and each test its own Accelerate
    state (a process-wide singleton that keeps, say, a dynamo backend from the
    Accelerator made before; TrainingArguments(torch_compile=True) also sets
    ACCELERATE_DYNAMO_BACKEND, which monkeypatch takes back)."""
    from accelerate.state import AcceleratorState, GradientState
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    monkeypatch.delenv("ACCELERATE_DYNAMO_BACKEND", raising=False)
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(threads)


def gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=SEQ,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        self.x = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_same_params(a, b):
    assert a.keys() == b.keys()
    bad = [n for n in a if not torch.equal(a[n], b[n])]
    assert not bad, f"parameters differ: {bad[:5]}"


def assert_offloaded(rep):
    assert rep["planned_iterations"] > 0 and rep["bytes_offloaded"] > 0, rep
    assert rep["over_capacity_kernels"] == 0, rep


# -- the Trainer ------------------------------------------------------------------
def train(out, callbacks, resume=None):
    from transformers import Trainer, TrainingArguments
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=BATCH, gradient_accumulation_steps=2,
                             max_steps=STEPS, eval_strategy="steps", eval_steps=2, save_steps=SAVE_AT,
                             logging_steps=1, report_to=[], use_cpu=True, seed=0, dataloader_num_workers=0,
                             learning_rate=1e-3, disable_tqdm=True, optim="adamw_torch")
    trainer = Trainer(model=gpt2(), args=args, train_dataset=Tokens(64, 1), eval_dataset=Tokens(8, 2),
                      callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    history = [(h.get("step"), h.get("loss"), h.get("eval_loss")) for h in trainer.state.log_history]
    return history, params(trainer.model)


def test_trainer_callback_trains_as_the_trainer_does_and_resumes(tmp_path):
    from teraio.torch.trainer import OffloadCallback
    (tmp_path / "ssd").mkdir()
    plain_history, plain_params = train(tmp_path / "plain", [])
    cb = OffloadCallback(capacity=0.5, ssd=str(tmp_path / "ssd"))
    history, got = train(tmp_path / "teraio", [cb])
    losses = [h for h in history if h[1] is not None]
    evals = [h for h in history if h[2] is not None]
    assert len(losses) == STEPS and len(evals) == STEPS // 2
    assert history == plain_history
    assert_same_params(got, plain_params)
    assert cb.session is None and cb.report["mode"] == "eager"
    # the evaluations after steps 2, 4, 6 and 8 ran as steps of the session, within the capacity
    assert cb.evaluation_steps == STEPS // 2, cb.evaluation_steps
    assert cb.report["steps"] == STEPS + cb.evaluation_steps and cb.report["profiled_iterations"] == 2, cb.report
    assert cb.report["planned_iterations"] + cb.report["diverged_iterations"] == STEPS - 2 + cb.evaluation_steps
    assert_offloaded(cb.report)
    # the checkpoint it saved holds the true parameters: resume from it, under teraio and without
    ck = tmp_path / "teraio" / f"checkpoint-{SAVE_AT}"
    assert ck.is_dir()
    cb2 = OffloadCallback(capacity=0.5, ssd=str(tmp_path / "ssd"))
    resumed_history, resumed = train(tmp_path / "teraio", [cb2], resume=str(ck))
    _, plain_resumed = train(tmp_path / "plain", [], resume=str(tmp_path / "plain" / f"checkpoint-{SAVE_AT}"))
    assert_same_params(resumed, plain_resumed)
    assert_same_params(resumed, plain_params)  # the Trainer's resume is exact here, and so is teraio's
    assert [h for h in resumed_history if h[0] > SAVE_AT] == [h for h in plain_history if h[0] > SAVE_AT]
    assert cb2.evaluation_steps == 2    # after steps 6 and 8
    assert cb2.report["steps"] == STEPS - SAVE_AT + 2 and cb2.report["planned_iterations"] > 0, cb2.report


def test_trainer_callback_reads_the_environment(monkeypatch, tmp_path):
    from teraio.torch.trainer import OffloadCallback
    monkeypatch.setenv("TERAIO_CAPACITY", "0.25")
    monkeypatch.setenv("TERAIO_SSD", f"{tmp_path}/a{os.pathsep}{tmp_path}/b")
    monkeypatch.setenv("TERAIO_HOST_CAP_BYTES", "64MiB")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    cb = OffloadCallback()
    assert (cb.capacity, cb.ssd, cb.compile) == (0.25, [f"{tmp_path}/a", f"{tmp_path}/b"], False)
    assert cb.options == {"host_cap_bytes": 64 << 20}
    monkeypatch.setenv("TERAIO_COMPILE", "1")
    monkeypatch.setenv("TERAIO_CAPACITY", "3GiB")
    cb = OffloadCallback(ssd=str(tmp_path), host_cap_bytes=5)  # code wins over the environment
    assert (cb.capacity, cb.ssd, cb.compile, cb.options) == (3 << 30, str(tmp_path), True, {"host_cap_bytes": 5})
    # a directory that is not there is named with the variable that named it, when the callback is made
    with monkeypatch.context() as m:
        m.setenv("TERAIO_SSD", f"{tmp_path}/a{os.pathsep}{tmp_path}/gone")
        with pytest.raises(ValueError, match=r"TERAIO_SSD=.*: directory '.*/gone' does not exist"):
            OffloadCallback()
    with pytest.raises(ValueError, match=r"ssd: directory '/nonexistent/x' does not exist"):
        OffloadCallback(ssd="/nonexistent/x")
    for var, value, says in (("TERAIO_CAPACITY", "half", "TERAIO_CAPACITY='half' is neither"),
                             ("TERAIO_CAPACITY", "1.5", "must be in (0, 1]"),
                             ("TERAIO_COMPILE", "maybe", "TERAIO_COMPILE='maybe' is not a switch"),
                             ("TERAIO_HOST_CAP_BYTES", "12 parsecs", "TERAIO_HOST_CAP_BYTES='12 parsecs' is not bytes")):
        with monkeypatch.context() as m:
            m.setenv(var, value)
            with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
                OffloadCallback()
    monkeypatch.delenv("TERAIO_SSD")
    monkeypatch.delenv("TIO_SSD", raising=False)
    with pytest.raises(ValueError, match="no SSD directory: pass ssd=... or set TERAIO_SSD"):
        OffloadCallback()


def test_trainer_callback_refuses_what_it_cannot_offload(tmp_path, monkeypatch):
    from transformers import Trainer, TrainingArguments
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "no")  # restored after: TrainingArguments sets it

    from teraio.torch.trainer import OffloadCallback
    args = TrainingArguments(output_dir=str(tmp_path / "o"), max_steps=1, report_to=[], use_cpu=True,
                             torch_compile=True, disable_tqdm=True)
    cb = OffloadCallback(capacity=0.5, ssd=str(tmp_path))
    trainer = Trainer(model=gpt2(), args=args, train_dataset=Tokens(8, 1), callbacks=[cb])
    with pytest.raises(ValueError, match="torch_compile is set .*pass compile=True"):
        trainer.train()
    assert cb.session is None


# -- Accelerate ---------------------------------------------------------------------
def accelerate_run(tmp_path, tio, save=None, load=None, skip=0, micro=16):
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    set_seed(0)
    x = torch.randint(0, VOCAB, (micro * BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    model = gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    model, opt, data, sched = acc.prepare(model, opt, torch.utils.data.DataLoader(x, batch_size=BATCH), sched)
    if load:
        acc.load_state(str(load))
    off = None
    if tio:
        import teraio.torch.accelerate
        off = teraio.torch.accelerate.offload(acc, model, opt, capacity=0.5, ssd=str(tmp_path))
    accumulate = off.accumulate if off else acc.accumulate
    losses = []
    for i, batch in enumerate(acc.skip_first_batches(data, skip) if skip else data, start=skip):
        with accumulate(model):
            loss = model(input_ids=batch, labels=batch).loss
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
        losses.append(loss.item())
        if save and i + 1 == micro // 2:
            acc.save_state(str(save))
    rep = None
    if off:
        rep = off.report()
        off.close()
    return losses, params(acc.unwrap_model(model)), rep


def test_accelerate_offload_trains_as_accelerate_does_and_resumes(tmp_path):
    plain_losses, plain_params, _ = accelerate_run(tmp_path, False, save=tmp_path / "plain")
    losses, got, rep = accelerate_run(tmp_path, True, save=tmp_path / "teraio")
    assert losses == plain_losses
    assert_same_params(got, plain_params)
    # 16 micro-batches, 2 per optimizer step: 8 steps of the session, 2 profiled
    assert rep["steps"] == 8 and rep["profiled_iterations"] == 2, rep
    assert_offloaded(rep)
    half = 8
    r_losses, r_params, r_rep = accelerate_run(tmp_path, True, load=tmp_path / "teraio", skip=half)
    p_losses, p_params, _ = accelerate_run(tmp_path, False, load=tmp_path / "plain", skip=half)
    assert r_losses == p_losses and len(r_losses) == half
    assert_same_params(r_params, p_params)
    assert r_rep["steps"] == half // 2, r_rep


def test_accelerate_offload_refuses_other_engines(tmp_path):
    import teraio.torch.accelerate

    class Fake:
        class distributed_type:
            name = "DEEPSPEED"

        def accumulate(self, *models):
            raise AssertionError("not reached")

        unwrap_model = accumulate
    with pytest.raises(ValueError, match="Accelerate runs DEEPSPEED"):
        teraio.torch.accelerate.offload(Fake(), gpt2(), None, capacity=0.5, ssd=str(tmp_path))
    from accelerate import Accelerator
    acc = Accelerator(cpu=True, dynamo_backend="inductor")
    model = acc.prepare(gpt2())
    with pytest.raises(ValueError, match="Accelerate compiles the model .*inductor.*compile=True"):
        teraio.torch.accelerate.offload(acc, model, None, capacity=0.5, ssd=str(tmp_path))


def test_bytes_and_shares_parse_as_offload_takes_them():
    assert _config.parse_capacity("0.5") == 0.5 and _config.parse_capacity(".25") == 0.25
    assert _config.parse_capacity("1.0") == 1.0 and _config.parse_capacity("1") == 1  # an int is bytes
    assert _config.parse_capacity("1.5GB") == 1_500_000_000 and _config.parse_capacity("2KiB") == 2048
    for bad in ("0", "0.0", "-1", "1e9", "5 apples", ""):
        with pytest.raises(ValueError, match="TERAIO_CAPACITY="):
            _config.parse_capacity(bad)


def test_accumulate_misuse_is_named_and_never_hides_the_error(tmp_path):
    """Breaker findings: a nested accumulate(), and close() inside the block
    (with or without an exception), gave AttributeError and hid the user's."""
    from accelerate import Accelerator

    import teraio.torch.accelerate
    acc = Accelerator(cpu=True, gradient_accumulation_steps=1)
    model = gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    x = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    off = teraio.torch.accelerate.offload(acc, model, opt, capacity=0.8, ssd=str(tmp_path))
    with pytest.raises(RuntimeError, match=r"accumulate\(\) is already running"):
        with off.accumulate(model):
            with off.accumulate(model):
                pass
    with pytest.raises(KeyError, match="mine"):
        with off.accumulate(model):
            acc.backward(model(input_ids=x, labels=x).loss)
            off.close()
            raise KeyError("mine")
    with pytest.raises(RuntimeError, match="closed; make a new one"):
        with off.accumulate(model):
            pass
    with pytest.raises(TypeError, match="accelerator must be an accelerate.Accelerator"):
        teraio.torch.accelerate.offload(None, model, opt, capacity=0.5, ssd=str(tmp_path))
    with pytest.raises(TypeError, match="model must be the torch.nn.Module"):
        teraio.torch.accelerate.offload(acc, "model", opt, capacity=0.5, ssd=str(tmp_path))


def test_callback_close_from_another_thread_keeps_the_session(tmp_path):
    import threading

    from teraio.torch.trainer import OffloadCallback
    cb = OffloadCallback(capacity=0.8, ssd=str(tmp_path))
    model = gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cb.on_train_begin(None, None, None, model=model, optimizer=opt)
    cb.on_step_begin(None, None, None)   # a step the Trainer never ended
    errors = []

    def close():
        try:
            cb.close()
        except RuntimeError as e:
            errors.append(str(e))
    t = threading.Thread(target=close)
    t.start()
    t.join()
    assert errors and "another thread" in errors[0]
    assert cb.session is not None and cb._step is not None
    cb.close()
    assert cb.session is None and cb.report["steps"] == 0
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    assert not _get_current_dispatch_mode_stack()


def test_the_environment_is_read_exactly(monkeypatch, tmp_path):
    from teraio.torch.trainer import OffloadCallback
    for v in ("TERAIO_CAPACITY", "TERAIO_SSD", "TERAIO_HOST_CAP_BYTES", "TIO_CAPACITY", "TIO_SSD"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("TIO_SSD", str(tmp_path))
    monkeypatch.setenv("TIO_CAPACITY", "half")  # the old prefix: named as it was set
    with pytest.raises(ValueError, match="TIO_CAPACITY='half' is neither"):
        OffloadCallback()
    monkeypatch.delenv("TIO_CAPACITY")
    for bad, says in (("\u0661\u0662\u0663", "is neither"), ("1.0000000000000000001", r"must be in \(0, 1\]"),
                      ("18446744073709551616", "< 2\\^64"), ("0.0001KB", "not a whole number")):
        monkeypatch.setenv("TERAIO_CAPACITY", bad)
        with pytest.raises(ValueError, match=says):
            OffloadCallback()
    monkeypatch.setenv("TERAIO_CAPACITY", "0.5KiB")
    monkeypatch.setenv("TERAIO_HOST_CAP_BYTES", "0")  # no host tier, as in code
    cb = OffloadCallback()
    assert (cb.capacity, cb.options) == (512, {"host_cap_bytes": 0})
    with pytest.raises(ValueError, match="OffloadCallback: capacity as a share of the peak must be in"):
        OffloadCallback(capacity=5.0)
    with pytest.raises(TypeError, match="OffloadCallback: ssd must be a directory"):
        OffloadCallback(ssd=5)
