"""Python handles on libteraio's objects: Trace, Lifetime, Plan, Engine.

Each class owns one C object and frees it when collected.  They exist so the
PyTorch adapter and the demo can drive the C library; no algorithm is
re-implemented here.
"""
from __future__ import annotations

import ctypes
import os
import time
from typing import Iterable, Sequence

from . import _lib as L
from ._args import integer

KINDS = {"parameter": 0, "gradient": 1, "optimizer_state": 2, "activation": 3, "temporary": 4}


READ, WRITE = 1, 2
TIER_NAMES = {0: "device", 1: "host", 2: "ssd"}


class Trace:
    """A trace of one iteration (see include/teraio/trace.h)."""

    def __init__(self, ptr):
        self._p = ptr

    @classmethod
    def build(cls, model: str, tensors: Sequence[tuple], kernels: Iterable[tuple]) -> "Trace":
        """tensors: (bytes, kind name, is_global, name[, free_kernel]) in id
        order, free_kernel (intermediate tensors, optional, 0 = none) being
        the kernel before which the storage was freed (trace.h);
        kernels: (name, duration_ns, [(tensor id, mode bits), ...])."""
        p = L.TraceP()
        L.check(L.tio_trace_create(model.encode(), ctypes.byref(p)))
        t = cls(p)
        tid = ctypes.c_uint32()
        frees = []
        for i, (nbytes, kind, is_global, name, *rest) in enumerate(tensors):
            L.check(L.tio_trace_add_tensor(p, integer("tensor bytes", nbytes, 1), KINDS[kind], is_global,
                                           name.encode() if name else None, ctypes.byref(tid)))
            if rest and rest[0]:
                frees.append((i, rest[0]))
        for name, dur, accesses in kernels:
            L.check(L.tio_trace_add_kernel(p, name.encode(), integer("kernel duration_ns", int(dur))))
            for tensor, mode in accesses:
                L.check(L.tio_trace_add_access(p, tensor, mode))
        for i, kernel in frees:
            L.check(L.tio_trace_set_free_kernel(p, i, kernel))
        L.check(L.tio_trace_validate(p))
        return t

    @classmethod
    def load(cls, path: str) -> "Trace":
        p = L.TraceP()
        L.check(L.tio_trace_load(os.fsencode(path), ctypes.byref(p)))
        return cls(p)

    def save(self, path: str) -> None:
        L.check(L.tio_trace_save(self._p, os.fsencode(path)))

    @property
    def n_kernels(self) -> int:
        return self._p.contents.n_kernels

    @property
    def n_tensors(self) -> int:
        return self._p.contents.n_tensors

    def kernel_name(self, k: int) -> str:
        return self._p.contents.kernels[k].name.decode()

    def kernel_accesses(self, k: int) -> list[tuple[int, int]]:
        """Kernel k's accesses: (tensor id, READ | WRITE bits)."""
        c = self._p.contents
        kern = c.kernels[k]
        return [(c.accesses[a].tensor, c.accesses[a].mode)
                for a in range(kern.first_access, kern.first_access + kern.n_accesses)]

    def kernel_ns(self) -> list[int]:
        ks = self._p.contents.kernels
        return [ks[k].duration_ns for k in range(self.n_kernels)]

    def tensor_bytes(self, i: int) -> int:
        return self._p.contents.tensors[i].bytes

    def tensor_name(self, i: int) -> str | None:
        name = self._p.contents.tensors[i].name
        return name.decode() if name is not None else None

    def tensor_kind(self, i: int) -> str:
        """"parameter", "gradient", "optimizer_state", "activation", ..."""
        return L.tio_tensor_kind_name(self._p.contents.tensors[i].kind).decode()

    def tensor_is_global(self, i: int) -> bool:
        return bool(self._p.contents.tensors[i].global_)

    def tensor_free_kernel(self, i: int) -> int:
        return self._p.contents.tensors[i].free_kernel

    def __del__(self):
        if getattr(self, "_p", None):
            L.tio_trace_destroy(self._p)
            self._p = None


class Lifetime:
    """Lifetime analysis of a trace (include/teraio/lifetime.h)."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self._p = L.LifetimeP()
        L.check(L.tio_lifetime_analyze(trace._p, ctypes.byref(self._p)))

    @property
    def peak_bytes(self) -> int:
        return self._p.contents.peak_bytes

    @property
    def max_active_bytes(self) -> int:
        """The most bytes one kernel accesses."""
        return self._p.contents.max_active_bytes

    @property
    def max_active_kernel(self) -> int:
        """The first kernel whose accesses are max_active_bytes."""
        return self._p.contents.max_active_kernel

    def active_bytes(self, k: int) -> int:
        """The bytes kernel k accesses."""
        if not 0 <= k < self._p.contents.n_kernels:
            raise IndexError(f"kernel {k} of {self._p.contents.n_kernels}")
        return self._p.contents.active_bytes[k]

    @property
    def floor_bytes(self) -> int:
        """The working-set floor: no plan goes below it.  What a kernel
        accesses plus what stays resident there with no period to move it
        in; a tensor held after its last use until it is freed moves in its
        tail period, so this is max_active_bytes for every trace a
        profiler makes (every tensor it has is accessed)."""
        return self._p.contents.floor_bytes

    @property
    def floor_kernel(self) -> int:
        """The first kernel whose need is floor_bytes."""
        return self._p.contents.floor_kernel

    def floor_tensors(self) -> list[dict]:
        """The tensors that make the working-set floor, at ``floor_kernel``:
        each ``{"tensor", "name", "kind", "bytes", "reason"}``, the largest
        first, with reason "accessed" (the kernel reads or writes it), or
        one of the reasons lifetime.h keeps for what no period covers ("held
        after its last use", "never accessed"), which a valid trace no
        longer produces.  Their bytes sum to floor_bytes."""
        n = ctypes.c_uint32(0)
        L.check(L.tio_lifetime_floor_tensors(self.trace._p, self._p, None, 0, ctypes.byref(n)))
        buf = (L.FloorTensor * max(n.value, 1))()
        L.check(L.tio_lifetime_floor_tensors(self.trace._p, self._p, buf, n.value, ctypes.byref(n)))
        out = []
        for f in buf[: n.value]:
            out.append({"tensor": f.tensor, "name": self.trace.tensor_name(f.tensor),
                        "kind": self.trace.tensor_kind(f.tensor), "bytes": f.bytes,
                        "reason": L.tio_floor_reason_name(f.reason).decode()})
        return out

    def memory_curve(self) -> list[int]:
        c = self._p.contents
        return c.memory_bytes[: c.n_kernels]

    def __del__(self):
        if getattr(self, "_p", None):
            L.tio_lifetime_destroy(self._p)
            self._p = None


class Plan:
    """An offload plan (include/teraio/plan.h)."""

    def __init__(self, ptr, trace: Trace | None = None):
        self._p = ptr
        self.trace = trace

    @classmethod
    def build(cls, trace: Trace, lifetime: Lifetime, capacity_bytes: int, ssd_read_gbps: float,
              ssd_write_gbps: float, host_cap_bytes: int = 0, planner: str = "teraio",
              host_to_device_gbps: float = 0.0, device_to_host_gbps: float = 0.0,
              synchronous_moves: bool = True, kinds: Iterable[str] | None = None) -> "Plan":
        """tio_plan_build: ``planner`` is "teraio" (the default, fast planner)
        or "alg1" (TERAIO's Algorithm 1 as published, about cubic in the
        kernel count); host channel bandwidths of 0 mean "as the SSD's".
        With ``synchronous_moves`` (the default) the plan fits whenever the
        capacity is at least the working-set floor (``Lifetime.floor_bytes``),
        accepting stalls (``predicted_stall_ns``) where bandwidth cannot
        hide a move.  ``kinds``: the tensor kinds (KINDS names) that may
        move (default all; the teraio planner only)."""
        if planner not in L.PLANNERS:
            raise ValueError(f"planner must be one of {sorted(L.PLANNERS)}, got {planner!r}")
        opt = L.PlanOptions()
        L.tio_plan_options_default(ctypes.byref(opt))
        opt.planner = L.PLANNERS[planner]
        opt.capacity_bytes = integer("capacity_bytes", capacity_bytes, 1)
        opt.ssd_read_gbps = ssd_read_gbps
        opt.ssd_write_gbps = ssd_write_gbps
        opt.host_to_device_gbps = host_to_device_gbps
        opt.device_to_host_gbps = device_to_host_gbps
        opt.host_cap_bytes = integer("host_cap_bytes", host_cap_bytes)
        opt.synchronous_moves = bool(synchronous_moves)
        if kinds is not None:
            opt.kind_mask = sum(1 << KINDS[k] for k in kinds)
        p = L.PlanP()
        L.check(L.tio_plan_build(trace._p, lifetime._p, ctypes.byref(opt), ctypes.byref(p)))
        return cls(p, trace)

    @classmethod
    def load(cls, path: str, trace: Trace, lifetime: Lifetime) -> "Plan":
        p = L.PlanP()
        L.check(L.tio_plan_load(os.fsencode(path), ctypes.byref(p)))
        plan = cls(p, trace)
        L.check(L.tio_plan_check(p, trace._p, lifetime._p))
        return plan

    def save(self, path: str) -> None:
        L.check(L.tio_plan_save(self._p, os.fsencode(path)))

    def __getattr__(self, name):
        if name in ("n_migrations", "capacity_bytes", "planned_peak_bytes", "bytes_to_ssd", "bytes_to_host",
                    "fits", "plan_seconds", "n_kernels", "peak_host_bytes", "predicted_stall_ns"):
            return getattr(self._p.contents, name)
        raise AttributeError(name)

    def planned_curve(self) -> list[int]:
        c = self._p.contents
        return c.planned_memory_bytes[: c.n_kernels] if c.planned_memory_bytes else []

    def migrations(self) -> list[dict]:
        c = self._p.contents
        out = []
        for i in range(c.n_migrations):
            m = c.migrations[i]
            out.append({"tensor": m.tensor, "kind": "offload" if m.kind == 0 else "prefetch",
                        "trigger": m.trigger_kernel, "deadline": m.deadline_kernel,
                        "tier": TIER_NAMES[m.tier], "bytes": m.bytes})
        return out

    def __del__(self):
        if getattr(self, "_p", None):
            L.tio_plan_destroy(self._p)
            self._p = None


def fit_host_costs(trace: Trace, lifetime: Lifetime, calibration: Plan, plan: Plan, *,
                   calibration_capacity_bytes: int, capacity_bytes: int, empty_s: float,
                   calibration_s: float, measured_s: float, ssd_read_gbps: float,
                   ssd_write_gbps: float) -> dict:
    """tio_sim_fit_host_costs (include/teraio/sim.h): this CPU's dispatch time
    per kernel and host time per migrated byte, fitted to the measured
    iterations of an empty plan (``empty_s``) and of ``calibration``
    (``calibration_s``), and ``plan``'s iteration simulated with them beside
    its measured ``measured_s``.  Raises TeraioError where no fit exists."""
    cal = L.SimCalibration(calibration=calibration._p, plan=plan._p,
                           calibration_capacity_bytes=integer("calibration_capacity_bytes",
                                                           calibration_capacity_bytes, 1),
                           capacity_bytes=integer("capacity_bytes", capacity_bytes, 1),
                           empty_s=empty_s, calibration_s=calibration_s, measured_s=measured_s,
                           ssd_read_gbps=ssd_read_gbps, ssd_write_gbps=ssd_write_gbps)
    fit = L.SimFit()
    L.check(L.tio_sim_fit_host_costs(trace._p, lifetime._p, ctypes.byref(cal), ctypes.byref(fit)))
    return {"simulated_s": fit.simulated_s, "measured_s": fit.measured_s,
            "sim_vs_measured_error": fit.error, "host_overhead_us": fit.hw.host_overhead_us,
            "migration_host_ns_per_byte": fit.hw.migration_host_ns_per_byte,
            "empty_plan_s": empty_s, "calibration_plan_s": calibration_s,
            "kernels_s": fit.kernels_s, "kernel_scale": fit.kernel_scale,
            "n_kernels": trace.n_kernels}


def load_hw(path: str) -> dict:
    """A hardware profile (hw/*.conf, format in include/teraio/sim.h) read by
    tio_hw_load, as a dict of its fields."""
    hw = L.Hw()
    L.check(L.tio_hw_load(os.fsencode(path), ctypes.byref(hw)))
    return {name: (getattr(hw, name).decode() if name == "name" else getattr(hw, name))
            for name, _ in L.Hw._fields_}


BACKENDS = {"auto": 0, "io_uring": 1, "psync": 2}


class Engine:
    """The storage engine over one or more SSD directories (include/teraio/engine.h).

    ``space_bytes`` is the SSD space to preallocate, split over ``dirs`` (not
    a plan's ``capacity_bytes``, the device budget).  ``crc`` keeps a CRC32C
    of every chunk written and checks it on every read (on by default): a
    backing file changed behind the engine's back gives a TeraioError naming
    the file and offset, never other bytes.

    Single-thread, like the C engine.  After :meth:`close` every method
    raises ValueError.  An OffloadRuntime built on the engine holds its own
    reference in C, so closing the engine first is safe: the files go when
    the runtime is closed too.
    """

    def __init__(self, dirs: Sequence[str], space_bytes: int, backend: str = "auto", crc: bool = True):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if not isinstance(crc, bool):
            raise ValueError(f"crc must be True or False, got {crc!r}")
        opt = L.EngineOptions()
        L.tio_engine_options_default(ctypes.byref(opt))
        self._dirs = (ctypes.c_char_p * len(dirs))(*[os.fsencode(d) for d in dirs])
        opt.dirs = self._dirs
        opt.n_dirs = len(dirs)
        opt.space_bytes = integer("space_bytes", space_bytes, 1)
        opt.backend = BACKENDS[backend]
        opt.checksum = crc
        self.crc = crc
        self._p = ctypes.c_void_p()
        L.check(L.tio_engine_create(ctypes.byref(opt), ctypes.byref(self._p)))

    def _handle(self) -> ctypes.c_void_p:
        """The C engine; ValueError once closed."""
        p = getattr(self, "_p", None)
        if not p:
            raise ValueError("Engine is closed")
        return p

    @property
    def backend(self) -> str:
        return L.tio_backend_name(L.tio_engine_backend(self._handle())).decode()

    @property
    def backend_reason(self) -> str:
        r = L.tio_engine_backend_reason(self._handle())
        return r.decode() if r else ""

    def measure_gbps(self, nbytes: int = 128 << 20, chunk_bytes: int = 16 << 20) -> tuple[float, float]:
        """Write then read `nbytes` through the engine, `chunk_bytes` at a
        time from one buffer of that size (the process's memory grows by a
        chunk, not by `nbytes`: a job measured inside a memory limit has only
        its capacity); returns (read, write) GB/s.  `nbytes` is from 1 to
        2**62, `chunk_bytes` from 4096 to 2**40 (ValueError otherwise); a
        chunk the engine has no room for raises its TeraioError before any
        buffer is made."""
        p = self._handle()
        nbytes = integer("nbytes", nbytes, 1, 1 << 62)
        chunk = min(nbytes, integer("chunk_bytes", chunk_bytes, 4096, 1 << 40))
        rounds = -(-nbytes // chunk)
        ext = L.Extent()
        L.check(L.tio_engine_alloc(p, chunk, ctypes.byref(ext)))  # the engine has room: then the buffer
        try:
            buf = ctypes.create_string_buffer(chunk)
            ctypes.memset(buf, 0x5A, chunk)
            t0 = time.perf_counter()
            for _ in range(rounds):
                L.check(L.tio_engine_write(p, ctypes.byref(ext), buf, chunk))
            t1 = time.perf_counter()
            for _ in range(rounds):
                L.check(L.tio_engine_read(p, ctypes.byref(ext), buf, chunk))
            t2 = time.perf_counter()
        finally:
            L.tio_engine_free(p, ctypes.byref(ext))
        moved = rounds * chunk
        return moved / (t2 - t1) / 1e9, moved / (t1 - t0) / 1e9

    def close(self) -> None:
        """Drop this handle's reference (idempotent)."""
        p = getattr(self, "_p", None)
        if p:
            self._p = None
            L.tio_engine_destroy(p)

    def __enter__(self) -> "Engine":
        self._handle()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()
