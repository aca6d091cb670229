/*
 * teraio/runtime.h — executes a plan while training runs.
 *
 * The framework adapter (python/teraio/torch) reports each kernel as it
 * begins and each tensor as it comes into existence or dies; the runtime
 * fires the plan's migrations for that kernel index:
 *
 *   kernel_begin(k):  1. offloads whose deadline is k: wait for the write,
 *                        then release the tensor's memory (callback);
 *                     2. prefetches whose deadline is k: wait for the read;
 *                     3. offloads triggered at k: submit the write;
 *                     4. prefetches triggered at k: allocate (callback),
 *                        submit the read.
 *                     A migration triggered and due at k is synchronous:
 *                     its wait (and, for an offload, the release) follows
 *                     its submission within the same call.
 *   ensure_resident:  a tensor needed now but not resident is fetched
 *                     urgently (ahead of queued I/O) and counted as a stall.
 *
 * Memory is released and re-allocated only through the adapter's callbacks,
 * so the framework's allocator stays in charge.  Offloads go to the tier the
 * plan names: TIO_TIER_SSD through the engine, TIO_TIER_HOST into a
 * malloc'ed host copy.  An offload that cannot get space (engine full,
 * e.g. fragmented) keeps the tensor resident, is counted in
 * offloads_refused and logged (the first refusal as a warning, later ones
 * at debug level).
 *
 * Divergence: kernel_begin() compares the kernel's name with the trace.  On
 * the first mismatch the runtime logs one warning, stops issuing planned
 * migrations and from then on fetches offloaded tensors on demand
 * (ensure_resident), so results stay correct.
 *
 * Thread-safety: one runtime is driven from one thread (the training
 * thread); callbacks are invoked on that thread, from inside runtime calls.
 */
#ifndef TERAIO_RUNTIME_H
#define TERAIO_RUNTIME_H

#include "teraio/plan.h"
#include "teraio/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    void *ctx;
    /* Allocate `bytes` of memory for `tensor` (its storage was released
     * earlier) and store the new address in *addr.  Return 0 or -errno. */
    int (*allocate)(void *ctx, uint32_t tensor, uint64_t bytes, void **addr);
    /* Release `tensor`'s memory: its bytes are safely stored elsewhere.
     * Return 0 or -errno. */
    int (*release)(void *ctx, uint32_t tensor);
    /* Optional staging, for memory the engine cannot address (device memory
     * without GPUDirect Storage).  All three NULL: the engine reads and
     * writes the tensor's own address.  All three set: every transfer goes
     * through a host buffer the adapter owns (pinned memory, as DESIGN.md's
     * staging path):
     *   stage_out: copy the tensor's current bytes into a host buffer of
     *              `bytes` bytes and store its address in *host_addr;
     *   stage_in:  provide a host buffer of `bytes` bytes to read into;
     *   unstage:   the transfer using the buffer is over; if `copy_in`, copy
     *              the buffer into the tensor's memory first; then free it.
     * Each returns 0 or -errno.  At most one buffer per tensor exists at a
     * time. */
    int (*stage_out)(void *ctx, uint32_t tensor, uint64_t bytes, void **host_addr);
    int (*stage_in)(void *ctx, uint32_t tensor, uint64_t bytes, void **host_addr);
    int (*unstage)(void *ctx, uint32_t tensor, bool copy_in);
} tio_runtime_callbacks;

typedef struct {
    uint64_t bytes_offloaded;     /* completed offloads, all tiers */
    uint64_t bytes_offloaded_ssd;
    uint64_t bytes_offloaded_host;
    uint64_t bytes_prefetched;    /* completed planned prefetches */
    uint64_t bytes_fetched_urgent;/* urgent (on-demand) fetches */
    uint64_t n_offloads, n_prefetches;
    uint64_t stalls;              /* ensure_resident calls that had to wait */
    uint64_t stall_ns;            /* time spent waiting in those */
    uint64_t wait_ns;             /* time spent waiting at deadlines */
    uint64_t offloads_refused;    /* no space: kept resident */
    uint64_t resident_bytes;      /* bound tensors currently resident */
    uint64_t peak_resident_bytes; /* high-water mark of resident_bytes */
    uint64_t iterations;          /* iteration_begin calls */
    bool diverged;                /* kernel sequence left the trace */
    uint32_t diverged_kernel;     /* where (valid if diverged) */
} tio_runtime_stats;

typedef struct tio_runtime tio_runtime;

/* Create a runtime for `plan` (checked against `trace`).  `engine` may be
 * NULL only if the plan has no SSD migrations.  The staging callbacks must
 * be all set or all NULL (else -EINVAL).  The runtime borrows plan and
 * trace: they must outlive it.  It holds a reference to the engine
 * (tio_engine_retain), dropped by tio_runtime_destroy, so the engine's
 * creator may destroy it first.
 * The engine must have room for the most SSD bytes the plan holds at once
 * (each SSD tensor 4 KiB-aligned, from its first offload on: a global one
 * for good, an intermediate one until its last use in the trace).
 * Returns 0; TIO_EUNKNOWN (plan names a tensor the trace lacks); -EINVAL;
 * -ENOSPC (the engine's free space is smaller: the message says how much is
 * needed); -ENOMEM. */
TIO_API int tio_runtime_create(const tio_plan *plan, const tio_trace *trace, tio_engine *engine,
                               const tio_runtime_callbacks *cb, tio_runtime **out);

/* Wait for in-flight I/O and free everything the runtime owns (SSD extents,
 * host copies).  Tensors still offloaded are NOT brought back: call
 * tio_runtime_fetch_all first if the framework still needs them. */
TIO_API void tio_runtime_destroy(tio_runtime *rt);

/* Tensor `tensor` (trace id) now exists and is resident at `addr` with
 * `bytes` bytes (must equal the trace's size).  Rebinding a bound tensor
 * replaces the address (a new allocation of the same id in a new
 * iteration).  Returns 0, TIO_EUNKNOWN, -EINVAL (size mismatch). */
TIO_API int tio_runtime_tensor_bind(tio_runtime *rt, uint32_t tensor, void *addr, uint64_t bytes);

/* Tensor `tensor` died: waits for its in-flight I/O, drops its stored copy.
 * Returns 0 or TIO_EUNKNOWN. */
TIO_API int tio_runtime_tensor_unbind(tio_runtime *rt, uint32_t tensor);

/* Start of a training iteration (kernel index restarts at 0).  The first
 * call also puts tensors where the plan's steady state has them at kernel 0:
 * a tensor whose wrap-around period has it on SSD/host across the iteration
 * boundary is offloaded now (synchronously: write, wait, release), and one
 * whose offload is still being written at kernel 0 has that write started,
 * so the first iteration already stays within the planned memory.
 * Returns 0 or a negative error of those offloads (message names the tensor). */
TIO_API int tio_runtime_iteration_begin(tio_runtime *rt);

/* Kernel k (name as in the trace) is about to run: fire its migrations.
 * Returns 0; 1 if this call detected divergence (on-demand mode from now
 * on); a negative error if a migration failed (message names the tensor). */
TIO_API int tio_runtime_kernel_begin(tio_runtime *rt, uint32_t k, const char *name);

/* Make `tensor` resident (urgent fetch if it is offloaded or still being
 * prefetched) and return its address in *addr (may be NULL).
 * Returns 0 (already resident), 1 (had to wait: a stall), TIO_EUNKNOWN
 * (unbound tensor), or a negative I/O error. */
TIO_API int tio_runtime_ensure_resident(tio_runtime *rt, uint32_t tensor, void **addr);

/* Is the tensor bound and resident right now?  (No I/O.) */
TIO_API bool tio_runtime_is_resident(const tio_runtime *rt, uint32_t tensor);

/* Bring every bound tensor back (end of training, checkpointing).
 * Returns 0 or the first error. */
TIO_API int tio_runtime_fetch_all(tio_runtime *rt);

TIO_API void tio_runtime_get_stats(const tio_runtime *rt, tio_runtime_stats *out);

#ifdef __cplusplus
}
#endif
#endif
