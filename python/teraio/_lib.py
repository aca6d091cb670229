"""ctypes bindings to libteraio: the one place that declares the C API to Python.

The adapter is thin on purpose: every algorithm (trace format, lifetime
analysis, planning, the I/O engine, the runtime, the tokenizer, the data
loader) lives in the C library.  This module declares every C function the
package calls (named as in include/teraio/*.h) and mirrors every C struct it
passes (each class names its C type in ``_c_name``;
tests/python/test_abi.py checks sizes, offsets and argument counts against the
headers), and turns negative return codes into :class:`TeraioError` carrying
the library's own message.  The modules above it (core, tok, data, torch) use
only what is declared here.

The library is found, in order: ``$TERAIO_LIBRARY``; ``teraio/_lib/`` next to
this file (an installed wheel); ``build/lib/`` of the source tree this package
sits in (a development checkout).
"""
from __future__ import annotations

import ctypes
import os
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_char_p, c_double, c_int, c_int64,
                    c_size_t, c_uint, c_uint8, c_uint32, c_uint64, c_void_p)
from pathlib import Path


class TeraioError(RuntimeError):
    """A libteraio call failed; ``code`` is the negative error code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _find_library() -> str:
    env = os.environ.get("TERAIO_LIBRARY")
    if env:
        return env
    here = Path(__file__).resolve().parent
    for cand in (here / "_lib" / "libteraio.so", here.parent.parent / "build" / "lib" / "libteraio.so"):
        if cand.exists():
            return str(cand)
    raise ImportError("libteraio.so not found: build it with 'make' or set TERAIO_LIBRARY")


lib = ctypes.CDLL(_find_library())


def _fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


# ---- common -----------------------------------------------------------------
LOG_FN = CFUNCTYPE(None, c_void_p, c_int, c_char_p)
tio_strerror = _fn("tio_strerror", c_char_p, c_int)
tio_last_error = _fn("tio_last_error", c_char_p)
tio_version = _fn("tio_version", c_char_p)
tio_features = _fn("tio_features", c_char_p)
tio_set_log = _fn("tio_set_log", None, LOG_FN, c_void_p, c_int)
tio_free = _fn("tio_free", None, c_void_p)


_pending = threading.local()  # an exception raised in a callback of this thread


def callback(fn, failed_rc: int = -4):
    """The body of a ctypes callback that lets no exception fall into ctypes
    (which prints it as ignored and hands C an undefined value): the
    exception is kept for this thread's next check() to raise, the first one
    wins, and C gets `failed_rc` (-EINTR), so a Ctrl-C inside a callback is
    a KeyboardInterrupt again, not "Cannot allocate memory"."""
    def body(*args):
        try:
            return fn(*args)
        except BaseException as e:  # noqa: BLE001 (re-raised by check)
            if getattr(_pending, "exc", None) is None:
                _pending.exc = e
            return failed_rc
    return body


def check(rc: int) -> int:
    """Raise the exception a callback of this thread kept (see callback),
    else TeraioError for a negative return code, else return `rc`."""
    exc = getattr(_pending, "exc", None)
    if exc is not None:
        _pending.exc = None
        raise exc
    if rc < 0:
        msg = (tio_last_error() or b"").decode(errors="replace") or tio_strerror(rc).decode()
        raise TeraioError(rc, msg)
    return rc


# ---- trace ------------------------------------------------------------------
class TraceTensor(Structure):
    _c_name = "tio_trace_tensor"
    _c_fields = {"global_": "global"}  # Python names that differ from the C field
    _fields_ = [("id", c_uint32), ("bytes", c_uint64), ("kind", c_int), ("global_", c_bool),
                ("name", c_char_p), ("free_kernel", c_uint32)]


class TraceKernel(Structure):
    _c_name = "tio_trace_kernel"
    _fields_ = [("name", c_char_p), ("duration_ns", c_uint64), ("first_access", c_uint32),
                ("n_accesses", c_uint32)]


class TraceAccess(Structure):
    _c_name = "tio_trace_access"
    _fields_ = [("tensor", c_uint32), ("mode", c_uint8)]


class Trace(Structure):
    _c_name = "tio_trace"
    _fields_ = [("n_tensors", c_uint32), ("tensors", POINTER(TraceTensor)),
                ("n_kernels", c_uint32), ("kernels", POINTER(TraceKernel)),
                ("n_accesses", c_uint32), ("accesses", POINTER(TraceAccess)),
                ("model", c_char_p),
                ("cap_tensors", c_uint32), ("cap_kernels", c_uint32), ("cap_accesses", c_uint32)]


TraceP = POINTER(Trace)
tio_trace_create = _fn("tio_trace_create", c_int, c_char_p, POINTER(TraceP))
tio_trace_destroy = _fn("tio_trace_destroy", None, TraceP)
tio_tensor_kind_name = _fn("tio_tensor_kind_name", c_char_p, c_int)
tio_trace_add_tensor = _fn("tio_trace_add_tensor", c_int, TraceP, c_uint64, c_int, c_bool, c_char_p,
                           POINTER(c_uint32))
tio_trace_add_kernel = _fn("tio_trace_add_kernel", c_int, TraceP, c_char_p, c_uint64)
tio_trace_add_access = _fn("tio_trace_add_access", c_int, TraceP, c_uint32, c_uint8)
tio_trace_set_free_kernel = _fn("tio_trace_set_free_kernel", c_int, TraceP, c_uint32, c_uint32)
tio_trace_validate = _fn("tio_trace_validate", c_int, TraceP)
tio_trace_save = _fn("tio_trace_save", c_int, TraceP, c_char_p)
tio_trace_load = _fn("tio_trace_load", c_int, c_char_p, POINTER(TraceP))

# ---- lifetime ---------------------------------------------------------------
class Lifetime(Structure):
    _c_name = "tio_lifetime"
    _fields_ = [("n_kernels", c_uint32), ("n_tensors", c_uint32),
                ("memory_bytes", POINTER(c_uint64)), ("active_bytes", POINTER(c_uint64)),
                ("peak_bytes", c_uint64), ("peak_kernel", c_uint32), ("max_active_bytes", c_uint64),
                ("first_use", POINTER(c_uint32)), ("last_use", POINTER(c_uint32)),
                ("start_ns", POINTER(c_uint64)), ("n_periods", c_uint32), ("periods", c_void_p),
                ("tensor_bytes", POINTER(c_uint64)), ("floor_bytes", c_uint64),
                ("floor_kernel", c_uint32), ("max_active_kernel", c_uint32)]


LifetimeP = POINTER(Lifetime)
tio_lifetime_analyze = _fn("tio_lifetime_analyze", c_int, TraceP, POINTER(LifetimeP))
tio_lifetime_destroy = _fn("tio_lifetime_destroy", None, LifetimeP)


class FloorTensor(Structure):
    _c_name = "tio_floor_tensor"
    _fields_ = [("tensor", c_uint32), ("bytes", c_uint64), ("reason", c_int)]


tio_lifetime_floor_tensors = _fn("tio_lifetime_floor_tensors", c_int, TraceP, LifetimeP, POINTER(FloorTensor),
                                 c_uint32, POINTER(c_uint32))
tio_floor_reason_name = _fn("tio_floor_reason_name", c_char_p, c_int)

# ---- plan -------------------------------------------------------------------
PLANNERS = {"teraio": 0, "alg1": 1}


class PlanOptions(Structure):
    _c_name = "tio_plan_options"
    _fields_ = [("planner", c_int), ("capacity_bytes", c_uint64), ("ssd_read_gbps", c_double),
                ("ssd_write_gbps", c_double), ("host_to_device_gbps", c_double),
                ("device_to_host_gbps", c_double), ("host_cap_bytes", c_uint64),
                ("kind_mask", c_uint32), ("best_tier", c_bool), ("planned_stalls", c_bool),
                ("synchronous_moves", c_bool)]


class Migration(Structure):
    _c_name = "tio_migration"
    _fields_ = [("tensor", c_uint32), ("kind", c_int), ("trigger_kernel", c_uint32),
                ("deadline_kernel", c_uint32), ("tier", c_int), ("bytes", c_uint64)]


class Plan(Structure):
    _c_name = "tio_plan"
    _fields_ = [("n_kernels", c_uint32), ("n_tensors", c_uint32), ("capacity_bytes", c_uint64),
                ("n_migrations", c_uint32), ("migrations", POINTER(Migration)),
                ("planned_memory_bytes", POINTER(c_uint64)), ("planned_peak_bytes", c_uint64),
                ("peak_host_bytes", c_uint64), ("bytes_to_ssd", c_uint64), ("bytes_to_host", c_uint64),
                ("fits", c_bool), ("plan_seconds", c_double), ("predicted_stall_ns", c_uint64)]


PlanP = POINTER(Plan)
tio_plan_options_default = _fn("tio_plan_options_default", None, POINTER(PlanOptions))
tio_plan_build = _fn("tio_plan_build", c_int, TraceP, LifetimeP, POINTER(PlanOptions), POINTER(PlanP))
tio_plan_destroy = _fn("tio_plan_destroy", None, PlanP)
tio_plan_save = _fn("tio_plan_save", c_int, PlanP, c_char_p)
tio_plan_load = _fn("tio_plan_load", c_int, c_char_p, POINTER(PlanP))
tio_plan_check = _fn("tio_plan_check", c_int, PlanP, TraceP, LifetimeP)

# ---- simulator --------------------------------------------------------------
class Hw(Structure):
    _c_name = "tio_hw"
    _fields_ = [("name", ctypes.c_char * 64), ("capacity_bytes", c_uint64),
                ("pcie_h2d_gbps", c_double), ("pcie_d2h_gbps", c_double), ("ssd_count", c_uint32),
                ("ssd_read_gbps", c_double), ("ssd_write_gbps", c_double),
                ("ssd_array_read_gbps", c_double), ("ssd_array_write_gbps", c_double),
                ("ssd_latency_us", c_double), ("host_latency_us", c_double),
                ("host_cap_bytes", c_uint64), ("cpu_adam_params_per_s", c_double),
                ("gpu_matmul_tflops", c_double), ("gpu_vector_tflops", c_double),
                ("gpu_mem_gbps", c_double), ("matmul_efficiency", c_double),
                ("mem_efficiency", c_double), ("kernel_overhead_us", c_double),
                ("host_overhead_us", c_double), ("migration_host_ns_per_byte", c_double),
                ("gpu_matmul_16bit_tflops", c_double)]


class SimCalibration(Structure):
    _c_name = "tio_sim_calibration"
    _fields_ = [("calibration", PlanP), ("plan", PlanP), ("calibration_capacity_bytes", c_uint64),
                ("capacity_bytes", c_uint64), ("empty_s", c_double), ("calibration_s", c_double),
                ("measured_s", c_double), ("ssd_read_gbps", c_double), ("ssd_write_gbps", c_double)]


class SimFit(Structure):
    _c_name = "tio_sim_fit"
    _fields_ = [("hw", Hw), ("kernel_scale", c_double), ("kernels_s", c_double),
                ("simulated_s", c_double), ("measured_s", c_double), ("error", c_double)]


tio_hw_load = _fn("tio_hw_load", c_int, c_char_p, POINTER(Hw))
tio_sim_fit_host_costs = _fn("tio_sim_fit_host_costs", c_int, TraceP, LifetimeP,
                             POINTER(SimCalibration), POINTER(SimFit))

# ---- engine -----------------------------------------------------------------
class EngineOptions(Structure):
    _c_name = "tio_engine_options"
    _fields_ = [("dirs", POINTER(c_char_p)), ("n_dirs", c_uint32), ("space_bytes", c_uint64),
                ("stripe_bytes", c_uint32), ("queue_depth", c_uint32), ("request_bytes", c_uint32),
                ("backend", c_int), ("checksum", c_bool)]


class Extent(Structure):
    _c_name = "tio_extent"
    _fields_ = [("offset", c_uint64), ("bytes", c_uint64)]


EngineP = c_void_p
tio_engine_options_default = _fn("tio_engine_options_default", None, POINTER(EngineOptions))
tio_engine_create = _fn("tio_engine_create", c_int, POINTER(EngineOptions), POINTER(c_void_p))
tio_engine_destroy = _fn("tio_engine_destroy", None, c_void_p)
tio_engine_backend = _fn("tio_engine_backend", c_int, c_void_p)
tio_engine_backend_reason = _fn("tio_engine_backend_reason", c_char_p, c_void_p)
tio_backend_name = _fn("tio_backend_name", c_char_p, c_int)
tio_engine_alloc = _fn("tio_engine_alloc", c_int, c_void_p, c_uint64, POINTER(Extent))
tio_engine_free = _fn("tio_engine_free", c_int, c_void_p, POINTER(Extent))
tio_engine_write = _fn("tio_engine_write", c_int, c_void_p, POINTER(Extent), c_void_p, c_uint64)
tio_engine_read = _fn("tio_engine_read", c_int, c_void_p, POINTER(Extent), c_void_p, c_uint64)

# ---- gpu (include/teraio/gpu.h) ----------------------------------------------
class CudaInfo(Structure):
    _c_name = "tio_cuda_info"
    _fields_ = [("state", c_int), ("devices", c_int), ("runtime_version", c_int),
                ("driver_version", c_int), ("library", ctypes.c_char * 256), ("reason", ctypes.c_char * 320)]


class CufileInfo(Structure):
    _c_name = "tio_cufile_info"
    _fields_ = [("state", c_int), ("version", c_int), ("compat_mode", c_bool), ("compat_allowed", c_bool),
                ("batch", c_bool), ("max_batch_entries", c_uint32), ("library", ctypes.c_char * 256),
                ("reason", ctypes.c_char * 320)]


class EngineGpuOptions(Structure):
    _c_name = "tio_engine_gpu_options"
    _fields_ = [("device", c_int), ("pinned_bytes", c_uint64), ("chunk_bytes", c_uint64), ("path", c_int),
                ("probe_bytes", c_uint64)]


class EngineGpuStats(Structure):
    _c_name = "tio_engine_gpu_stats"
    _fields_ = [("pinned_bytes", c_uint64), ("chunk_bytes", c_uint64), ("slots_offload", c_uint32),
                ("slots_prefetch", c_uint32), ("slots_shared", c_bool), ("ring_fixed_buffer", c_bool),
                ("staged_offload_bytes", c_uint64), ("staged_prefetch_bytes", c_uint64),
                ("cufile_write_bytes", c_uint64), ("cufile_read_bytes", c_uint64),
                ("unchecked_bytes", c_uint64), ("copies", c_uint64), ("batches", c_uint64),
                ("max_batch_entries_used", c_uint32), ("cufile_compat_mode", c_bool)]


GPU_STATES = {0: "not built", 1: "unavailable", 2: "available"}
GPU_PATHS = {"auto": 0, "staging": 1, "cufile": 2}
tio_cuda_info_get = _fn("tio_cuda_info_get", None, POINTER(CudaInfo))
tio_cufile_info_get = _fn("tio_cufile_info_get", None, POINTER(CufileInfo))
tio_gpu_path_name = _fn("tio_gpu_path_name", c_char_p, c_int)
tio_engine_gpu_options_default = _fn("tio_engine_gpu_options_default", None, POINTER(EngineGpuOptions))
tio_engine_gpu_attach = _fn("tio_engine_gpu_attach", c_int, c_void_p, POINTER(EngineGpuOptions))
tio_engine_gpu_set_stream = _fn("tio_engine_gpu_set_stream", c_int, c_void_p, c_void_p)
tio_engine_gpu_dir_path = _fn("tio_engine_gpu_dir_path", c_int, c_void_p, c_uint32)
tio_engine_gpu_reason = _fn("tio_engine_gpu_reason", c_char_p, c_void_p)
tio_engine_gpu_get_stats = _fn("tio_engine_gpu_get_stats", None, c_void_p, POINTER(EngineGpuStats))
tio_engine_gpu_register_buffer = _fn("tio_engine_gpu_register_buffer", c_int, c_void_p, c_void_p, c_uint64)
tio_engine_gpu_unregister_buffer = _fn("tio_engine_gpu_unregister_buffer", c_int, c_void_p, c_void_p)
tio_engine_copy = _fn("tio_engine_copy", c_int, c_void_p, c_void_p, c_void_p, c_uint64)

# ---- runtime ----------------------------------------------------------------
ALLOCATE_FN = CFUNCTYPE(c_int, c_void_p, c_uint32, c_uint64, POINTER(c_void_p))
RELEASE_FN = CFUNCTYPE(c_int, c_void_p, c_uint32)
STAGE_FN = CFUNCTYPE(c_int, c_void_p, c_uint32, c_uint64, POINTER(c_void_p))
UNSTAGE_FN = CFUNCTYPE(c_int, c_void_p, c_uint32, c_bool)


class RuntimeCallbacks(Structure):
    _c_name = "tio_runtime_callbacks"
    _fields_ = [("ctx", c_void_p), ("allocate", ALLOCATE_FN), ("release", RELEASE_FN),
                ("stage_out", STAGE_FN), ("stage_in", STAGE_FN), ("unstage", UNSTAGE_FN)]


class RuntimeStats(Structure):
    _c_name = "tio_runtime_stats"
    _fields_ = [("bytes_offloaded", c_uint64), ("bytes_offloaded_ssd", c_uint64),
                ("bytes_offloaded_host", c_uint64), ("bytes_prefetched", c_uint64),
                ("bytes_fetched_urgent", c_uint64), ("n_offloads", c_uint64), ("n_prefetches", c_uint64),
                ("stalls", c_uint64), ("stall_ns", c_uint64), ("wait_ns", c_uint64),
                ("offloads_refused", c_uint64), ("resident_bytes", c_uint64),
                ("peak_resident_bytes", c_uint64), ("iterations", c_uint64), ("diverged", c_bool),
                ("diverged_kernel", c_uint32), ("diverged_iterations", c_uint64),
                ("fetches_outside", c_uint64), ("bytes_fetched_outside", c_uint64),
                ("over_capacity_kernels", c_uint64), ("over_capacity_bytes_max", c_uint64),
                ("capacity_bytes", c_uint64), ("peak_process_rss_bytes", c_uint64)]


tio_runtime_create = _fn("tio_runtime_create", c_int, PlanP, TraceP, c_void_p, POINTER(RuntimeCallbacks),
                         POINTER(c_void_p))
tio_runtime_destroy = _fn("tio_runtime_destroy", None, c_void_p)
tio_runtime_tensor_bind = _fn("tio_runtime_tensor_bind", c_int, c_void_p, c_uint32, c_void_p, c_uint64)
tio_runtime_tensor_unbind = _fn("tio_runtime_tensor_unbind", c_int, c_void_p, c_uint32)
tio_runtime_iteration_begin = _fn("tio_runtime_iteration_begin", c_int, c_void_p)
tio_runtime_iteration_end = _fn("tio_runtime_iteration_end", c_int, c_void_p)
tio_runtime_account_untracked = _fn("tio_runtime_account_untracked", c_int, c_void_p, c_int64)
tio_runtime_account_program = _fn("tio_runtime_account_program", c_int, c_void_p, c_uint64)
tio_runtime_kernel_begin = _fn("tio_runtime_kernel_begin", c_int, c_void_p, c_uint32, c_char_p)
tio_runtime_ensure_resident = _fn("tio_runtime_ensure_resident", c_int, c_void_p, c_uint32,
                                  POINTER(c_void_p))
tio_runtime_is_resident = _fn("tio_runtime_is_resident", c_bool, c_void_p, c_uint32)
tio_runtime_held_past_free = _fn("tio_runtime_held_past_free", c_int, c_void_p, c_uint32,
                                 POINTER(c_uint32), c_uint32)
tio_runtime_fetch_all = _fn("tio_runtime_fetch_all", c_int, c_void_p)
tio_runtime_get_stats = _fn("tio_runtime_get_stats", None, c_void_p, POINTER(RuntimeStats))
tio_runtime_tensor_bind_stored = _fn("tio_runtime_tensor_bind_stored", c_int, c_void_p, c_uint32, c_uint64,
                                     POINTER(Extent))
tio_runtime_tensor_detach = _fn("tio_runtime_tensor_detach", c_int, c_void_p, c_uint32, POINTER(c_bool),
                                POINTER(Extent))


CHECK_FN = CFUNCTYPE(c_int, c_void_p, c_uint32, c_void_p, c_uint64)


class PagerCallbacks(Structure):
    _c_name = "tio_pager_callbacks"
    _fields_ = [("ctx", c_void_p), ("allocate", ALLOCATE_FN), ("release", RELEASE_FN), ("check", CHECK_FN)]


class PagerStats(Structure):
    _c_name = "tio_pager_stats"
    _fields_ = [("capacity_bytes", c_uint64), ("resident_bytes", c_uint64), ("peak_resident_bytes", c_uint64),
                ("tracked_bytes", c_uint64), ("peak_tracked_bytes", c_uint64), ("evictions", c_uint64),
                ("bytes_evicted", c_uint64), ("fetches", c_uint64), ("bytes_fetched", c_uint64),
                ("io_ns", c_uint64), ("kernels", c_uint64), ("over_capacity_kernels", c_uint64),
                ("over_capacity_bytes_max", c_uint64), ("peak_process_rss_bytes", c_uint64)]


tio_pager_create = _fn("tio_pager_create", c_int, c_void_p, c_uint64, c_double, POINTER(PagerCallbacks),
                       POINTER(c_void_p))
tio_pager_destroy = _fn("tio_pager_destroy", None, c_void_p)
tio_pager_set_capacity = _fn("tio_pager_set_capacity", c_int, c_void_p, c_uint64, c_double)
tio_pager_kernel_begin = _fn("tio_pager_kernel_begin", c_int, c_void_p)
tio_pager_track = _fn("tio_pager_track", c_int, c_void_p, c_void_p, c_uint64, c_bool, POINTER(c_uint32))
tio_pager_track_stored = _fn("tio_pager_track_stored", c_int, c_void_p, c_uint64, POINTER(Extent),
                             POINTER(c_uint32))
tio_pager_forget = _fn("tio_pager_forget", c_int, c_void_p, c_uint32)
tio_pager_use = _fn("tio_pager_use", c_int, c_void_p, c_uint32, POINTER(c_void_p))
tio_pager_reserve = _fn("tio_pager_reserve", c_int, c_void_p, c_uint64)
tio_pager_fetch = _fn("tio_pager_fetch", c_int, c_void_p, c_uint32)
tio_pager_fetch_all = _fn("tio_pager_fetch_all", c_int, c_void_p)
tio_pager_is_resident = _fn("tio_pager_is_resident", c_bool, c_void_p, c_uint32)
tio_pager_detach = _fn("tio_pager_detach", c_int, c_void_p, c_uint32, POINTER(c_bool), POINTER(Extent))
tio_pager_get_stats = _fn("tio_pager_get_stats", None, c_void_p, POINTER(PagerStats))


# ---- tokenizer --------------------------------------------------------------
class TokSpecial(Structure):
    _c_name = "tio_tok_special"
    _fields_ = [("text", c_char_p), ("id", c_uint32)]


tio_tok_load_tiktoken = _fn("tio_tok_load_tiktoken", c_int, POINTER(c_void_p), c_char_p, c_char_p,
                            POINTER(TokSpecial), c_size_t)
tio_tok_load_encoding = _fn("tio_tok_load_encoding", c_int, POINTER(c_void_p), c_char_p, c_char_p)
tio_tok_load_hf = _fn("tio_tok_load_hf", c_int, POINTER(c_void_p), c_char_p)
tio_tok_parse_hf = _fn("tio_tok_parse_hf", c_int, POINTER(c_void_p), c_char_p, c_size_t)
tio_tok_destroy = _fn("tio_tok_destroy", None, c_void_p)
tio_tok_vocab_size = _fn("tio_tok_vocab_size", c_uint32, c_void_p)
tio_tok_special_id = _fn("tio_tok_special_id", c_int, c_void_p, c_char_p)
tio_tok_encode = _fn("tio_tok_encode", c_int, c_void_p, c_char_p, c_size_t, c_int, POINTER(c_uint32),
                     c_size_t, POINTER(c_size_t))
tio_tok_max_ids = _fn("tio_tok_max_ids", c_size_t, c_void_p, c_size_t)
tio_tok_encode_batch = _fn("tio_tok_encode_batch", c_int, c_void_p, POINTER(c_char_p), POINTER(c_size_t),
                           c_size_t, c_int, c_uint, POINTER(c_uint32), c_size_t, POINTER(c_size_t))
tio_tok_decode = _fn("tio_tok_decode", c_int, c_void_p, POINTER(c_uint32), c_size_t, c_char_p, c_size_t,
                     POINTER(c_size_t))
tio_tok_encoding_name = _fn("tio_tok_encoding_name", c_char_p, c_size_t)


# ---- data loader ------------------------------------------------------------
class DataTokenizer(Structure):
    _c_name = "tio_data_tokenizer"
    _fields_ = [("name", c_char_p), ("ctx", c_void_p), ("encode", c_void_p), ("vocab_size", c_uint32)]


class DatasetOptions(Structure):
    _c_name = "tio_dataset_options"
    _fields_ = [("tokenizer", POINTER(DataTokenizer)), ("text_field", c_char_p), ("jsonl_errors", c_int),
                ("llmc_delimiter", c_int64), ("tokenizer_threads", c_uint32),
                ("max_line_bytes", c_uint64), ("cache_bytes", c_uint64)]


class LoaderOptions(Structure):
    _c_name = "tio_loader_options"
    _fields_ = [("seq_len", c_uint32), ("rank", c_uint32), ("world_size", c_uint32), ("seed", c_uint64),
                ("logical_shards", c_uint32), ("shuffle_buffer", c_uint32), ("eos_id", c_uint32),
                ("bos", c_bool), ("bos_id", c_uint32), ("n_weights", c_uint32),
                ("weight_names", POINTER(c_char_p)), ("weights", POINTER(c_double)),
                ("prefetch", c_uint32), ("fill_threads", c_uint32)]


class DataSpan(Structure):
    _c_name = "tio_data_span"
    _fields_ = [("subdataset", c_uint32), ("file", c_uint32), ("doc", c_uint64), ("offset", c_uint32),
                ("length", c_uint32), ("epoch", c_uint32)]


class DataSample(Structure):
    _c_name = "tio_data_sample"
    _fields_ = [("index", c_uint64), ("seq_len", c_uint32), ("tokens", POINTER(c_uint32)),
                ("position_ids", POINTER(c_uint32)), ("n_segments", c_uint32),
                ("cu_seqlens", POINTER(c_uint32)), ("n_spans", c_uint32), ("spans", POINTER(DataSpan))]


class SubdatasetInfo(Structure):
    _c_name = "tio_data_subdataset_info"
    _fields_ = [("name", c_char_p), ("n_files", c_uint32), ("n_docs", c_uint64), ("bytes", c_uint64),
                ("n_tokens", c_uint64), ("lines_skipped", c_uint64), ("n_empty_docs", c_uint64)]


class DataPosition(Structure):
    _c_name = "tio_data_position"
    _fields_ = [("epoch", c_uint32), ("docs_consumed", c_uint64), ("docs_total", c_uint64),
                ("tokens_packed", c_uint64)]


tio_data_tokenizer_open = _fn("tio_data_tokenizer_open", c_int, c_char_p, c_char_p,
                              POINTER(POINTER(DataTokenizer)))
tio_data_tokenizer_close = _fn("tio_data_tokenizer_close", None, POINTER(DataTokenizer))
tio_dataset_options_default = _fn("tio_dataset_options_default", None, POINTER(DatasetOptions))
tio_dataset_open = _fn("tio_dataset_open", c_int, c_char_p, POINTER(DatasetOptions), POINTER(c_void_p))
tio_dataset_destroy = _fn("tio_dataset_destroy", None, c_void_p)
tio_dataset_n_subdatasets = _fn("tio_dataset_n_subdatasets", c_uint32, c_void_p)
tio_dataset_info = _fn("tio_dataset_info", c_int, c_void_p, c_uint32, POINTER(SubdatasetInfo))
tio_dataset_file_path = _fn("tio_dataset_file_path", c_char_p, c_void_p, c_uint32, c_uint32)
tio_loader_options_default = _fn("tio_loader_options_default", None, POINTER(LoaderOptions))
tio_loader_create = _fn("tio_loader_create", c_int, c_void_p, POINTER(LoaderOptions), POINTER(c_void_p),
                        POINTER(c_size_t), c_uint32, POINTER(c_void_p))
tio_loader_destroy = _fn("tio_loader_destroy", None, c_void_p)
tio_loader_next = _fn("tio_loader_next", c_int, c_void_p, POINTER(POINTER(DataSample)))
tio_loader_state = _fn("tio_loader_state", c_int, c_void_p, POINTER(c_void_p), POINTER(c_size_t))
tio_loader_save = _fn("tio_loader_save", c_int, c_void_p, c_char_p)
tio_loader_state_read = _fn("tio_loader_state_read", c_int, c_char_p, POINTER(c_void_p), POINTER(c_size_t))
tio_loader_position = _fn("tio_loader_position", c_int, c_void_p, c_uint32, POINTER(DataPosition))
tio_dataset_file_format = _fn("tio_dataset_file_format", c_char_p, c_void_p, c_uint32, c_uint32)
tio_dataset_doc_location = _fn("tio_dataset_doc_location", c_int, c_void_p, c_uint32, c_uint32,
                               c_uint64, POINTER(c_uint64), POINTER(c_uint64))
tio_data_parquet_available = _fn("tio_data_parquet_available", c_bool, POINTER(c_char_p))


def version() -> str:
    return tio_version().decode()


def features() -> str:
    return tio_features().decode()
