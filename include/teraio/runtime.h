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
 * Divergence: kernel_begin() compares the kernel's name with the trace, and
 * tensor_bind() the tensor's id and size; an iteration that ends with a
 * different number of kernels diverged too.  On the first mismatch of an
 * iteration the runtime logs it (a warning the first time in the process,
 * then at info level), stops issuing planned migrations for the rest of
 * that iteration and fetches offloaded tensors on demand (ensure_resident),
 * so results stay correct.  A tensor whose size differs from the trace is never bound,
 * released or resized.  The next iteration_begin tries the plan again.
 *
 * Iterations: iteration_begin() .. iteration_end().  Between two iterations
 * the tensors the plan keeps away across the boundary stay offloaded; a use
 * there goes through ensure_resident (counted in fetches_outside) and the
 * next iteration_begin puts the tensor back where the plan has it at kernel
 * 0.  Intermediate tensors are only bound within an iteration:
 * iteration_end() makes every one still bound resident and unbinds it (a
 * tensor the program keeps, such as its input batch or the loss, is never
 * moved again).
 *
 * The capacity (the plan's capacity_bytes): resident_bytes at each kernel is
 * its value after kernel_begin(k) plus every allocation made until the next
 * kernel_begin or iteration_end (ensure_resident, tensor_bind,
 * account_untracked, account_program).  peak_resident_bytes is the largest such value over
 * all kernels, so memory held between iterations (a fetch outside an
 * iteration) and before the first kernel does not count.  A kernel over the
 * capacity is counted (over_capacity_kernels, over_capacity_bytes_max) and
 * the first is logged (a warning the first time in the process, then at info
 * level), with what the runtime knows of why.
 *
 * Thread-safety: one runtime is driven from one thread, the one that created
 * it; every call from another thread except tio_runtime_destroy is refused
 * with -EPERM (no effect).  Callbacks are invoked on that thread, from
 * inside runtime calls.
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
    uint64_t bytes_fetched_urgent;/* urgent (on-demand) fetches in iterations, fetch_all */
    uint64_t n_offloads, n_prefetches;
    uint64_t stalls;              /* ensure_resident calls in an iteration that had to wait */
    uint64_t stall_ns;            /* time spent waiting in those */
    uint64_t wait_ns;             /* time spent waiting at deadlines */
    uint64_t offloads_refused;    /* no space: kept resident */
    uint64_t resident_bytes;      /* bound tensors currently resident, plus untracked bytes */
    uint64_t peak_resident_bytes; /* largest resident_bytes at any kernel */
    uint64_t iterations;          /* iteration_begin calls */
    bool diverged;                /* some iteration left the trace */
    uint32_t diverged_kernel;     /* where the last one did (valid if diverged) */
    uint64_t diverged_iterations; /* iterations that left the trace */
    uint64_t fetches_outside;     /* ensure_resident fetches between iterations */
    uint64_t bytes_fetched_outside;
    uint64_t over_capacity_kernels;   /* kernels whose resident bytes exceeded the capacity */
    uint64_t over_capacity_bytes_max; /* largest excess over the capacity */
    uint64_t capacity_bytes;      /* the plan's capacity */
    uint64_t peak_process_rss_bytes; /* the process's resident set as the OS counts it (Linux:
                                        /proc/self/statm), the largest sampled at a kernel_begin
                                        of an iteration; 0 where it cannot be read */
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
 * for good, an intermediate one until it dies, at its free kernel or else
 * its last use in the trace).
 * Returns 0; TIO_EPARSE (the trace fails tio_trace_validate); TIO_EUNKNOWN
 * (plan names a tensor the trace lacks); -EINVAL;
 * -ENOSPC (the engine's whole space is smaller: the message says how much
 * is needed; free space is checked at the first iteration_begin, when the
 * stored copies handed over count); -ENOMEM. */
TIO_API int tio_runtime_create(const tio_plan *plan, const tio_trace *trace, tio_engine *engine,
                               const tio_runtime_callbacks *cb, tio_runtime **out);

/* Wait for in-flight I/O and free everything the runtime owns (SSD extents,
 * host copies).  Tensors still offloaded are NOT brought back: call
 * tio_runtime_fetch_all first if the framework still needs them. */
TIO_API void tio_runtime_destroy(tio_runtime *rt);

/* Tensor `tensor` (trace id) now exists and is resident at `addr` with
 * `bytes` bytes.  Rebinding a bound tensor replaces the address (a new
 * allocation of the same id).  A tensor the trace does not have (id out of
 * range) or of another size is not bound: the iteration diverged.
 * Returns 0 (bound), 1 (not bound; divergence, see above), -EINVAL (NULL
 * address), -EPERM (another thread), or an error of waiting for the old
 * binding's I/O. */
TIO_API int tio_runtime_tensor_bind(tio_runtime *rt, uint32_t tensor, void *addr, uint64_t bytes);

/* Tensor `tensor` died: waits for its in-flight I/O, drops its stored copy.
 * Returns 0, TIO_EUNKNOWN (not bound), -EPERM (another thread). */
TIO_API int tio_runtime_tensor_unbind(tio_runtime *rt, uint32_t tensor);

/* Bind `tensor` whose memory is released and whose bytes are stored in
 * `extent` of the runtime's engine (a tensor the pager evicted,
 * tio_pager_detach): it is OFFLOADED, and the runtime owns the extent from
 * now on.  It comes back like any offloaded tensor (allocate callback, at
 * iteration_begin where the plan has it resident, or on demand).  Returns 0,
 * -EINVAL (no such tensor, another size than the trace's, NULL extent, no
 * engine), -EPERM (another thread), or an error of unbinding what was bound
 * there before. */
TIO_API int tio_runtime_tensor_bind_stored(tio_runtime *rt, uint32_t tensor, uint64_t bytes,
                                           const tio_extent *extent);

/* Hand bound tensor `tensor` over to its next owner (the pager, with
 * tio_pager_track_stored, when an iteration leaves its plan and the
 * capacity is kept on demand): its I/O is waited for, a copy on the host
 * tier is read back first, and the tensor is unbound without freeing an SSD
 * copy.  *resident says whether its memory is held; if not, *extent is the
 * engine extent holding its bytes, which the caller now owns (free it with
 * tio_engine_free when done).  Returns 0, TIO_EUNKNOWN (not bound), -EINVAL
 * (NULL out pointers), -EPERM (another thread), or an error of its I/O
 * (the tensor stays bound). */
TIO_API int tio_runtime_tensor_detach(tio_runtime *rt, uint32_t tensor, bool *resident,
                                      tio_extent *extent);

/* Start of a training iteration (kernel index restarts at 0).  The first
 * call also puts tensors where the plan's steady state has them at kernel 0:
 * a tensor whose wrap-around period has it on SSD/host across the iteration
 * boundary is offloaded now (synchronously: write, wait, release), and one
 * whose offload is still being written at kernel 0 has that write started,
 * so the first iteration already stays within the planned memory.  Every
 * later call does the same for tensors used between iterations (fetched on
 * demand there), and starts reading back a tensor the plan has resident at
 * kernel 0 that a diverged iteration left offloaded.
 * The first call also checks that the plan's SSD peak fits the engine's
 * free space plus the stored copies bound with tio_runtime_tensor_bind_stored
 * (create refuses only a plan larger than the whole engine).
 * Returns 0, -EPERM (another thread), -ENOSPC (the plan does not fit the
 * engine's free space; message names the space_bytes that would), or a
 * negative error of those migrations (message names the tensor). */
TIO_API int tio_runtime_iteration_begin(tio_runtime *rt);

/* End of the iteration begun by the last iteration_begin: an iteration that
 * ran another number of kernels than the trace has diverged; every bound
 * intermediate tensor is made resident and unbound; untracked bytes are
 * forgotten.  Returns 0, -EPERM, -EINVAL (no iteration begun), or the first
 * error of bringing a tensor back. */
TIO_API int tio_runtime_iteration_end(tio_runtime *rt);

/* Memory the adapter sees but the plan does not manage (tensors allocated
 * in an iteration after it diverged, or whose size differs from the trace):
 * `delta_bytes` is added to resident_bytes (negative: removed) and counts
 * against the capacity like any tensor; such memory is never moved.
 * iteration_end() forgets what is left.  Returns 0, -EPERM, -EINVAL (more
 * removed than was added). */
TIO_API int tio_runtime_account_untracked(tio_runtime *rt, int64_t delta_bytes);

/* What a program whose buffers the adapter cannot see one by one holds (a
 * compiled program: the most its code holds from one kernel_begin call to
 * the next), for the capacity accounting: `held_bytes` counts every bound
 * tensor at its full size, as if nothing were released.  It takes effect at
 * the next tio_runtime_kernel_begin, before that kernel's window opens: the
 * untracked total becomes held_bytes less the bytes of every bound tensor
 * (0 if they are more), so resident_bytes is held_bytes less what the
 * runtime has released, plus what it brings back inside the window.  It
 * stays in effect until the next call or iteration_end (a tensor bound or
 * unbound meanwhile is one the program's bytes count already: the untracked
 * total follows), and replaces what tio_runtime_account_untracked added.  Returns 0, -EINVAL (NULL runtime,
 * or no iteration begun), -EPERM (another thread). */
TIO_API int tio_runtime_account_program(tio_runtime *rt, uint64_t held_bytes);

/* Kernel k (name as in the trace) is about to run: fire its migrations.
 * Returns 0; 1 if this call detected divergence (on-demand mode for the
 * rest of the iteration); -EPERM (another thread); a negative error if a
 * migration failed (message names the tensor). */
TIO_API int tio_runtime_kernel_begin(tio_runtime *rt, uint32_t k, const char *name);

/* Make `tensor` resident (urgent fetch if it is offloaded or still being
 * prefetched) and return its address in *addr (may be NULL).  In an
 * iteration a wait is a stall; between iterations a fetch is counted in
 * fetches_outside.
 * Returns 0 (already resident), 1 (had to wait), TIO_EUNKNOWN (unbound
 * tensor), -EPERM (another thread), or a negative I/O error. */
TIO_API int tio_runtime_ensure_resident(tio_runtime *rt, uint32_t tensor, void **addr);

/* Intermediate tensors still bound although the trace has them freed
 * before kernel k begins (at their free_kernel, or right after their last
 * access when the trace records no free).  Their memory counts in kernel
 * k's window like any other, which the plan did not foresee.  A Python
 * adapter mostly sees here a storage whose last reference another thread
 * (a collective's worker) is about to drop once it gets the GIL: before
 * kernel_begin(k) it can yield the GIL and unbind what died.
 * Writes up to `cap` of their ids to `ids` (NULL allowed with cap 0), in no
 * particular order.  Call with k not decreasing within an iteration (a
 * smaller k than before reports the tensors of the larger one).  Costs the
 * tensors whose end is new since the last call, plus those held.
 * Returns how many there are (0 outside an iteration and once the iteration
 * diverged), -EINVAL (NULL runtime; ids NULL with cap > 0), -EPERM (another
 * thread). */
TIO_API int tio_runtime_held_past_free(tio_runtime *rt, uint32_t k, uint32_t *ids, uint32_t cap);

/* Is the tensor bound and resident right now?  (No I/O.)  Like get_stats,
 * for the owning thread only (not checked: no error to return). */
TIO_API bool tio_runtime_is_resident(const tio_runtime *rt, uint32_t tensor);

/* Bring every bound tensor back (end of training, checkpointing).
 * Returns 0, -EPERM (another thread), or the first error. */
TIO_API int tio_runtime_fetch_all(tio_runtime *rt);

TIO_API void tio_runtime_get_stats(const tio_runtime *rt, tio_runtime_stats *out);

#ifdef __cplusplus
}
#endif
#endif
