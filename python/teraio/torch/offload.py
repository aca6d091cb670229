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

If the operator sequence leaves the profiled one, the C runtime says so once
(log warning) and stops planned migrations; tensors already offloaded are
fetched on demand, so results stay correct.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _lib as L
from .. import gpu as _gpu
from ..core import Engine, Plan, Trace
from ._ids import StorageIds, global_tensors, iter_tensors
from .profiler import kernel_name

log = logging.getLogger("teraio")


@L.LOG_FN
def _log_cb(ctx, level, msg):
    text = msg.decode(errors="replace")
    log.log({0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING}.get(level, logging.ERROR), "%s", text)


L.tio_set_log(_log_cb, None, 1)


class _Mode(TorchDispatchMode):
    def __init__(self, rt: "OffloadRuntime"):
        super().__init__()
        self.rt = rt

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = kernel_name(func)
        if name is None:
            return func(*args, **kwargs)
        rt = self.rt
        rt._drain_deaths()
        k = rt.k
        rt.k += 1
        if not rt.diverged:
            rc = L.check(L.tio_runtime_kernel_begin(rt._p, k, name.encode()))
            if rc == 1:
                rt.diverged = True
        for t in iter_tensors((args, kwargs)):
            rt._touch(t.untyped_storage())
        out = func(*args, **kwargs)
        if not rt.diverged:
            for t in iter_tensors(out):
                st = t.untyped_storage()
                if rt._ids.lookup(st) is None:
                    rt._touch(st)
        if rt._curve is not None:
            L.tio_runtime_get_stats(rt._p, ctypes.byref(rt._stats))
            rt._curve.append(rt._stats.resident_bytes)
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


class OffloadRuntime:
    """Runs training iterations under an offload plan.

    ``trace``/``plan`` come from :class:`teraio.torch.Profiler` and
    ``teraio.core.Plan.build`` (or files); ``engine`` is a
    :class:`teraio.core.Engine` over the SSD directories.
    """

    def __init__(self, model: torch.nn.Module, optimizer, trace: Trace, plan: Plan, engine: Engine | None,
                 staging: bool | None = None):
        """``staging``: move bytes through host staging buffers (pinned when
        CUDA is available) instead of letting the engine address the
        tensors' memory.  Default: for CUDA tensors, off when the engine can
        take a GPU (teraio.gpu: its C staging ring or GPUDirect Storage),
        else on; on for other devices that are not the CPU."""
        self.model, self.optimizer = model, optimizer
        self.trace, self.plan, self.engine = trace, plan, engine
        self.k = 0
        self.diverged = False
        self._released: set[int] = set()
        self._deaths: list[tuple[int, int]] = []
        self._bound: dict[int, int] = {}          # id -> storage key it is bound to
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
        self._alloc_cb = L.ALLOCATE_FN(self._allocate)
        self._release_cb = L.RELEASE_FN(self._release)
        if staging:
            self._stage_out_cb = L.STAGE_FN(self._stage_out)
            self._stage_in_cb = L.STAGE_FN(self._stage_in)
            self._unstage_cb = L.UNSTAGE_FN(self._unstage)
            self._cbs = L.RuntimeCallbacks(None, self._alloc_cb, self._release_cb, self._stage_out_cb,
                                           self._stage_in_cb, self._unstage_cb)
        else:
            self._cbs = L.RuntimeCallbacks(None, self._alloc_cb, self._release_cb)
        self._p = ctypes.c_void_p()
        L.check(L.tio_runtime_create(plan._p, trace._p, engine._p if engine else None,
                                     ctypes.byref(self._cbs), ctypes.byref(self._p)))
        by_name = _trace_globals_by_name(trace)
        for t, _kind, name in globals_:
            st = t.untyped_storage()
            if not st.nbytes() or self._ids.lookup(st) is not None:
                continue
            if by_name is None:
                self._bind(self._ids.assign(st), st)
            elif name in by_name:
                self._bind(self._ids.assign(st, by_name[name]), st)
            # else: not in the trace (the profiled iteration never touched
            # it): untracked, never moved.
        if by_name is not None:
            self._ids.next_id = max(by_name.values(), default=-1) + 1
        self._ids.n_global = self._ids.next_id
        self._mode = _Mode(self)
        self._curve: list[int] | None = None
        self._stats = L.RuntimeStats()

    # -- callbacks from the C runtime (run on this thread) --------------------
    def _allocate(self, ctx, tensor, nbytes, addr):
        st = self._ids.get(tensor)
        if st is None:
            return -2  # -ENOENT: the storage died
        try:
            st.resize_(nbytes)
        except RuntimeError:
            return -12  # -ENOMEM
        self._released.discard(tensor)
        addr[0] = st.data_ptr()
        return 0

    def _release(self, ctx, tensor):
        st = self._ids.get(tensor)
        if st is not None:
            st.resize_(0)
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
        st = self._ids.get(tensor)
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
            st = self._ids.get(tensor)
            if st is None:
                return -2
            self._bytes_view(st).copy_(buf)  # host -> device; synchronous
        return 0

    # -- bookkeeping ----------------------------------------------------------
    def _bind(self, i: int, st) -> None:
        rc = L.tio_runtime_tensor_bind(self._p, i, st.data_ptr(), st.nbytes())
        if rc == 0:
            self._bound[i] = st._cdata
        # A tensor the plan does not know (size differs, id beyond the trace)
        # stays untracked: it is never moved.

    def _touch(self, st) -> None:
        i = self._ids.lookup(st)
        if i is None:
            if st.nbytes() == 0 or self.diverged:
                return
            i = self._ids.assign(st)
            self._bind(i, st)
        elif i in self._bound:
            # Offloaded, or a prefetch still in flight: wait (a stall).
            L.check(L.tio_runtime_ensure_resident(self._p, i, None))

    def _drain_deaths(self) -> None:
        while self._deaths:
            i, key = self._deaths.pop()
            if self._bound.get(i) == key:
                del self._bound[i]
                self._released.discard(i)
                L.check(L.tio_runtime_tensor_unbind(self._p, i))

    # -- public ---------------------------------------------------------------
    def _open(self) -> None:
        if not self._p:
            raise RuntimeError("OffloadRuntime is closed: create a new one to offload again")

    @contextlib.contextmanager
    def iteration(self):
        """Run one training iteration with the plan applied."""
        self._open()
        self._drain_deaths()
        self._ids.start_iteration()
        self.k = 0
        if self._cuda_engine is not None:  # device requests wait for work queued on this stream
            _gpu.set_stream(self._cuda_engine, torch.cuda.current_stream().cuda_stream)
        L.check(L.tio_runtime_iteration_begin(self._p))
        try:
            with self._mode:
                yield self
        finally:
            self._curve = None
        self._drain_deaths()

    def record_curve(self, curve: list[int]) -> None:
        """Append the resident bytes after each kernel of the next iteration to `curve`."""
        self._curve = curve

    def fetch_all(self) -> None:
        """Bring every offloaded tensor back (before checkpointing or eval)."""
        self._open()
        L.check(L.tio_runtime_fetch_all(self._p))

    def stats(self) -> dict:
        s = L.RuntimeStats()
        L.tio_runtime_get_stats(self._p, ctypes.byref(s))
        return {name: getattr(s, name) for name, _ in L.RuntimeStats._fields_}

    def close(self) -> None:
        if getattr(self, "_p", None):
            self.fetch_all()
            L.tio_runtime_destroy(self._p)
            self._p = None
