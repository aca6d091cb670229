"""teraio for Hugging Face's ``Trainer``: one callback.

    from teraio.torch.trainer import OffloadCallback
    trainer = Trainer(model, args, train_dataset=ds,
                      callbacks=[OffloadCallback(capacity=0.5, ssd="/mnt/nvme0/teraio")])
    trainer.train()

or, with the settings in the environment (``TERAIO_CAPACITY=0.5
TERAIO_SSD=/mnt/nvme0/teraio``; teraio.torch._config lists them),
``callbacks=[OffloadCallback()]``.

What it does, hook by hook (transformers' Trainer calls them in this order):

* ``on_train_begin``: :func:`teraio.torch.offload` of the model and the
  optimizer the Trainer made (Accelerate's wrapper taken off), after a
  ``resume_from_checkpoint`` has loaded both;
* ``on_step_begin`` … ``on_step_end``: one step of the session around each
  optimizer step: the forward and backward passes of every micro-batch of a
  gradient accumulation, the clipping, ``optimizer.step()``, the scheduler
  and ``zero_grad()``;
* an evaluation the Trainer runs during training (``eval_strategy``) is a
  step of the session too, from ``on_step_end`` (or ``on_epoch_end``), where
  the Trainer has decided to evaluate, to ``on_evaluate``: it is not the
  training step's sequence, so it leaves the plan and keeps the capacity on
  demand (the session's rule for a step that diverges; an evaluation that
  recurs may get a plan of its own).  An evaluation during the profiled
  steps runs outside a step (a profiled step is the trace of a training
  step), and so does ``trainer.evaluate()`` called outside ``train()``;
  with several evaluation datasets, the first is inside the step;
* between steps the Trainer logs and saves checkpoints; what they read is
  fetched for them (the session's guard and ``state_dict()`` hooks), so they
  see the true values, and the next step puts the tensors back where the
  plan has them;
* ``on_train_end``: :meth:`~teraio.torch.session.Session.close` (every tensor
  back in memory, as the Trainer expects after ``train()``); the report is
  kept in :attr:`OffloadCallback.report` and logged at INFO.

A ``train()`` that raises inside a step leaves that step open; the next
``train()`` (or :meth:`OffloadCallback.close`) ends it as failed and closes
the session before it makes a new one.

The Trainer's default optimizer, ``adamw_torch_fused``, updates every
parameter in one kernel, so that kernel holds the whole model state at
once and no capacity below it can be planned; ``optim="adamw_torch"``
updates one parameter per kernel (the callback warns).

Not covered: DeepSpeed or FSDP under the Trainer (their engines own the
parameters; refused), ``torch_compile=True`` in TrainingArguments (use
``compile=True`` here instead, which compiles with teraio's backend).
"""
from __future__ import annotations

import logging
import os

from transformers import TrainerCallback

from . import offload
from ._config import inner_optimizer as _inner_optimizer, resolve

log = logging.getLogger("teraio")


class OffloadCallback(TrainerCallback):
    """Offload a ``Trainer``'s model and optimizer with teraio (module text).

    ``capacity``, ``ssd`` and ``compile`` as :func:`teraio.torch.offload`'s;
    None takes ``TERAIO_CAPACITY`` (else 0.5), ``TERAIO_SSD`` (required one
    way or the other) and ``TERAIO_COMPILE``.  Other keyword arguments are
    offload()'s options.  Raises ValueError for a setting that does not
    parse, naming it; offload()'s own errors come from ``on_train_begin``."""

    def __init__(self, capacity=None, ssd=None, *, compile=None, **options):
        self.capacity, self.ssd, self.compile, self.options = resolve(
            capacity, ssd, compile, options, who="teraio.torch.trainer.OffloadCallback")
        self.session = None
        self.report: dict | None = None
        self._step = None
        self._evaluating = False
        self.evaluation_steps = 0     # evaluations run as steps of the session

    # -- the Trainer's hooks ---------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.close()  # the last train()'s session, if it raised before on_train_end
        if model is None or optimizer is None:
            raise RuntimeError("teraio.torch.trainer.OffloadCallback: the Trainer gave no model or optimizer "
                               "at on_train_begin")
        for what in ("deepspeed", "fsdp"):
            if getattr(args, what, None):
                raise ValueError(f"teraio.torch.trainer.OffloadCallback: TrainingArguments.{what} is set; "
                                 f"teraio does not offload under {what}'s engine")
        if getattr(args, "torch_compile", False) or os.environ.get("ACCELERATE_DYNAMO_BACKEND", "no").lower() != "no":
            raise ValueError("teraio.torch.trainer.OffloadCallback: TrainingArguments.torch_compile is set (or "
                             "ACCELERATE_DYNAMO_BACKEND): an eager session cannot see inside Inductor's kernels; "
                             "pass compile=True to the callback (or TERAIO_COMPILE=1) instead")
        optim = str(getattr(getattr(args, "optim", None), "value", getattr(args, "optim", "")))
        if "fused" in optim:
            log.warning("teraio: TrainingArguments(optim=%r) updates every parameter in one kernel, which "
                        "then holds all of them, their gradients and their states at once (the working-set "
                        "floor); optim='adamw_torch' updates one parameter per kernel", optim)
        self.report = None
        self.evaluation_steps = 0
        self.session = offload(model, _inner_optimizer(optimizer), self.capacity, self.ssd,
                               compile=self.compile, **self.options)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.session is None:
            return
        if self._step is not None:  # a step whose end the Trainer never reached
            self._end_step(failed=True)
        self._begin_step(evaluation=False)

    def on_step_end(self, args, state, control, **kwargs):
        if self._step is not None:
            self._end_step(failed=False)
        self._maybe_evaluation_step(control)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._maybe_evaluation_step(control)

    def on_evaluate(self, args, state, control, **kwargs):
        if self._step is not None and self._evaluating:
            self._end_step(failed=False)

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    # -- public -----------------------------------------------------------------
    def close(self) -> None:
        """End an open step (as failed) and close the session, keeping its
        report (idempotent)."""
        if self.session is None:
            return
        self.session._check_thread()  # before anything is touched: the session stays usable
        try:
            if self._step is not None:
                self._end_step(failed=True)
            self.report = self.session.report()
            log.info("teraio: %s", {k: self.report[k] for k in
                                    ("mode", "steps", "planned_iterations", "bytes_offloaded",
                                     "peak_resident_bytes") if k in self.report})
        finally:
            self.session.close()
            self.session = None

    def _begin_step(self, evaluation: bool) -> None:
        step = self.session.step()
        step.__enter__()
        self._step, self._evaluating = step, evaluation
        if evaluation:
            self.evaluation_steps += 1

    def _maybe_evaluation_step(self, control) -> None:
        """The Trainer evaluates next (DefaultFlowCallback, which runs
        before this callback, has decided): the evaluation is one step."""
        if (self.session is not None and self._step is None and getattr(control, "should_evaluate", False)
                and not self.session.profiling):
            self._begin_step(evaluation=True)

    def _end_step(self, failed: bool) -> None:
        step, self._step = self._step, None
        if failed:
            err = RuntimeError("the Trainer left this step without on_step_end")
            step.__exit__(RuntimeError, err, None)
        else:
            step.__exit__(None, None, None)
