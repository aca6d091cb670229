"""Stable tensor ids for PyTorch storages, shared by the profiler and the runtime.

A *tensor* in teraio is one storage allocation (views share it).  Ids follow
DESIGN.md: global tensors first (parameters and buffers in
``named_parameters``/``named_buffers`` order, then their gradients, then the
optimizer's state tensors per parameter in sorted key order), then
intermediate tensors in order of first appearance within the iteration
(inputs of a kernel before its outputs, in argument order).  The profiler and
the runtime apply the same rule, so an iteration that repeats the profiled
kernel sequence sees the same ids.

Storages are held weakly; a finalizer reports a storage's death (its
StorageImpl is freed: PyTorch preserves the Python storage object while the
C++ one lives), so an address reused by a later allocation never aliases an
old id.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode


_Tensor = torch.Tensor
_strided = torch.strided

# Set on a thread inside Session.reading(): every tensor is resident and the
# driving thread waits, so the state_dict() hooks of a runtime or a pager
# have nothing to fetch there (and would be refused from another thread).
_reading = threading.local()


def in_reading() -> bool:
    """Is this thread inside a session's reading() (another thread's)?"""
    return getattr(_reading, "on", False)


try:
    from torch.distributed.tensor import DTensor as _DTensor
except ImportError:          # a torch without distributed support
    _DTensor = None


def iter_tensors(obj) -> Iterator[torch.Tensor]:
    """Dense tensors with real storage inside an args/kwargs/result structure.

    Operator arguments are tensors, lists/tuples of tensors, dicts (kwargs)
    and scalars; walking them directly is several times faster per operator
    than a general pytree flatten, which matters at thousands of operators
    per iteration."""
    if isinstance(obj, _Tensor):
        if type(obj) is _DTensor:
            obj = obj._local_tensor
        if obj.layout == _strided:
            yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            if isinstance(x, _Tensor):
                if type(x) is _DTensor:
                    x = x._local_tensor
                if x.layout == _strided:
                    yield x
            elif isinstance(x, (list, tuple, dict)):
                yield from iter_tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from iter_tensors(x)


def global_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None):
    """(tensor, kind, name) for every global tensor, in id order; of a DTensor
    (FSDP2's sharded parameters, their gradients and optimizer state) its local shard."""
    out = []
    params = list(model.named_parameters())
    for name, p in params:
        out.append((p, "parameter", name))
    for name, b in model.named_buffers():
        out.append((b, "parameter", name))
    for name, p in params:
        if p.grad is not None:
            out.append((p.grad, "gradient", name + ".grad"))
    if optimizer is not None:
        for name, p in params:
            state = optimizer.state.get(p, {})
            for key in sorted(state):
                v = state[key]
                if isinstance(v, torch.Tensor):
                    out.append((v, "optimizer_state", f"{name}.{key}"))
    if _DTensor is not None:
        out = [(t._local_tensor if type(t) is _DTensor else t, kind, name) for t, kind, name in out]
    return out


class StorageIds:
    """Storage -> id map with weak references and death notification."""

    def __init__(self, on_death: Callable[[int, int], None] | None = None):
        self.by_key: dict[int, int] = {}          # storage key -> id
        self.storage: dict[int, weakref.ref] = {}  # id -> storage
        self.key_of: dict[int, int] = {}          # id -> storage key
        self.bytes: dict[int, int] = {}           # id -> bytes at first sight
        self.next_id = 0
        self.n_global = 0
        self._on_death = on_death

    @staticmethod
    def key(st) -> int:
        return st._cdata

    def lookup(self, st) -> int | None:
        return self.by_key.get(st._cdata)

    def assign(self, st, i: int | None = None) -> int:
        """Give `st` id `i`, or the next id."""
        if i is None:
            i = self.next_id
            self.next_id += 1
        key = st._cdata
        self.by_key[key] = i
        self.storage[i] = weakref.ref(st)
        self.key_of[i] = key
        self.bytes[i] = st.nbytes()
        weakref.finalize(st, self._died, key, i)
        return i

    def _died(self, key: int, i: int) -> None:
        if self.by_key.get(key) == i:
            del self.by_key[key]
        if self.key_of.get(i) == key:
            del self.key_of[i]
            self.storage.pop(i, None)
            if self._on_death:
                self._on_death(i, key)

    def start_iteration(self) -> None:
        """Forget intermediate ids (globals keep theirs); numbering restarts
        after the globals."""
        for key, i in list(self.by_key.items()):
            if i >= self.n_global:
                del self.by_key[key]
        self.next_id = self.n_global

    def get(self, i: int):
        ref = self.storage.get(i)
        return ref() if ref else None


class Hook:
    """A hook teraio puts on the user's model or optimizer (state_dict: fetch
    first; load_state_dict: bind the new storages): it calls `method` of a
    live object through a weak reference, and pickles as a hook that does
    nothing, so torch.save(model) or copy.deepcopy(model) works while a
    session drives the model and the copy carries no teraio with it."""

    def __init__(self, method=None):
        self._ref = weakref.WeakMethod(method) if method is not None else None

    def __call__(self, *args):
        fn = self._ref() if self._ref is not None else None
        if fn is not None:
            fn()

    def __reduce__(self):
        return (Hook, ())


class FetchGuard(TorchDispatchMode):
    """Between steps: before any operator runs, `fetch(storage)` is called
    for each storage it reads, so that what teraio moved away (the runtime's
    offloaded tensors, the pager's evicted ones) is back first.  `fetch`
    does nothing for a storage its owner does not hold away, or while a step
    runs."""

    def __init__(self, fetch: Callable):
        super().__init__()
        self.fetch = fetch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in iter_tensors((args, kwargs)):
            self.fetch(t.untyped_storage())
        return func(*args, **kwargs)


_said_foreign_mode = False


def guard_would_be_popped() -> bool:
    """Is a dispatch mode of the program's on top of the mode stack when a
    step ends (the step ran inside the program's ``with mode:``)?  A guard
    pushed above it would be what that mode's exit pops, leaving the
    program's mode on the stack and teraio's gone, with its tensors still
    away (a breaker's segfault).  The caller brings its tensors back
    instead of pushing the guard.  Said once per process."""
    if _get_current_dispatch_mode() is None:
        return False
    global _said_foreign_mode
    if not _said_foreign_mode:
        _said_foreign_mode = True
        import logging
        logging.getLogger("teraio").warning(
            "teraio: a dispatch mode of the program's is active when a step ends: offloaded tensors are "
            "brought back between steps instead of guarded (run the steps outside that mode to keep "
            "them away)")
    return True
