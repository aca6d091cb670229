"""teraio for Hugging Face Accelerate: offload what ``Accelerator.prepare``
returned, and swap ``accelerator.accumulate`` for ``off.accumulate``.

    model, optimizer, data, scheduler = accelerator.prepare(model, optimizer, data, scheduler)
    off = teraio.torch.accelerate.offload(accelerator, model, optimizer, capacity=0.5,
                                          ssd="/mnt/nvme0/teraio")
    for batch in data:
        with off.accumulate(model):          # was: accelerator.accumulate(model)
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step(); scheduler.step(); optimizer.zero_grad()
    off.close()

``off.accumulate(model)`` is ``accelerator.accumulate(model)`` inside one
step of the session that spans a whole gradient accumulation: the step
opens at the first micro-batch and ends after the micro-batch at which
Accelerate synchronizes the gradients (``accelerator.sync_gradients``: the
one whose ``optimizer.step()`` really steps), so each planned step is one
optimizer step, as under the Trainer (teraio.torch.trainer).  A loop that
writes its own steps uses ``with off.step():`` around them instead.

``capacity``, ``ssd`` and ``compile`` None take ``TERAIO_CAPACITY``,
``TERAIO_SSD`` and ``TERAIO_COMPILE`` (teraio.torch._config).  Refused:
Accelerate's DeepSpeed, FSDP and Megatron-LM modes (their engines own the
parameters) and its dynamo backend (``compile=True`` compiles with teraio's
backend instead).  Between steps, ``accelerator.save_state``/``load_state`` and
evaluation see true values (the session's guard and ``state_dict()``
hooks).  Everything else is the Session's (:meth:`report`, :meth:`close`,
:meth:`fetch_all`, :meth:`reading`, :meth:`step`).
"""
from __future__ import annotations

import contextlib

import torch

from . import offload as _offload
from ._config import inner_optimizer as _inner_optimizer, resolve
from .session import Session

_REFUSED = ("DEEPSPEED", "FSDP", "MEGATRON_LM", "XLA")


class AcceleratedOffload:
    """A :class:`~teraio.torch.session.Session` with :meth:`accumulate`
    (module text); the session's methods and properties pass through."""

    def __init__(self, accelerator, session: Session):
        self.accelerator = accelerator
        self.session = session
        self._step = None
        self._in_block = False

    def __getattr__(self, name):
        if name in ("session", "accelerator", "_step", "_in_block"):
            raise AttributeError(name)
        return getattr(self.session, name)

    @contextlib.contextmanager
    def accumulate(self, *models):
        """``accelerator.accumulate(*models)`` inside the session's step of
        this gradient accumulation (module text).  Raises RuntimeError when
        nested in another accumulate() or after close()."""
        if self._in_block:
            raise RuntimeError("teraio.torch.accelerate: accumulate() is already running (nested)")
        self.session._check()
        with self.accelerator.accumulate(*models):
            if self._step is None:
                step = self.session.step()
                step.__enter__()
                self._step = step
            self._in_block = True
            try:
                yield self
            except BaseException as e:
                self._in_block = False
                self._end(type(e), e, e.__traceback__)
                raise
            self._in_block = False
        if self.accelerator.sync_gradients or self.session._closed:
            self._end(None, None, None)

    def _end(self, *exc) -> None:
        """End the open step, if close() inside the block has not already."""
        step, self._step = self._step, None
        if step is not None and not self.session._closed:
            step.__exit__(*exc)

    def close(self) -> None:
        """End an open accumulation (as failed: its optimizer step never came)
        and close the session."""
        self.session._check_thread()
        if self._step is not None:
            err = RuntimeError("closed inside a gradient accumulation")
            self._end(RuntimeError, err, None)
        self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def offload(accelerator, model, optimizer, capacity=None, ssd=None, *, compile=None,
            **options) -> AcceleratedOffload:
    """Offload the `model` and `optimizer` that ``accelerator.prepare``
    returned (its wrappers are taken off: DDP's module, AcceleratedOptimizer's
    optimizer) with :func:`teraio.torch.offload`'s arguments and options (None:
    from the environment).  Raises ValueError for Accelerate's DeepSpeed, FSDP,
    Megatron-LM and XLA modes and for a model Accelerate compiles (its dynamo
    backend: use ``compile=True`` instead), and offload()'s errors."""
    if not hasattr(accelerator, "accumulate") or not hasattr(accelerator, "unwrap_model"):
        raise TypeError(f"teraio.torch.accelerate.offload: accelerator must be an accelerate.Accelerator, "
                        f"got {type(accelerator).__name__}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"teraio.torch.accelerate.offload: model must be the torch.nn.Module "
                        f"accelerator.prepare returned, got {type(model).__name__}")
    kind = getattr(getattr(accelerator, "distributed_type", None), "name", None)
    if kind in _REFUSED:
        raise ValueError(f"teraio.torch.accelerate.offload: Accelerate runs {kind}; teraio does not offload "
                         f"under another engine that owns the parameters")
    dynamo = getattr(getattr(getattr(getattr(accelerator, "state", None), "dynamo_plugin", None), "backend", None),
                     "name", "NO")
    if dynamo != "NO" or isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        raise ValueError(f"teraio.torch.accelerate.offload: Accelerate compiles the model (dynamo backend "
                         f"{dynamo.lower()}), and an eager session cannot see inside Inductor's kernels; leave "
                         f"Accelerate's dynamo backend off (ACCELERATE_DYNAMO_BACKEND=no) and pass compile=True "
                         f"(or TERAIO_COMPILE=1), which compiles with teraio's backend")
    capacity, ssd, compile, options = resolve(capacity, ssd, compile, options,
                                              who="teraio.torch.accelerate.offload")
    inner = accelerator.unwrap_model(model)
    session = _offload(inner, _inner_optimizer(optimizer), capacity, ssd, compile=compile, **options)
    return AcceleratedOffload(accelerator, session)
