"""teraio.torch.OffloadRuntime: execute an offload plan during training.

A TorchDispatchMode reports each aten operator to libteraio's runtime as
kernel k (``tio_runtime_kernel_begin``), which fires the plan's offloads and
prefetches for k.  Memory moves only through two callbacks the runtime calls:

* release(t):  ``storage.resize_(0)`` — the bytes are safely on SSD/host;
               PyTorch's allocator frees the memory.
* allocate(t): ``storage.resize_(nbytes)`` — PyTorch allocates again; the
               runtime then reads the bytes back into ``storage.data_ptr()``.

Views, parameters (``nn.Parameter``), gradients, optimizer states and
autograd's saved activations all keep pointing at the same storage object, so
they see the restored bytes.  Before an operator runs, any input whose storage
is released is fetched urgently (``tio_runtime_ensure_resident``: a stall).

What is bound to a trace id, and when:

* global tensors (parameters, buffers, gradients, optimizer state) by name,
  at creation and again at every iteration start, so a storage the program
  replaced (``optimizer.load_state_dict``, a re-created gradient) is bound
  in place of the dead one;
* every other storage when an operator of the iteration first uses or makes
  it, with the next intermediate id.  The C runtime refuses a tensor whose
  id or size differs from the trace (a smaller last batch, another sequence
  length): it is never moved, and the iteration is counted as diverged;
* nothing intermediate survives the iteration: ``tio_runtime_iteration_end``
  makes every one still alive resident and unbinds it (the user's input
  batch, the loss).

If the operator sequence leaves the profiled one (an eval step, another
sequence length, a plan guessed wrong), the C runtime says so (log) and
stops planned migrations for that iteration.  The rest of the iteration
keeps the capacity on demand: every bound tensor, with its stored copy if it
is offloaded, is handed to a pager (teraio.torch.pager, libteraio's
pager.h), which from then on sees every operator, evicts the least recently
used storages the operator does not use whenever the resident bytes would
exceed the capacity, and fetches what an operator uses.  At the iteration's
end the intermediate storages come back (the program owns them) and the
global tensors return to the runtime where the pager left them: an evicted
one stays on the SSD until the plan wants it.  Without an engine (a plan
with nothing on the SSD) storages made after the divergence are only
counted.

Between iterations (safe mode, the default) a second dispatch mode stays on
the mode stack: any operator touching an offloaded tensor fetches it first
(counted in ``fetches_outside``), and ``state_dict()`` of the model and the
optimizer fetch everything first, so user code never sees a released
(0-byte) storage through PyTorch.  The next iteration puts the tensors back
where the plan has them.  Reading memory without an operator
(``tensor.data.numpy()``, ``data_ptr()``, pickling a whole module) needs
``fetch_all()`` first.

A runtime is driven from the thread that created it; calls from any other
thread raise (the C runtime refuses them too).
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
import weakref

import torch
from torch.utils._python_dispatch import (TorchDispatchMode, _get_current_dispatch_mode,
                                          _pop_mode, _push_mode)

from .. import _lib as L
from .. import gpu as _gpu
from ..core import Engine, Plan, Trace
from ._ids import FetchGuard, Hook, StorageIds, global_tensors, guard_would_be_popped, in_reading, iter_tensors
from .pager import Pager, add_stats, new_output_bytes
from .profiler import kernel_name, sequence_fingerprint

log = logging.getLogger("teraio")

# How long a kernel lets other threads drop storages the trace has freed
# before it (see OffloadRuntime._let_threads_free).  A thread waiting for the
# GIL takes it within one switch; a storage the program really keeps (or a
# reference cycle that only the garbage collector ends) costs one such wait
# in an iteration, and such fruitless waits stop for the rest of an
# iteration once they have taken _YIELD_BUDGET_S.
_YIELD_S = 0.002
_YIELD_BUDGET_S = 0.01


_PAGE = None

# The pager counters of diverged iterations that stats() reports (as paged_<name>);
# the kernels over the capacity and the peaks (_PAGED_MAXES) also join the runtime's own.
_PAGED = ("kernels", "evictions", "bytes_evicted", "fetches", "bytes_fetched", "io_ns",
          "over_capacity_kernels", "peak_resident_bytes", "over_capacity_bytes_max", "peak_process_rss_bytes")
_PAGED_MAXES = ("peak_resident_bytes", "over_capacity_bytes_max", "peak_process_rss_bytes")


def _rss_bytes() -> int:
    """The process's resident set now (Linux /proc/self/statm), 0 if unreadable."""
    global _PAGE
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    if _PAGE is None:
        import os
        _PAGE = os.sysconf("SC_PAGE_SIZE")
    return pages * _PAGE


# Storages whose write is in flight, by storage key: (runtime, tensor id).  A
# program may free a storage's bytes with ``untyped_storage().resize_(0)``,
# which no operator shows (FSDP2 frees its gathered parameters so right after
# their last use); _resize_storage waits for the write first.
_in_flight: dict[int, tuple["OffloadRuntime", int]] = {}
_storage_resize = torch.UntypedStorage.resize_


def _resize_storage(self, size):
    """torch.UntypedStorage.resize_, once a runtime has started a write:
    a storage whose write is in flight is unbound first (which waits for
    the write; it is bound again at its next use at the trace's size), so
    the engine never reads bytes the program has freed."""
    hit = _in_flight.get(self._cdata)
    if hit is not None and size != self.nbytes():
        hit[0]._resized_while_written(hit[1])
    return _storage_resize(self, size)


def _guard_resizes() -> None:
    if torch.UntypedStorage.resize_ is not _resize_storage:
        torch.UntypedStorage.resize_ = _resize_storage


def _yield_gil() -> None:
    """Let a thread waiting for the GIL run."""
    time.sleep(0)


def _log(ctx, level, msg):
    """libteraio's log lines on the "teraio" logger, said as teraio's (Python's
    last-resort handler prints a warning without the logger's name)."""
    text = msg.decode(errors="replace")
    log.log({0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING}.get(level, logging.ERROR), "teraio: %s", text)


_log_cb = L.LOG_FN(L.callback(_log, None))
L.tio_set_log(_log_cb, None, 1)


class _Mode(TorchDispatchMode):
    """Inside an iteration: every operator is a kernel of the plan."""

    def __init__(self, rt: "OffloadRuntime"):
        super().__init__()
        self.rt = rt

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = kernel_name(func)
        if name is None:
            return func(*args, **kwargs)
        rt = self.rt
        if rt._paging is not None:
            return rt._paged_kernel(func, args, kwargs, name)
        if rt._writing:
            rt._settle_writes()
        rt._drain_deaths()
        k = rt.k
        rt.k += 1
        if not rt.diverged:
            held = L.check(L.tio_runtime_held_past_free(rt._p, k, None, 0))
            if held != rt._held_known:
                rt._let_threads_free(k, held)
            if k in rt._offload_at:
                rt._check_offloads(k)
            rc = L.check(L.tio_runtime_kernel_begin(rt._p, k, name.encode()))
            if rt._writing:
                rt._settle_writes(done_by=k)
            if rc == 1:
                rt.diverged = True
                if rt._start_paging():
                    return rt._paged_kernel(func, args, kwargs, name)
        for t in iter_tensors((args, kwargs)):
            rt._use(t.untyped_storage())
        out = func(*args, **kwargs)
        sizes = []
        by_key = rt._ids.by_key
        resized = []
        for t in iter_tensors(out):
            st = t.untyped_storage()
            sizes.append((st.nbytes(), t.shape))
            i = by_key.get(st._cdata)
            if i is None:
                rt._new(st)
            elif i in rt._bound and st.nbytes() != rt._trace_bytes[i]:
                resized.append((i, st))  # resize_ or set_ on a bound storage: other bytes, another address
        rt._signature.append((name, tuple(sizes)))
        for i, st in resized:
            # The C runtime has the old address and size.  Binding the new ones is refused (another
            # size than the trace's): the iteration diverges, and from here the pager moves the
            # storage as it is now.
            if L.check(L.tio_runtime_tensor_bind(rt._p, i, st.data_ptr(), st.nbytes())) == 1 and not rt.diverged:
                rt.diverged = True
                rt._start_paging()
        if rt._curve is not None:
            rt._note_curve()
        return out


def _engine_takes_cuda(engine: Engine) -> bool:
    """Give `engine` the current CUDA device (teraio.gpu.attach), so that it
    moves CUDA storages itself: the C staging ring (pinned once, copies on
    their own streams overlapped with disk I/O) or GPUDirect Storage, ordered
    after the current stream by CUDA events.  False, with the reason logged,
    where teraio cannot use CUDA: the Python staging callbacks (synchronous
    copies through pinned buffers) then move the bytes."""
    if _gpu.reason(engine):
        return True  # attached by an earlier runtime on this engine
    why = _gpu.unavailable_reason()
    for path in ("auto", "staging") if why is None else ():
        try:
            _gpu.attach(engine, torch.cuda.current_device(), path=path)
            log.info("teraio: CUDA tensors move in C: %s", _gpu.reason(engine))
            return True
        except L.TeraioError as e:  # auto refuses an engine that holds data
            why = str(e)
    log.warning("teraio: CUDA tensors go through Python staging copies: %s", why)
    return False


def _trace_globals_by_name(trace: Trace) -> dict[str, int] | None:
    """Trace id of each global tensor by name, or None when some global
    tensor has no name (a trace not made by Profiler): then ids follow
    ``global_tensors`` order.  The profiler leaves out global tensors its
    iteration never touched, so position alone would misnumber the rest."""
    out = {}
    for i in range(trace.n_tensors):
        if not trace.tensor_is_global(i):
            continue
        name = trace.tensor_name(i)
        if name is None or name in out:
            return None
        out[name] = i
    return out


class _EngineHandle:
    """The C engine of a teraio.core.Engine, as the pager takes it (``_p``)."""

    def __init__(self, p):
        self._p = p


class OffloadRuntime:
    """Runs training iterations under an offload plan.

    ``trace``/``plan`` come from :class:`teraio.torch.Profiler` and
    ``teraio.core.Plan.build`` (or files); ``engine`` is a
    :class:`teraio.core.Engine` over the SSD directories.
    """

    guard_class = FetchGuard  # the mode that fetches for operators between iterations

    def __init__(self, model: torch.nn.Module, optimizer, trace: Trace, plan: Plan, engine: Engine | None,
                 staging: bool | None = None, safe: bool = True, pager=None):
        """``staging``: move bytes through host staging buffers (pinned when
        CUDA is available) instead of letting the engine address the
        tensors' memory.  Default: for CUDA tensors, off when the engine can
        take a GPU (teraio.gpu: its C staging ring or GPUDirect Storage),
        else on; on for other devices that are not the CPU.  ``safe``: fetch
        offloaded tensors that operators and ``state_dict()`` use between
        iterations (see the module text); off, touching them there is the
        caller's business (``fetch_all()`` first).  ``pager``: the
        teraio.torch.pager.Pager of the profiled steps, which hands over the
        global tensors it tracks (an evicted one with its stored copy, so it
        stays away until the plan wants it)."""
        self.model, self.optimizer = model, optimizer
        self.trace, self.plan, self.engine = trace, plan, engine
        self._trace_bytes = [trace.tensor_bytes(i) for i in range(trace.n_tensors)]  # read per operator
        # kernel -> (tensor, deadline kernel) of the offloads that start there
        self._offload_at: dict[int, list[tuple[int, int]]] = {}
        for m in plan.migrations():
            if m["kind"] == "offload":
                self._offload_at.setdefault(m["trigger"], []).append((m["tensor"], m["deadline"]))
        # id -> (storage, deadline) of each write in flight: the storage is held until its write
        # is done (see _hold_write)
        self._writing: dict[int, tuple[object, int | None]] = {}
        self._addr: dict[int, int] = {}               # id -> the address the C runtime has
        self._freed_by_program: set[int] = set()      # ids unbound by _check_offloads
        # The C engine, which the C runtime keeps alive (tio_engine_retain) even after the
        # Engine object is closed: the pagers of diverged iterations work over it.
        self._engine_c = _EngineHandle(engine._p) if engine is not None else None
        self.safe = safe
        self.k = 0
        self.diverged = False          # the current (or last) iteration left the trace
        self.fingerprint: int | None = None  # of the last iteration's operator sequence
        self._thread = threading.get_ident()
        self._in_iteration = False
        self._released: set[int] = set()
        self._deaths: list[tuple[int, int]] = []
        self._bound: dict[int, tuple[int, weakref.ref]] = {}  # id -> (storage key, storage)
        self._untracked: dict[int, int] = {}      # storage key -> bytes (see _account)
        self._untracked_refs: dict[int, weakref.ref] = {}  # storage key -> storage
        self._paging: Pager | None = None  # keeps the capacity for the rest of a diverged iteration
        # The capacity a diverged iteration keeps (bytes; 0: the plan's).  A session whose
        # capacity is a share sets the largest of its plans' (the share of the largest peak known).
        self.paging_capacity = 0
        self._paged: dict | None = None  # the counters of those pagers (teraio.torch.pager.add_stats)
        self._untracked_freed = 0
        self._signature: list = []
        self._held_known = 0
        self._yield_left = _YIELD_BUDGET_S
        self._frees_waited = 0  # kernels that waited for another thread's frees
        self._ids = StorageIds(on_death=lambda i, key: self._deaths.append((i, key)))
        globals_ = global_tensors(model, optimizer)
        devices = {t.device.type for t, _, _ in globals_}
        self._cuda_engine = None  # the engine moves CUDA memory itself (teraio.gpu)
        if staging is None and devices == {"cuda"} and engine is not None and _engine_takes_cuda(engine):
            self._cuda_engine, staging = engine, False
        if staging is None:
            staging = devices != {"cpu"}
        self.staging = staging
        self._stage: dict[int, torch.Tensor] = {}
        self._alloc_cb = L.ALLOCATE_FN(L.callback(self._allocate))
        self._release_cb = L.RELEASE_FN(L.callback(self._release))
        if staging:
            self._stage_out_cb = L.STAGE_FN(L.callback(self._stage_out))
            self._stage_in_cb = L.STAGE_FN(L.callback(self._stage_in))
            self._unstage_cb = L.UNSTAGE_FN(L.callback(self._unstage))
            self._cbs = L.RuntimeCallbacks(None, self._alloc_cb, self._release_cb, self._stage_out_cb,
                                           self._stage_in_cb, self._unstage_cb)
        else:
            self._cbs = L.RuntimeCallbacks(None, self._alloc_cb, self._release_cb)
        self._p = ctypes.c_void_p()
        L.check(L.tio_runtime_create(plan._p, trace._p, engine._p if engine else None,
                                     ctypes.byref(self._cbs), ctypes.byref(self._p)))
        self._by_name = _trace_globals_by_name(trace)
        if self._by_name is None:
            for t, _kind, _name in globals_:
                st = t.untyped_storage()
                if st.nbytes() and self._ids.lookup(st) is None:
                    self._bind(self._ids.assign(st), st)
        else:
            self._ids.next_id = max(self._by_name.values(), default=-1) + 1
            self._bind_globals(pager)
        self._ids.n_global = self._ids.next_id
        self._mode = _Mode(self)
        self._guard = self.guard_class(self._guard_fetch)
        self._guard_pushed = False
        self._curve: list[int] | None = None
        self._rss_curve: list[int] | None = None
        self._stats = L.RuntimeStats()
        self._hooks = [model.register_state_dict_pre_hook(Hook(self._before_state_dict))]
        if optimizer is not None:
            self._hooks += [optimizer.register_state_dict_pre_hook(Hook(self._before_state_dict)),
                            optimizer.register_load_state_dict_post_hook(Hook(self._after_load))]
        self._hooks.append(model.register_load_state_dict_post_hook(Hook(self._after_load)))
        self._guard_on()  # tensors the pager handed over stored are away already

    # -- callbacks from the C runtime (run on this thread) --------------------
    def _storage(self, tensor: int):
        """The storage the C runtime has bound to `tensor`, or None."""
        b = self._bound.get(tensor)
        return b[1]() if b else None

    def _allocate(self, ctx, tensor, nbytes, addr):
        st = self._storage(tensor)
        if st is None:
            return -2  # -ENOENT: the storage died
        self._not_writing(tensor)
        try:
            st.resize_(nbytes)
        except RuntimeError:
            return -12  # -ENOMEM
        self._released.discard(tensor)
        addr[0] = self._addr[tensor] = st.data_ptr()
        return 0

    def _release(self, ctx, tensor):
        st = self._storage(tensor)
        self._not_writing(tensor)  # released: its write is done
        if st is not None:
            try:
                st.resize_(0)
            except RuntimeError:
                return -1  # -EPERM: _bind never binds a storage that cannot be resized
        self._released.add(tensor)
        return 0

    # -- staging (device memory the engine cannot address) --------------------
    @staticmethod
    def _bytes_view(st) -> torch.Tensor:
        """A uint8 tensor over all of storage `st`."""
        return torch.empty(0, dtype=torch.uint8, device=st.device).set_(st)

    def _stage_buffer(self, tensor: int, nbytes: int) -> torch.Tensor:
        pin = torch.cuda.is_available()
        buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        self._stage[tensor] = buf
        return buf

    def _stage_out(self, ctx, tensor, nbytes, addr):
        st = self._storage(tensor)
        if st is None:
            return -2  # -ENOENT
        buf = self._stage_buffer(tensor, nbytes)
        buf.copy_(self._bytes_view(st))  # device -> host; synchronous
        addr[0] = buf.data_ptr()
        return 0

    def _stage_in(self, ctx, tensor, nbytes, addr):
        addr[0] = self._stage_buffer(tensor, nbytes).data_ptr()
        return 0

    def _unstage(self, ctx, tensor, copy_in):
        buf = self._stage.pop(tensor, None)
        if buf is None:
            return -22  # -EINVAL
        if copy_in:
            st = self._storage(tensor)
            if st is None:
                return -2
            self._bytes_view(st).copy_(buf)  # host -> device; synchronous
        return 0

    # -- bookkeeping ----------------------------------------------------------
    def _bind(self, i: int, st) -> bool:
        """Bind storage `st` to id `i`; False if the runtime refused it (an
        id or size the trace does not have: the iteration diverged) or it
        cannot be moved: memory PyTorch does not own (torch.frombuffer,
        torch.from_numpy, some torch.load storages) cannot be resized, so it
        is only counted (untracked)."""
        if not st.resizable():
            self._account(st, st.nbytes())
            return True
        if L.check(L.tio_runtime_tensor_bind(self._p, i, st.data_ptr(), st.nbytes())) == 0:
            self._bound[i] = (st._cdata, weakref.ref(st))
            self._addr[i] = st.data_ptr()
            return True
        return False

    def _check_offloads(self, k: int) -> None:
        """Before kernel_begin(k) starts the writes the plan has there: is
        each storage still the memory the C runtime has?  A program can
        resize a storage with no operator the mode sees: FSDP2 frees its
        unsharded parameters with ``untyped_storage().resize_(0)`` after
        their forward and re-allocates them the same way for the backward.
        Writing the old address would read freed memory (unmapped, from 64
        KiB on).  A storage re-allocated at its size is bound at its new
        address; one the program freed is unbound (its bytes are gone: the
        program said so) and bound again when an operator next uses it at
        the trace's size."""
        for i, deadline in self._offload_at[k]:
            b = self._bound.get(i)
            st = b[1]() if b is not None else None
            if st is None or i in self._released:
                continue
            nbytes, addr = st.nbytes(), st.data_ptr()
            due = deadline if deadline > k else None  # None: due in the next iteration (wraps)
            if nbytes == self._trace_bytes[i] and addr == self._addr.get(i):
                self._hold_write(i, st, due)
                continue
            if nbytes == self._trace_bytes[i]:
                self._bind(i, st)   # rebinding replaces the address
                self._hold_write(i, st, due)
                continue
            self._unbind(i)
            self._freed_by_program.add(i)

    def _unbind(self, i: int) -> None:
        """Tensor `i`'s storage is no longer the runtime's (it died, or the
        program freed or resized its bytes): forgotten here and unbound in
        C, which waits for its I/O and drops its stored copy."""
        del self._bound[i]
        self._addr.pop(i, None)
        self._released.discard(i)
        L.check(L.tio_runtime_tensor_unbind(self._p, i))

    def _hold_write(self, i: int, st, deadline: int | None) -> None:
        """The write of tensor `i` (storage `st`) starts at this kernel and
        is due at kernel `deadline` of this iteration (None: of the next,
        a wrap-around period): `st` is held, and its resizes watched, until
        the write is done (_settle_writes; the release that follows it;
        _resize_storage)."""
        self._writing[i] = (st, deadline)
        _in_flight[st._cdata] = (self, i)
        _guard_resizes()

    def _not_writing(self, i: int) -> None:
        entry = self._writing.pop(i, None)
        if entry is not None:
            _in_flight.pop(entry[0]._cdata, None)

    def _clear_writes(self, ids=None) -> None:
        for i in list(self._writing) if ids is None else ids:
            self._not_writing(i)

    def _resized_while_written(self, i: int) -> None:
        """The program resizes the storage of tensor `i` while its write is
        in flight: unbind it (the C runtime waits for the write) and bind it
        again at its next use, as _check_offloads does for a storage resized
        before its write starts.  From another thread nothing can be waited
        for here (the runtime is this thread's)."""
        if threading.get_ident() != self._thread or not self._p:
            return
        self._not_writing(i)
        if i in self._bound:
            self._unbind(i)
            self._freed_by_program.add(i)

    def _settle_writes(self, done_by: int | None = None) -> None:
        """The writes in flight (started at the kernels _check_offloads saw)
        hold their storages: the engine reads a storage's memory on its own
        threads until the write completes, so a storage the program frees
        in between would be read after its memory is gone (a crash with
        either backend, measured with a 64 MiB tensor freed two operators
        after its write began).  Here, with `done_by` (kernel_begin(done_by)
        has returned, which waited for every write due by then), those
        writes let their storages go; and a storage only this hold keeps
        alive (the program dropped it) is unbound, which waits for its
        write, and let go: its memory is freed then, not before."""
        for i, (st, deadline) in list(self._writing.items()):
            if done_by is not None and deadline is not None and deadline <= done_by:
                self._not_writing(i)
            elif torch._C._storage_Use_Count(st._cdata) == 1:
                self._not_writing(i)
                b = self._bound.get(i)
                if b is not None and b[0] == st._cdata:
                    self._unbind(i)
        st = None

    def _bind_globals(self, pager=None) -> None:
        """Bind every global tensor the trace names whose storage is not the
        one bound (new, or replaced since).  A replaced storage that is
        still alive somewhere gets its bytes back first.  A global tensor
        over memory PyTorch cannot resize (optimizer.load_state_dict keeps
        the tensors torch.load made) is moved to a resizable copy first, so
        the plan can move it."""
        for t, _kind, name in global_tensors(self.model, self.optimizer):
            i = self._by_name.get(name)
            st = t.untyped_storage()
            if pager is not None and i is not None:
                if pager.nbytes(st) != self.trace.tensor_bytes(i):
                    pager.fetch(st)  # resized since the trace: its bytes are not the trace's to bind
                got = pager.detach(st)
                if got is not None and not got[0]:
                    self._bind_stored(i, st, got[1])
                    continue
            if i is None or not st.nbytes():
                continue
            if not st.resizable():
                copy = torch.UntypedStorage(st.nbytes(), device=st.device)
                copy.copy_(st)
                with torch.no_grad():
                    t.set_(copy, t.storage_offset(), t.size(), t.stride())
                st = t.untyped_storage()
            b = self._bound.get(i)
            if b is not None and b[0] == st._cdata:
                continue
            if b is not None and b[1]() is not None:
                L.check(L.tio_runtime_ensure_resident(self._p, i, None))
            self._ids.assign(st, i)
            self._bind(i, st)

    def _bind_stored(self, i: int, st, extent) -> None:
        """Bind id `i` to storage `st`, whose memory the pager released and
        whose bytes are in `extent` of the engine (the runtime owns it now)."""
        rc = L.tio_runtime_tensor_bind_stored(self._p, i, self.trace.tensor_bytes(i), ctypes.byref(extent))
        if rc < 0:
            L.tio_engine_free(self._engine_c._p, ctypes.byref(extent))
            L.check(rc)
        self._ids.assign(st, i)
        self._bound[i] = (st._cdata, weakref.ref(st))
        self._released.add(i)

    def _use(self, st) -> None:
        """An operator of the iteration reads storage `st`."""
        key = st._cdata
        i = self._ids.by_key.get(key)
        if i is None:
            self._new(st)
            return
        b = self._bound.get(i)
        if b is not None and b[0] == key:
            # Offloaded, or a prefetch still in flight: wait (a stall).
            L.check(L.tio_runtime_ensure_resident(self._p, i, None))
        elif b is None and i in self._freed_by_program and st.nbytes() == self._trace_bytes[i]:
            self._freed_by_program.discard(i)   # re-allocated by the program (_check_offloads)
            self._bind(i, st)

    def _new(self, st) -> None:
        """Storage `st` is first seen in this iteration (made by an operator,
        or the program's own, like its input batch): it takes the next id if
        the runtime agrees it is that tensor of the trace; if not, the
        iteration diverged and the pager takes it (or, without one, it is
        counted as untracked memory)."""
        nbytes = st.nbytes()
        if not nbytes or st._cdata in self._untracked:
            return
        if self._paging is not None:
            self._paging.track(st)
            return
        if not self.diverged:
            if self._bind(self._ids.assign(st), st):
                return
            self.diverged = True
            if self._start_paging():
                self._paging.track(st)
                return
        self._account(st, nbytes)

    def _account(self, st, nbytes: int) -> None:
        """Memory the plan does not manage: counted, never moved."""
        key = st._cdata
        self._untracked[key] = nbytes
        self._untracked_refs[key] = weakref.ref(st)
        weakref.finalize(st, self._untracked_died, key)
        L.check(L.tio_runtime_account_untracked(self._p, nbytes))

    def _untracked_died(self, key: int) -> None:
        self._untracked_refs.pop(key, None)
        self._untracked_freed += self._untracked.pop(key, 0)

    # -- a diverged iteration: the capacity kept on demand --------------------
    def _note_curve(self) -> None:
        L.tio_runtime_get_stats(self._p, ctypes.byref(self._stats))
        resident = self._stats.resident_bytes
        if self._paging is not None:
            resident += self._paging.stats()["resident_bytes"]
        self._curve.append(resident)
        if self._rss_curve is not None:
            self._rss_curve.append(_rss_bytes())

    def handover(self, pager: Pager, untracked: bool = False) -> None:
        """Give every bound tensor to `pager`: an offloaded one with its
        stored copy (so nothing is read back), a resident one as it is; with
        `untracked`, the storages only counted too.  The runtime binds
        nothing afterwards (until _take_back)."""
        self._drain_deaths()
        self._clear_writes()  # detach waits for each tensor's I/O
        # Stored copies first: they need no memory.
        order = sorted(self._bound, key=lambda i: L.tio_runtime_is_resident(self._p, i))
        for i in order:
            _key, ref = self._bound.pop(i)
            self._released.discard(i)
            resident, ext = ctypes.c_bool(), L.Extent()
            L.check(L.tio_runtime_tensor_detach(self._p, i, ctypes.byref(resident), ctypes.byref(ext)))
            st = ref()
            is_global = i < self._ids.n_global
            if st is None:  # died since the drain
                if not resident.value:
                    L.tio_engine_free(self._engine_c._p, ctypes.byref(ext))
            elif resident.value:
                pager.track(st, is_global=is_global)
            else:
                pager.track_stored(st, self.trace.tensor_bytes(i), ext, is_global=is_global)
        if untracked and self._untracked:
            total = 0
            for key, ref in list(self._untracked_refs.items()):
                st = ref()
                if st is not None:
                    pager.track(st)
                total += self._untracked.pop(key, 0)
            self._untracked_refs.clear()
            self._untracked.clear()
            L.check(L.tio_runtime_account_untracked(self._p, -total))

    def _take_back(self, pager: Pager) -> None:
        """The global tensors `pager` holds come back under the plan, where
        the pager left them (an evicted one with its stored copy)."""
        if self._by_name is not None:
            self._bind_globals(pager)
            return
        for t, _kind, _name in global_tensors(self.model, self.optimizer):
            st = t.untyped_storage()
            i = self._ids.by_key.get(st._cdata)
            if i is None or i >= self._ids.n_global:
                continue
            got = pager.detach(st)
            if got is None:
                continue
            if got[0]:
                self._bind(i, st)
            else:
                self._bind_stored(i, st, got[1])

    def _start_paging(self) -> bool:
        """The iteration diverged: from now on a pager keeps the capacity
        (module text).  False where there is no engine to evict to."""
        if self._engine_c is None:
            return False
        L.tio_runtime_get_stats(self._p, ctypes.byref(self._stats))
        pager = Pager(self._engine_c, max(1, self.paging_capacity or self._stats.capacity_bytes))
        pager.begin_step()
        self.handover(pager, untracked=True)
        self._paging = pager
        return True

    def _paged_kernel(self, func, args, kwargs, name):
        """One operator of a diverged iteration, under the pager."""
        pager = self._paging
        collective = name.startswith("c10d.")   # its buffers are another thread's until it completes
        pager.operator_begin(args, kwargs, collective, lambda: new_output_bytes(func, args, kwargs))
        out = func(*args, **kwargs)
        sizes = [(t.untyped_storage().nbytes(), t.shape) for t in iter_tensors(out)]  # before tracking evicts
        pager.operator_end(out, collective)
        self._signature.append((name, tuple(sizes)))
        if self._curve is not None:
            self._note_curve()
        return out

    def _end_paging(self, pager: Pager) -> None:
        """Counters of the pager of the iteration that ends; the
        intermediate storages it holds come back and are forgotten."""
        self._paged = add_stats(self._paged, pager.stats())
        pager.end_step([t.untyped_storage() for t, _, _ in global_tensors(self.model, self.optimizer)],
                       guard=False)

    def _drain_deaths(self) -> None:
        while self._deaths:
            i, key = self._deaths.pop()
            b = self._bound.get(i)
            if b is not None and b[0] == key:
                self._unbind(i)
        if self._untracked_freed:
            n, self._untracked_freed = self._untracked_freed, 0
            L.check(L.tio_runtime_account_untracked(self._p, -n))

    def _let_threads_free(self, k: int, held: int) -> None:
        """Kernel k is next, and `held` storages the trace has freed before it
        are still bound, more than the last kernel left.  Mostly another
        thread holds the last reference and is about to drop it, waiting for
        the GIL (gloo's worker thread, with a collective's buffer): let it
        run, for up to _YIELD_S, so the memory is gone before kernel k's
        window opens.  What stays held is counted against the capacity and
        not waited for again this iteration."""
        if held > self._held_known and self._yield_left > 0:
            t0 = time.perf_counter()
            deadline = t0 + min(_YIELD_S, self._yield_left)
            while held > self._held_known and time.perf_counter() < deadline:
                _yield_gil()
                self._drain_deaths()
                held = L.check(L.tio_runtime_held_past_free(self._p, k, None, 0))
            if held > self._held_known:
                self._yield_left -= time.perf_counter() - t0
            self._frees_waited += 1
        self._held_known = held

    def _end_iteration(self) -> None:
        pager, self._paging = self._paging, None
        if pager is not None:
            self._end_paging(pager)
        self._drain_deaths()
        rc = L.tio_runtime_iteration_end(self._p)
        # iteration_end waited for the intermediates' writes (made them resident, unbound them)
        self._clear_writes([i for i in self._writing if i >= self._ids.n_global])
        for i in [i for i in self._bound if i >= self._ids.n_global]:
            del self._bound[i]
            self._released.discard(i)
        self._untracked.clear()
        self._untracked_refs.clear()
        self._untracked_freed = 0
        if pager is not None:
            try:
                self._take_back(pager)
            finally:
                pager.close()  # what the trace does not name comes back
        self.fingerprint = sequence_fingerprint(self._signature)
        self._signature = []
        L.tio_runtime_get_stats(self._p, ctypes.byref(self._stats))
        self.diverged = self.diverged or self._stats.diverged_iterations > self._diverged_before
        L.check(rc)

    # -- between iterations ---------------------------------------------------
    def _guard_fetch(self, st) -> None:
        """The guard between iterations (an operator that reads an offloaded
        tensor: a parameter norm, gradient clipping, a plain step, an eval
        pass): fetch it first."""
        if self._p and not self._in_iteration:
            self._fetch_outside(st)

    def _fetch_outside(self, st) -> None:
        i = self._ids.by_key.get(st._cdata)
        if i is None:
            return
        b = self._bound.get(i)
        if b is not None and b[0] == st._cdata and not L.tio_runtime_is_resident(self._p, i):
            L.check(L.tio_runtime_ensure_resident(self._p, i, None))

    def _guard_on(self) -> None:
        """Between iterations, guard operators (a Python call per operator)
        only while some bound tensor is away or moving."""
        if not self.safe or self._guard_pushed:
            return
        if all(L.tio_runtime_is_resident(self._p, i) for i in self._bound):
            return
        if guard_would_be_popped():
            self.fetch_all()
            return
        _push_mode(self._guard)
        self._guard_pushed = True

    def _guard_off(self) -> None:
        """Take the guard off the mode stack if it is on top; below another
        mode it stays, doing nothing while an iteration runs."""
        if self._guard_pushed and _get_current_dispatch_mode() is self._guard:
            _pop_mode()
            self._guard_pushed = False

    def _before_state_dict(self) -> None:
        """state_dict() hands out the live tensors: all of them resident (in
        an iteration too, where it costs the plan its memory savings).  In
        another thread's Session.reading() they are resident already."""
        if self._p and self.safe and not in_reading():
            self.fetch_all()

    def _after_load(self) -> None:
        """load_state_dict may have put new storages in place of bound ones
        (the optimizer always does): bind them before anything moves."""
        if self._p and self._by_name is not None and not self._in_iteration:
            self._check_thread()
            self._drain_deaths()
            self._bind_globals()

    def _check_thread(self) -> None:
        if threading.get_ident() != self._thread:
            raise RuntimeError("OffloadRuntime used from another thread: a runtime is driven only "
                               "from the thread that created it (its tensors move under that thread)")

    def _open(self) -> None:
        self._check_thread()
        if not self._p:
            raise RuntimeError("OffloadRuntime is closed: create a new one to offload again")

    # -- public ---------------------------------------------------------------
    @contextlib.contextmanager
    def iteration(self):
        """Run one training iteration with the plan applied."""
        self._open()
        if self._in_iteration:
            raise RuntimeError("OffloadRuntime.iteration: an iteration is already running")
        self._guard_off()
        self._drain_deaths()
        if self._by_name is not None:
            self._bind_globals()
        self._ids.start_iteration()
        self.k = 0
        if self._cuda_engine is not None:  # device requests wait for work queued on this stream
            _gpu.set_stream(self._cuda_engine, torch.cuda.current_stream().cuda_stream)
        self.diverged = False
        self._held_known = 0  # tensors held past their free the last kernel left
        self._yield_left = _YIELD_BUDGET_S
        self._signature = []
        L.tio_runtime_get_stats(self._p, ctypes.byref(self._stats))
        self._diverged_before = self._stats.diverged_iterations
        L.check(L.tio_runtime_iteration_begin(self._p))
        self._in_iteration = True
        try:
            with self._mode:
                yield self
        finally:
            self._in_iteration = False
            self._curve = self._rss_curve = None
            try:
                self._end_iteration()
            finally:
                self._guard_on()

    def record_curve(self, curve: list[int], rss: list[int] | None = None) -> None:
        """Append the resident bytes after each kernel of the next iteration to
        `curve`, and the process's resident set (the OS's count) to `rss`."""
        self._check_thread()
        self._curve, self._rss_curve = curve, rss

    def fetch_all(self) -> None:
        """Bring every offloaded tensor back (before checkpointing or eval)."""
        self._open()
        L.check(L.tio_runtime_fetch_all(self._p))
        if self._paging is not None:
            self._paging.fetch_all()

    def stats(self) -> dict:
        """The C runtime's counters (tio_runtime_stats), with the pager's of
        the diverged iterations: its kernels over the capacity and peaks
        joined to the runtime's, and its own counts as ``paged_*``."""
        self._open()
        s = L.RuntimeStats()
        L.tio_runtime_get_stats(self._p, ctypes.byref(s))
        out = {name: getattr(s, name) for name, _ in L.RuntimeStats._fields_}
        out["frees_waited"] = self._frees_waited
        paged = self._paged
        if self._paging is not None:
            paged = add_stats(paged, self._paging.stats())
        paged = {k: paged[k] if paged else 0 for k in _PAGED}
        for k, v in paged.items():
            out["paged_" + k] = v
        out["over_capacity_kernels"] += paged["over_capacity_kernels"]
        for k in _PAGED_MAXES:
            out[k] = max(out[k], paged[k])
        return out

    def close(self) -> None:
        """Bring everything back and free the runtime (its SSD space)."""
        if getattr(self, "_p", None):
            self._check_thread()
            self._guard_off()
            self.fetch_all()
            for h in self._hooks:
                h.remove()
            L.tio_runtime_destroy(self._p)
            self._p = None
            self._clear_writes()
