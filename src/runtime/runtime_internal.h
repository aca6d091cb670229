/*
 * runtime/runtime_internal.h — what the runtime's files share: the tensor
 * table's entry, the runtime itself, and the calls one file makes into
 * another.  Who holds what:
 *   runtime.c        the state machine and the public calls that drive it
 *                    (kernel_begin's migration steps, ensure_resident,
 *                    bind/unbind, iteration begin/end and the placement at
 *                    kernel 0, held_past_free, fetch_all, stats), and the
 *                    accounting of resident memory;
 *   runtime_io.c     moving one tensor's bytes: the adapter's memory and
 *                    staging callbacks, the host-tier copies, the engine's
 *                    requests, their completions and their errors;
 *   runtime_build.c  create/destroy: checking the plan, and the tables
 *                    built once from it and the trace (the per-kernel
 *                    buckets, each tensor's end and place at kernel 0).
 * runtime.c and runtime_build.c call into runtime_io.c; runtime_io.c calls
 * back only rt_resident_add, so that every growth of resident memory is
 * checked in one place.  Nothing here is exported (the library is built
 * with -fvisibility=hidden); the rt_ prefix keeps these names clear of an
 * application's in the static library.
 */
#ifndef TERAIO_RUNTIME_INTERNAL_H
#define TERAIO_RUNTIME_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "teraio/runtime.h"

typedef enum {
    TENSOR_RESIDENT = 0,
    TENSOR_OFFLOADING,  /* stored copy being written / written; memory held */
    TENSOR_OFFLOADED,   /* memory released; bytes only in the stored copy */
    TENSOR_PREFETCHING, /* memory allocated; read in flight */
} tensor_state;

typedef enum {
    IO_NONE = 0,
    IO_WRITE,       /* planned offload to SSD */
    IO_READ,        /* planned prefetch from SSD */
    IO_READ_DEMAND, /* fetch on demand in an iteration, fetch_all, iteration_begin/end */
    IO_READ_OUTSIDE,/* fetch on demand between iterations */
} io_kind;

/* Where a tensor is at kernel 0 in the plan's steady state. */
typedef enum { AT0_RESIDENT = 0, AT0_WRITING, AT0_AWAY } initial_place;

typedef struct {
    void *addr;        /* valid unless OFFLOADED */
    uint64_t bytes;
    tensor_state state;
    tio_tier stored;   /* tier holding the copy while OFFLOADING/OFFLOADED/PREFETCHING */
    bool bound;
    bool has_extent;
    io_kind io;        /* engine request in flight, tag = tensor id */
    int err;           /* error of a completion reaped in passing, 0 if none */
    char *err_msg;     /* its message (malloc'ed), may be NULL */
    tio_extent extent;
    void *host_copy;   /* [bytes] once the tensor was offloaded to the host tier */
    void *io_addr;     /* staging buffer of the request in flight, or NULL */
    initial_place at0; /* steady-state place at kernel 0 */
    uint32_t end;      /* the kernel before which the trace frees it; n_kernels: never */
    bool listed;       /* in the runtime's `held` list */
    uint32_t at0_offload; /* the offload migration that puts it there (unless RESIDENT) */
} rt_tensor;

enum { B_OFFLOAD_DEADLINE, B_PREFETCH_DEADLINE, B_OFFLOAD_TRIGGER, B_PREFETCH_TRIGGER, B_COUNT };

struct tio_runtime {
    const tio_plan *plan;
    const tio_trace *trace;
    tio_engine *engine;
    tio_runtime_callbacks cb;
    rt_tensor *tensors;            /* [trace->n_tensors] */
    uint32_t *bucket_start[B_COUNT]; /* [n_kernels + 1] offsets into bucket_mig */
    uint32_t *bucket_mig[B_COUNT];   /* migration indices, grouped by kernel */
    tio_runtime_stats stats;
    pthread_t owner;               /* the only thread that may drive the runtime */
    bool in_iteration;             /* between iteration_begin and iteration_end */
    bool iter_diverged;            /* this iteration left the trace: no planned migrations */
    bool window_open;              /* a kernel's window is open (see runtime.c) */
    bool window_over;              /* ... and has been counted over the capacity */
    bool over_logged;              /* the first kernel over the capacity was logged */
    uint32_t window_kernel;        /* the kernel whose window is open */
    uint32_t next_kernel;          /* one past the last kernel_begin index of the iteration */
    uint64_t untracked_bytes;      /* tio_runtime_account_untracked total */
    uint64_t bound_bytes;          /* full size of every bound tensor, whatever its state */
    uint64_t program_bytes;        /* tio_runtime_account_program's value, for the next kernel */
    bool program_pending;          /* ... not yet applied */
    bool program_active;           /* ... applied, until iteration_end */
    uint64_t ssd_need_bytes;       /* the plan's SSD peak, checked at the first iteration_begin */
    bool space_checked;            /* ... and found to fit */
    uint32_t *end_start;           /* [n_kernels + 1] offsets into end_ids, by end kernel */
    uint32_t *end_ids;             /* intermediate tensors grouped by their end in the trace */
    uint32_t *held;                /* [n_tensors] bound tensors past their end (`listed`) */
    uint32_t n_held;
    uint32_t ends_seen;            /* end kernels [0, ends_seen) were walked this iteration */
};

/* ---- runtime.c: accounting ---- */

/* Add `bytes` to the resident bytes and check them against the peak and
 * the capacity if a kernel's window is open. */
void rt_resident_add(tio_runtime *rt, uint64_t bytes);

/* ---- runtime_io.c: a tensor's bytes, the adapter's callbacks, the engine ---- */

/* Forget the error a completion left on `t`. */
void rt_clear_pending_error(rt_tensor *t);

/* Report (and forget) the error a completion left on tensor `id`: returns
 * it, with its message as the last error, or 0 if there is none. */
int rt_take_error(tio_runtime *rt, uint32_t id);

/* Give tensor `id`'s memory back to the framework (release callback): it is
 * now OFFLOADED.  Returns 0 or the callback's error. */
int rt_release_tensor(tio_runtime *rt, uint32_t id);

/* The address the engine should write tensor `id`'s bytes from: its own
 * memory, or a staging buffer holding a copy of it (stage_out callback). */
int rt_stage_out(tio_runtime *rt, uint32_t id, void **addr);

/* The transfer through tensor `id`'s staging buffer is over; copy it into
 * the tensor first if `copy_in`.  No-op without staging. */
int rt_unstage(tio_runtime *rt, uint32_t id, bool copy_in);

/* Copy tensor `id`'s bytes between its memory and its host copy. */
int rt_copy_host_tier(tio_runtime *rt, uint32_t id, void *dst, const void *src);

/* One tio_engine_reap call; every completion is applied.  Returns the
 * number reaped or the engine's error. */
int rt_reap(tio_runtime *rt, uint32_t min_complete);

/* Wait until tensor `id` has no request in flight, adding the time spent to
 * *wait_ns (may be NULL).  The request's own error is left on the tensor
 * for rt_take_error; only an engine failure is returned here. */
int rt_wait_io(tio_runtime *rt, uint32_t id, uint64_t *wait_ns);

/* Wait for tensor `id`'s request and return its result. */
int rt_wait_result(tio_runtime *rt, uint32_t id, uint64_t *wait_ns);

/* An engine call for tensor `id` failed; the engine's message (if it left
 * one: callers clear the last error before the call) is kept. */
int rt_submit_failed(int rc, uint32_t id, const char *what);

/* Start bringing offloaded tensor `id` back: allocate, then copy from the
 * host tier (done at once) or submit the SSD read as `kind`. */
int rt_start_fetch(tio_runtime *rt, uint32_t id, io_kind kind, bool urgent);

/* runtime_build.c: does `need` bytes of SSD fit the engine?  whole_only:
 * against its whole space (at create); else against its free space plus
 * `own`, the stored copies the runtime holds already.  0, or -ENOSPC with
 * a message naming the space_bytes that would fit. */
int rt_check_ssd_space(tio_engine *engine, uint64_t need, uint64_t own, bool whole_only);

#endif
