"""teraio.torch.pager: PyTorch storages under libteraio's pager (pager.h).

The profiled steps of a session must keep the capacity too: offloading is
for the job that does not fit.  The profiler (teraio.torch.profiler) tells
the pager, operator by operator, which storages the operator reads and
which it makes; the pager (C) keeps the resident bytes within the capacity
by evicting the least recently used storages the operator does not use, and
brings one back when an operator uses it.  Memory moves only through two
callbacks, as in the runtime: ``storage.resize_(0)`` after the bytes are on
SSD, ``storage.resize_(nbytes)`` before they are read back, so every view,
parameter, gradient, optimizer state and saved activation keeps pointing at
the same storage.

Between steps an evicted storage is fetched before an operator reads it (a
dispatch mode, as the runtime's guard), and ``state_dict()`` of the model
and the optimizer fetch everything first.  At the end of a profiled step
every intermediate storage still alive (the loss, the input batch, what the
program keeps) is brought back and forgotten: the program owns it.  When the
first plan is made, the global tensors are handed over to the plan's runtime
(:meth:`Pager.detach`): an evicted one keeps its stored copy, so the
hand-over needs no memory.

A pager is driven from the thread that created it.
"""
from __future__ import annotations

import ctypes
import weakref

import torch

from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode, _push_mode

from .. import _lib as L
from ..core import Engine
from ._ids import FetchGuard, Hook, global_tensors, guard_would_be_popped, in_reading, iter_tensors


# Counters of tio_pager_stats that are the largest over pagers, not summed; the
# others listed in PagerStats add up (resident and tracked bytes describe one pager's
# present and are not added).
_MAXES = ("capacity_bytes", "peak_resident_bytes", "peak_tracked_bytes", "over_capacity_bytes_max",
          "peak_process_rss_bytes")
_PRESENT = ("resident_bytes", "tracked_bytes")


_no_new_outputs: dict = {}   # operator -> True when every return aliases an input


def _meta(x):
    """A meta tensor of x's shape, strides and dtype (x itself otherwise)."""
    if isinstance(x, torch.Tensor):
        if type(x) is not torch.Tensor and type(x) is not torch.nn.Parameter:
            raise TypeError("a tensor subclass")  # no meta twin: no estimate
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_meta(y) for y in x)
    if isinstance(x, dict):
        return {k: _meta(v) for k, v in x.items()}
    return x


_out_bytes_cache: dict = {}   # (operator, the arguments' shapes, strides, dtypes and values) -> bytes
_CACHE_MAX = 8192


def _key(x):
    """A hashable stand-in for an argument: a tensor's shape, strides and
    dtype (what a meta kernel's outputs depend on), a scalar itself."""
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.stride(), x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(_key(y) for y in x)
    if isinstance(x, dict):
        return tuple((k, _key(v)) for k, v in x.items())
    if x is None or isinstance(x, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                   torch.memory_format)):
        return x
    raise TypeError("no key")


def new_output_bytes(func, args, kwargs) -> int:
    """:func:`meta_output_bytes`, remembered per operator and argument
    shapes (a meta kernel costs up to a millisecond; a step repeats its
    shapes layer after layer)."""
    try:
        key = (func, _key(args), _key(kwargs))
    except TypeError:
        return meta_output_bytes(func, args, kwargs)
    n = _out_bytes_cache.get(key)
    if n is None:
        n = meta_output_bytes(func, args, kwargs)
        if len(_out_bytes_cache) >= _CACHE_MAX:
            _out_bytes_cache.clear()
        _out_bytes_cache[key] = n
    return n


def meta_output_bytes(func, args, kwargs) -> int:
    """The bytes of the new storages operator `func` allocates for its outputs
    (those its schema does not declare aliases of an input), from its meta
    kernel run on meta twins of the arguments: what the pager reserves before
    the kernel runs, so that its outputs do not land on top of the capacity.
    0 where it cannot tell (no meta kernel, an output whose size depends on
    the data, a tensor subclass).  Meta kernels move no data and draw no
    random numbers."""
    alias_only = _no_new_outputs.get(func)
    if alias_only is None:
        try:
            alias_only = all(r.alias_info is not None for r in func._schema.returns)
        except AttributeError:
            alias_only = False
        _no_new_outputs[func] = alias_only
    if alias_only:
        return 0
    try:
        margs, mkwargs = _meta(args), _meta(kwargs)
        if next(iter_tensors((args, kwargs)), None) is None:
            # A factory (randn, full, arange): nothing makes it meta but its device, and run
            # for real it would draw the program's random numbers (the breaker's case: the
            # first profiled step's randn gave other values than the plain run's).
            if not any(a.name == "device" for a in func._schema.arguments):
                return 0
            mkwargs = {k: v for k, v in mkwargs.items() if k != "generator"}
            mkwargs["device"] = "meta"
        out = func(*margs, **mkwargs)
    except Exception:  # noqa: BLE001 (no meta kernel, a data-dependent shape, ...)
        return 0
    returns = func._schema.returns
    outs = out if isinstance(out, (tuple, list)) and len(returns) > 1 else (out,)
    total = 0
    for r, o in zip(returns, outs):
        if r.alias_info is None:
            for t in (o if isinstance(o, (tuple, list)) else (o,)):
                if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                    total += t.untyped_storage().nbytes()
    return total


def why_no_pager(model, optimizer) -> str | None:
    """Why the profiled steps cannot keep the capacity with a pager (None:
    they can): the pager moves CPU memory only."""
    devices = {t.device.type for t, _, _ in global_tensors(model, optimizer)}
    if devices - {"cpu"}:
        return f"tensors on {', '.join(sorted(devices - {'cpu'}))}: the pager moves CPU memory only"
    return None


def add_stats(total: dict | None, stats: dict) -> dict:
    """`stats` (Pager.stats()) added to `total` (a copy, None: nothing yet):
    counts summed, peaks the largest."""
    if total is None:
        return dict(stats)
    out = dict(total)
    for k, v in stats.items():
        if k in _MAXES:
            out[k] = max(out[k], v)
        elif k not in _PRESENT:
            out[k] += v
    return out


class Pager:
    """Storages tracked by one C pager over `engine`, for `capacity_bytes`
    or a share of the largest tracked bytes seen (pager.h)."""

    def __init__(self, engine: Engine, capacity_bytes: int = 0, capacity_share: float = 0.0, model=None,
                 optimizer=None):
        self.engine = engine
        self.in_step = False
        self._slot: dict[int, int] = {}                  # storage key -> slot
        self._storage: dict[int, weakref.ref] = {}       # slot -> storage
        self._bytes: dict[int, int] = {}                 # slot -> bytes when tracked
        self._global: set[int] = set()                   # slots of global tensors
        self._dead: list[int] = []                       # slots whose storage died
        self._pinned: set[int] = set()                   # slots of collectives' buffers (pin)
        self._addr: dict[int, int | None] = {}           # slot -> data_ptr while resident
        self._alloc_cb = L.ALLOCATE_FN(L.callback(self._allocate))
        self._release_cb = L.RELEASE_FN(L.callback(self._release))
        self._check_cb = L.CHECK_FN(L.callback(self._check))
        self._cbs = L.PagerCallbacks(None, self._alloc_cb, self._release_cb, self._check_cb)
        self._p = ctypes.c_void_p()
        L.check(L.tio_pager_create(engine._p, capacity_bytes, capacity_share, ctypes.byref(self._cbs),
                                   ctypes.byref(self._p)))
        self._guard = FetchGuard(self._guard_fetch)
        self._guard_pushed = False
        self._hooks = []
        for obj in (model, optimizer):
            if obj is not None:
                self._hooks.append(obj.register_state_dict_pre_hook(Hook(self.fetch_all)))

    # -- callbacks ------------------------------------------------------------
    def _allocate(self, ctx, slot, nbytes, addr):
        ref = self._storage.get(slot)
        st = ref() if ref else None
        if st is None:
            return -2  # -ENOENT
        try:
            st.resize_(nbytes)
        except RuntimeError:
            return -12  # -ENOMEM
        addr[0] = self._addr[slot] = st.data_ptr()
        return 0

    def _release(self, ctx, slot):
        ref = self._storage.get(slot)
        st = ref() if ref else None
        if st is not None:
            try:
                st.resize_(0)
            except RuntimeError:
                return -1
        return 0

    def _check(self, ctx, slot, addr, nbytes):
        """Before an eviction: is `slot`'s storage still `nbytes` at `addr`?
        A program can resize a storage without an operator the profiler
        sees (FSDP2 frees its unsharded parameters with
        ``untyped_storage().resize_(0)`` and brings them back the same way):
        writing the old bytes would read freed memory.  Then the slot is
        forgotten here (the pager forgets it in C) and the storage is
        tracked anew at its next use."""
        ref = self._storage.get(slot)
        st = ref() if ref else None
        if st is not None and st.nbytes() == nbytes and st.data_ptr() == addr:
            return 0
        if st is not None and self._slot.get(st._cdata) == slot:
            del self._slot[st._cdata]
        self._drop(slot)
        if slot in self._dead:
            self._dead.remove(slot)
        return 1

    def _drop(self, slot: int) -> None:
        """Forget what this side keeps of `slot` (the C pager's is the caller's)."""
        for d in (self._storage, self._bytes, self._addr):
            d.pop(slot, None)
        self._global.discard(slot)
        self._pinned.discard(slot)

    # -- tracking ---------------------------------------------------------------
    def _died(self, key: int, slot: int) -> None:
        if self._slot.get(key) == slot:
            del self._slot[key]
            self._dead.append(slot)

    def drain(self) -> None:
        """Forget the storages that died since the last call (finalizers run
        anywhere; the pager is told on its own thread)."""
        while self._dead:
            slot = self._dead.pop()
            self._drop(slot)
            L.check(L.tio_pager_forget(self._p, slot))

    def _resized(self, st, slot: int) -> bool:
        """Has the program resized tracked storage `st` since (``resize_``,
        ``set_``: other bytes, mostly at another address)?  Evicting it by
        the old count would write freed memory and bring back too few bytes."""
        return ((st.nbytes() != self._bytes.get(slot) or st.data_ptr() != self._addr.get(slot))
                and L.tio_pager_is_resident(self._p, slot))  # an evicted one has no bytes

    def _retrack(self, st, slot: int) -> int | None:
        """Forget `slot` and track `st` as it is now."""
        is_global, pinned = slot in self._global, slot in self._pinned
        del self._slot[st._cdata]
        self._drop(slot)
        L.check(L.tio_pager_forget(self._p, slot))
        if pinned:
            self.pin(st)
            return self._slot.get(st._cdata)
        return self.track(st, is_global)

    def track(self, st, is_global: bool = False) -> int | None:
        """Track storage `st` (resident) unless it is; its slot."""
        key = st._cdata
        slot = self._slot.get(key)
        if slot is not None:
            return self._retrack(st, slot) if self._resized(st, slot) else slot
        nbytes = st.nbytes()
        if not nbytes:
            return None
        s = ctypes.c_uint32()
        rc = L.tio_pager_track(self._p, st.data_ptr(), nbytes, st.resizable(), ctypes.byref(s))
        self._remember(st, s.value, nbytes, is_global)
        L.check(rc)
        return s.value

    def _remember(self, st, slot: int, nbytes: int, is_global: bool) -> None:
        """Storage `st` is tracked in `slot` (forgotten when it dies)."""
        key = st._cdata
        self._slot[key] = slot
        self._pinned.discard(slot)  # a slot handed out again
        self._storage[slot] = weakref.ref(st)
        self._bytes[slot] = nbytes
        self._addr[slot] = st.data_ptr() if st.nbytes() else None
        if is_global:
            self._global.add(slot)
        weakref.finalize(st, self._died, key, slot)

    def track_stored(self, st, nbytes: int, extent, is_global: bool = False) -> int:
        """Track storage `st`, whose memory is released and whose bytes are
        in `extent` of the engine (a tensor the plan's runtime offloaded;
        the pager owns the extent now); its slot."""
        s = ctypes.c_uint32()
        rc = L.tio_pager_track_stored(self._p, nbytes, ctypes.byref(extent), ctypes.byref(s))
        if rc < 0:
            L.tio_engine_free(self.engine._p, ctypes.byref(extent))
            L.check(rc)
        self._remember(st, s.value, nbytes, is_global)
        return s.value

    def pin(self, st) -> None:
        """Storage `st` is a collective's buffer: another thread (gloo's,
        NCCL's stream) reads or writes it until the collective completes,
        which this thread does not see, so it is never evicted while it
        lives (tracked as not movable; end_step forgets it as any other)."""
        key = st._cdata
        slot = self._slot.get(key)
        if not st.nbytes():
            if slot is None or L.tio_pager_is_resident(self._p, slot):
                return
            # evicted: the collective needs its bytes (it ran on freed memory: gloo's
            # "writev: Bad address" in the breaker's 2-rank job)
            L.check(L.tio_pager_use(self._p, slot, None))
        if slot is not None and slot in self._pinned:
            return
        if slot is not None:
            L.check(L.tio_pager_use(self._p, slot, None))   # resident, with its bytes
            del self._slot[key]
            is_global = slot in self._global
            self._drop(slot)
            L.check(L.tio_pager_forget(self._p, slot))
        else:
            is_global = False
        s = ctypes.c_uint32()
        rc = L.tio_pager_track(self._p, st.data_ptr(), st.nbytes(), False, ctypes.byref(s))
        self._remember(st, s.value, st.nbytes(), is_global)
        self._pinned.add(s.value)
        L.check(rc)

    def slot(self, st) -> int | None:
        """The slot of tracked storage `st` (None: not tracked)."""
        return self._slot.get(st._cdata)

    def reserve(self, nbytes: int) -> None:
        """Evict until the capacity holds `nbytes` more: what the current
        kernel is about to allocate (what it uses stays)."""
        L.check(L.tio_pager_reserve(self._p, nbytes))

    def nbytes(self, st) -> int:
        """`st`'s bytes, evicted or not."""
        slot = self._slot.get(st._cdata)
        return self._bytes[slot] if slot is not None else st.nbytes()

    def use(self, st) -> None:
        """The operator about to run reads storage `st`."""
        slot = self._slot.get(st._cdata)
        if slot is None or self._resized(st, slot):
            self.track(st)
        else:
            L.check(L.tio_pager_use(self._p, slot, None))

    def _guard_fetch(self, st) -> None:
        if self._p and not self.in_step:
            self.fetch(st)

    def fetch(self, st) -> None:
        """Bring `st` back if it is evicted (outside a step: no capacity, not
        counted as a kernel's)."""
        slot = self._slot.get(st._cdata)
        if slot is not None and not L.tio_pager_is_resident(self._p, slot):
            L.check(L.tio_pager_fetch(self._p, slot))

    def operator_begin(self, args, kwargs, collective: bool, out_bytes) -> None:
        """Before an operator of a step this pager keeps: what it reads is
        brought back, then room is made for what it will make
        (`out_bytes()`, bytes).  A collective's (`collective`) buffers are
        pinned instead: another thread (gloo's worker) reads and writes them
        until it completes, which no later operator shows."""
        self.kernel_begin()
        for t in iter_tensors((args, kwargs)):
            (self.pin if collective else self.use)(t.untyped_storage())
        if not collective:
            self.reserve(out_bytes())

    def operator_end(self, out, collective: bool) -> None:
        """After it: what it made is tracked (a collective's pinned)."""
        for t in iter_tensors(out):
            (self.pin if collective else self.track)(t.untyped_storage())

    def kernel_begin(self, reserve_bytes: int = 0) -> None:
        self.drain()
        L.check(L.tio_pager_kernel_begin(self._p))
        if reserve_bytes:
            L.check(L.tio_pager_reserve(self._p, reserve_bytes))

    def set_capacity(self, capacity_bytes: int, capacity_share: float = 0.0) -> None:
        L.check(L.tio_pager_set_capacity(self._p, capacity_bytes, capacity_share))

    def end_step(self, global_storages=(), guard: bool = True) -> None:
        """The step is over: `global_storages` (parameters, gradients,
        optimizer state, some of them made in this step) stay where they are,
        and the guard fetches them for operators between steps (unless
        `guard` is false: their next owner takes them over now); every other
        storage still alive comes back and is forgotten (the program owns it)."""
        self.drain()
        for st in global_storages:
            slot = self._slot.get(st._cdata)
            if slot is not None:
                self._global.add(slot)
        for key, slot in list(self._slot.items()):
            if slot in self._global:
                continue
            if not L.tio_pager_is_resident(self._p, slot):
                L.check(L.tio_pager_use(self._p, slot, None))
            del self._slot[key]
            self._storage.pop(slot, None)
            self._bytes.pop(slot, None)
            L.check(L.tio_pager_forget(self._p, slot))
        self.in_step = False
        if guard:
            self._guard_on()

    def begin_step(self) -> None:
        self._guard_off()
        self.in_step = True

    def _guard_on(self) -> None:
        if self._guard_pushed or all(L.tio_pager_is_resident(self._p, s) for s in self._storage):
            return
        if guard_would_be_popped():
            self.fetch_all()
            return
        _push_mode(self._guard)
        self._guard_pushed = True

    def _guard_off(self) -> None:
        if self._guard_pushed and _get_current_dispatch_mode() is self._guard:
            _pop_mode()
            self._guard_pushed = False

    def fetch_all(self) -> None:
        """Bring every evicted storage back (the dead ones are forgotten first;
        nothing to do in another thread's Session.reading())."""
        if self._p and not in_reading():
            self.drain()
            L.check(L.tio_pager_fetch_all(self._p))

    def detach(self, st):
        """Hand storage `st` over: None if the pager does not track it, else
        (resident, extent) with extent the engine space holding its bytes
        when it is evicted (the caller owns it)."""
        slot = self._slot.pop(st._cdata, None)
        if slot is None:
            return None
        resident, ext = ctypes.c_bool(), L.Extent()
        L.check(L.tio_pager_detach(self._p, slot, ctypes.byref(resident), ctypes.byref(ext)))
        self._storage.pop(slot, None)
        self._bytes.pop(slot, None)
        self._global.discard(slot)
        return bool(resident.value), ext

    def stats(self) -> dict:
        s = L.PagerStats()
        L.tio_pager_get_stats(self._p, ctypes.byref(s))
        return {name: getattr(s, name) for name, _ in L.PagerStats._fields_}

    def close(self) -> None:
        """Bring every evicted storage back and free the pager."""
        if self._p:
            self._guard_off()
            self.drain()
            self.fetch_all()
            for h in self._hooks:
                h.remove()
            L.tio_pager_destroy(self._p)
            self._p = None

    def __del__(self):
        if getattr(self, "_p", None):
            L.tio_pager_destroy(self._p)
            self._p = None
