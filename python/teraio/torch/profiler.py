"""teraio.torch.Profiler: record one training iteration as a teraio trace.

A TorchDispatchMode sees every aten operator of the eager program — forward,
backward (autograd runs its kernels on the calling thread with the mode
active) and the optimizer step.  For each operator (a *kernel*) it records the
tensors (storages) it reads and writes and its measured wall time.  An
intermediate tensor first used while gradient mode is on (the forward pass)
and used again later with it off (the backward pass) is an activation; other
intermediates are temporaries.  (Saved-tensor hooks would name activations
exactly, but installing them changes the operator sequence autograd runs, so
the trace would no longer match un-hooked iterations.)

It also records when each intermediate storage is really freed: a Python
variable, autograd (until its backward node has run) or the caller (the
input batch, the loss) often holds a tensor well past its last access.  The
trace's free records (docs/formats.md) carry that, so the memory curve the
planner works from counts what OffloadRuntime will count at each kernel.

Usage::

    prof = Profiler(model, optimizer)
    for step in range(2):
        with prof.iteration():
            train_step()
    prof.save("build/trace.tio")        # the last profiled iteration

The trace is built and written by libteraio (docs/formats.md).
"""
from __future__ import annotations

import contextlib
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..core import READ, WRITE, Trace
from ._ids import StorageIds, global_tensors, iter_tensors
from .pager import new_output_bytes

# Operators that are bookkeeping, not kernels.
SKIP_NAMESPACES = ("profiler.",)


_names: dict = {}


def kernel_name(func) -> str | None:
    """The kernel name of an operator ("aten.mm.default"), None for
    bookkeeping operators that are not kernels; cached per operator."""
    try:
        return _names[func]
    except KeyError:
        name = str(func)
        _names[func] = None if name.startswith(SKIP_NAMESPACES) else name
        return _names[func]


class _Recorder(TorchDispatchMode):
    def __init__(self, prof: "Profiler"):
        super().__init__()
        self.prof = prof

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = kernel_name(func)
        if name is None:
            return func(*args, **kwargs)
        p = self.prof
        acc: dict[int, int] = {}
        forward = torch.is_grad_enabled()
        pager = p.pager
        collective = name.startswith("c10d.")
        if pager is not None:
            pager.operator_begin(args, kwargs, collective,
                                 lambda: p._expected_out_bytes(name) or new_output_bytes(func, args, kwargs))
        for t in iter_tensors((args, kwargs)):
            i = p._id_of(t.untyped_storage())
            if i is not None:
                acc[i] = acc.get(i, 0) | READ
        t0 = time.perf_counter_ns()
        out = func(*args, **kwargs)
        dur = time.perf_counter_ns() - t0
        if p.kernel_time is not None:
            dur = int(p.kernel_time(func, args, kwargs, out))
        sizes = []
        for t in iter_tensors(out):
            st = t.untyped_storage()
            sizes.append((st.nbytes(), t.shape))
            i = p._id_of(st)
            if i is not None:
                acc[i] = acc.get(i, 0) | WRITE
            if pager is not None:
                (pager.pin if collective else pager.track)(st)
        p._kernels.append((name, dur, list(acc.items())))
        p._signature.append((name, tuple(sizes)))
        if forward:
            p._forward_seen.update(i for i in acc if i not in p._forward_seen)
        else:
            p._saved.update(i for i in acc if i in p._forward_seen)
        return out


def sequence_fingerprint(signature: list) -> int:
    """The fingerprint of an iteration's operator sequence: its kernels'
    names and their outputs' storage sizes and shapes, in order.  Two
    iterations with the same fingerprint run the same plan; a batch of
    another size or a new sequence length changes it.  (Python's hash: valid
    within one process, which is where plans are kept.)"""
    return hash(tuple(signature))


class Profiler:
    """Records iterations of a training loop; keeps the last one as the trace."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 name: str | None = None, kernel_time=None, pager=None):
        """`kernel_time(func, args, kwargs, out) -> ns`, if given, replaces the
        measured wall time of each kernel (e.g. a roofline model of a GPU when
        the model runs on the ``meta`` device, where nothing is computed).
        `pager` (a teraio.torch.pager.Pager), if given, keeps the capacity
        while the iterations are profiled: before each kernel it makes room
        for the kernel's outputs (their size at the same kernel of the last
        profiled iteration) and brings back what the kernel reads, and it
        tracks what the kernel makes; kernel times leave its moves out."""
        self.kernel_time = kernel_time
        self.pager = pager
        self._last_signature: list = []
        self.model = model
        self.optimizer = optimizer
        self.name = name or type(model).__name__
        self.iterations = 0
        self._kernels: list = []
        self._tensors: list = []
        self._saved: set[int] = set()
        self._forward_seen: set[int] = set()
        self._ids: StorageIds | None = None
        self._freed: dict[int, int] = {}
        self._signature: list = []
        self.fingerprint: int | None = None

    def _expected_out_bytes(self, name: str) -> int:
        """The bytes kernel k made in the last profiled iteration, where that
        iteration's kernel k had the same name (0 otherwise)."""
        k, last = len(self._kernels), self._last_signature
        if k < len(last) and last[k][0] == name:
            return sum(b for b, _ in last[k][1])
        return 0

    def _id_of(self, st) -> int | None:
        if st.nbytes() == 0:
            return None
        i = self._ids.lookup(st)
        if i is None:
            i = self._ids.assign(st)
            self._tensors.append([st.nbytes(), "temporary", False, None])
        return i

    @contextlib.contextmanager
    def iteration(self):
        """Profile one iteration (forward, backward, optimizer step).  If the
        body raises, the iteration is discarded: the last complete one stays
        the trace."""
        last = (self._ids, self._kernels, self._tensors, self._saved, self._forward_seen,
                self._signature)
        ids = self._ids = StorageIds()
        ids._on_death = lambda i, key: self._died(ids, i)
        self._kernels, self._tensors, self._signature = [], [], []
        self._saved, self._forward_seen = set(), set()
        self._freed = {}
        pager = self.pager
        if pager is not None:
            pager.begin_step()
        for t, kind, name in global_tensors(self.model, self.optimizer):
            st = t.untyped_storage()
            if pager is not None:
                pager.track(st, is_global=True)
            nbytes = pager.nbytes(st) if pager is not None else st.nbytes()
            if nbytes == 0 or self._ids.lookup(st) is not None:
                continue
            self._ids.assign(st)
            self._tensors.append([nbytes, kind, True, name])
        self._ids.n_global = self._ids.next_id
        hooks = self._name_gradients()
        try:
            with _Recorder(self):
                yield self
        except BaseException:
            (self._ids, self._kernels, self._tensors, self._saved, self._forward_seen,
             self._signature) = last
            raise
        finally:
            for h in hooks:
                h.remove()
            if pager is not None:
                pager.end_step([t.untyped_storage() for t, _, _ in global_tensors(self.model, self.optimizer)])
        for i in self._saved:
            if not self._tensors[i][2]:
                self._tensors[i][1] = "activation"
        self._record_frees()
        self._drop_untouched()
        self._last_signature = self._signature
        self.fingerprint = sequence_fingerprint(self._signature)
        self.iterations += 1

    def _name_gradients(self) -> list:
        """A gradient made in the iteration (``zero_grad(set_to_none=True)``,
        as Hugging Face loops call it) is an intermediate of the trace; name
        it after its parameter ("lm_head.weight.grad") when autograd has
        accumulated it, so that the floor's tensors and the plan say whose it
        is.  (A post-accumulate-grad hook runs no operator.)"""
        hooks = []
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            def named(param, name=name):
                for g in iter_tensors(param.grad):   # a DTensor's local shard; nothing for None
                    i = self._ids.lookup(g.untyped_storage())
                    if i is not None and self._ids.n_global <= i < len(self._tensors) \
                            and self._tensors[i][3] is None:
                        self._tensors[i][3] = name + ".grad"
            try:
                hooks.append(p.register_post_accumulate_grad_hook(named))
            except (RuntimeError, TypeError, AttributeError):  # a parameter type without the hook
                pass
        return hooks

    def _died(self, ids: StorageIds, i: int) -> None:
        if ids is self._ids and i >= ids.n_global:
            self._freed[i] = len(self._kernels)

    def _record_frees(self) -> None:
        """Each intermediate's free kernel, where it lies past the kernel
        after its last access: the kernel before which it died (the kernel
        count when it died after the last kernel, inside the step).  A plan
        may move a storage out after its last access for good (a tail
        period, lifetime.h), with two exceptions, which the trace counts as
        accesses instead:

        * a storage still alive when the step ends (the loss, the batch, a
          variable the loop keeps, gradients under ``zero_grad()`` called
          first) is brought back then (tio_runtime_iteration_end), so the
          last kernel accesses it: a plan reads it back in time, and
          nothing is read on demand at the end;
        * a storage a collective touched last is another thread's (gloo's
          worker) until the collective completes, which no later kernel
          shows: every kernel until its free accesses it, so it stays
          resident.
        """
        n = len(self._kernels)
        last = {}
        for k, (_, _, acc) in enumerate(self._kernels):
            for i, _ in acc:
                last[i] = k
        for i, t in enumerate(self._tensors):
            if t[2] or i not in last:
                continue
            freed = self._freed.get(i)
            if freed is None:   # alive at the end of the step
                if last[i] < n - 1:
                    self._kernels[n - 1][2].append((i, READ))
                continue
            if freed <= last[i] + 1:
                continue
            t.append(freed)
            if self._kernels[last[i]][0].startswith("c10d."):
                for k in range(last[i] + 1, freed):
                    self._kernels[k][2].append((i, READ))

    def _drop_untouched(self) -> None:
        """A trace holds only tensors its kernels access, so a global tensor
        the iteration never touched (an unused parameter or buffer, and its
        optimizer state) is dropped and the others are numbered densely, in
        the same order.  OffloadRuntime finds global tensors by name, so it
        leaves the dropped ones where they are."""
        used = set()
        for _, _, acc in self._kernels:
            used.update(i for i, _ in acc)
        if len(used) == len(self._tensors):
            return
        new_id = {}
        kept = []
        for i, t in enumerate(self._tensors):
            if i in used:
                new_id[i] = len(kept)
                kept.append(t)
        self._tensors = kept
        self._kernels = [(n, d, [(new_id[i], m) for i, m in acc]) for n, d, acc in self._kernels]

    @property
    def n_kernels(self) -> int:
        return len(self._kernels)

    def records(self) -> tuple[list, list]:
        """The last profiled iteration as plain data, for post-processing
        before Trace.build: tensors as (bytes, kind, global, name) tuples and
        kernels as (name, duration_ns, [(tensor_id, mode), ...]) tuples (the
        lists are copies).  The free kernels are left out: a post-processing
        that drops kernels would have to renumber them."""
        return [tuple(t[:4]) for t in self._tensors], [(n, d, list(a)) for n, d, a in self._kernels]

    def trace(self) -> Trace:
        """The last profiled iteration as a libteraio trace."""
        if not self._kernels:
            raise RuntimeError("Profiler: no iteration recorded yet")
        return Trace.build(self.name, [tuple(t) for t in self._tensors], self._kernels)

    def save(self, path: str) -> Trace:
        tr = self.trace()
        tr.save(path)
        return tr
