/*
 * teraio/pager.h — keeps a capacity by moving memory on demand, without a plan.
 *
 * The runtime (runtime.h) executes a plan made from a profiled iteration.
 * The pager is what keeps the capacity before there is a plan: while the
 * iterations that make the trace are profiled.  Offloading is for the job
 * that does not fit, so these iterations must not hold the job's whole peak.
 *
 * The adapter registers each tensor's memory as it comes into being
 * (tio_pager_track), and before each kernel (tio_pager_kernel_begin) says
 * which tensors the kernel uses (tio_pager_use) and how many bytes it is
 * about to allocate (tio_pager_reserve).  Whenever the resident bytes would
 * exceed the capacity, the pager evicts the least recently used tensors that
 * the current kernel does not use (Belady's farthest-next-use needs the
 * future, which a profiled iteration does not have; LRU is its usual
 * stand-in, as in operating systems' demand paging).  An eviction writes the
 * tensor to the engine synchronously and then asks the adapter to release
 * its memory (callback); a tensor used again is brought back on demand
 * (allocate callback, synchronous read).  The stored copy's extent is kept
 * for the next eviction of the same tensor.
 *
 * The capacity: resident_bytes never exceeds it at the end of a call,
 * except where one kernel's own tensors (those it uses, plus what it
 * allocates) exceed it, which is counted (over_capacity_kernels).  Inside a
 * kernel, the bytes it allocates that tio_pager_reserve did not announce
 * are on top of the capacity until tio_pager_track evicts for them; that is
 * the pager's overhead, and peak_resident_bytes includes it.  The capacity
 * is bytes, or a share of the largest tracked bytes seen so far (a lower
 * bound of the iteration's peak), so that a share of a peak nobody has
 * measured yet is never exceeded.
 *
 * Every move is synchronous; io_ns is the time spent in them, so the
 * adapter can time kernels without their waits.
 *
 * Thread-safety: one pager is driven from the thread that created it; calls
 * from another thread are refused with -EPERM (no effect), except
 * tio_pager_destroy.  Callbacks run on that thread, inside pager calls.
 */
#ifndef TERAIO_PAGER_H
#define TERAIO_PAGER_H

#include "teraio/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The adapter's memory, by slot (the pager's handle of a tracked tensor).
 * allocate: give the tensor `bytes` of memory again and store its address
 * in *addr; release: free the tensor's memory (its bytes are stored).
 * Both return 0 or a negative errno; a release that fails leaves the tensor
 * resident, and it is never evicted again (memory the framework can no
 * longer free, such as a storage shared with numpy).
 * check (optional, NULL: skipped): called before an eviction writes the
 * tensor's `bytes` at `addr`; returns 0 if that is still its memory, 1 if
 * the framework changed it without the adapter seeing an operator (PyTorch
 * FSDP2 frees and re-allocates its unsharded parameters with
 * storage.resize_): the pager then forgets the slot, as tio_pager_forget,
 * without writing, and the adapter tracks that memory anew when it is next
 * used; a negative errno fails the eviction. */
typedef struct {
    void *ctx;
    int (*allocate)(void *ctx, uint32_t slot, uint64_t bytes, void **addr);
    int (*release)(void *ctx, uint32_t slot);
    int (*check)(void *ctx, uint32_t slot, void *addr, uint64_t bytes);
} tio_pager_callbacks;

typedef struct {
    uint64_t capacity_bytes;        /* the capacity in force now */
    uint64_t resident_bytes;        /* tracked tensors whose memory is held */
    uint64_t peak_resident_bytes;   /* the largest resident_bytes inside any call but
                                       tio_pager_fetch and tio_pager_fetch_all */
    uint64_t tracked_bytes;         /* tracked tensors, resident or evicted */
    uint64_t peak_tracked_bytes;    /* the largest tracked_bytes (the memory without the pager) */
    uint64_t evictions, bytes_evicted;
    uint64_t fetches, bytes_fetched;
    uint64_t io_ns;                 /* time in the synchronous writes and reads */
    uint64_t kernels;               /* tio_pager_kernel_begin calls */
    uint64_t over_capacity_kernels; /* kernels whose own tensors exceeded the capacity */
    uint64_t over_capacity_bytes_max;
    uint64_t peak_process_rss_bytes; /* the process's resident set as the OS counts it, the
                                        largest sampled at a kernel_begin (0: unreadable) */
} tio_pager_stats;

typedef struct tio_pager tio_pager;

/* A pager over `engine` (retained until destroy) for a capacity of
 * `capacity_bytes`, or, with `capacity_share` in (0, 1], of
 * max(capacity_bytes, capacity_share * peak_tracked_bytes).  Returns 0,
 * -EINVAL (NULL engine, callbacks or out; a capacity of 0 with no share; a
 * share outside (0, 1]), -ENOMEM. */
TIO_API int tio_pager_create(tio_engine *engine, uint64_t capacity_bytes, double capacity_share,
                             const tio_pager_callbacks *cb, tio_pager **out);

/* Free the pager and the engine space of its stored copies.  Evicted
 * tensors are not brought back: call tio_pager_fetch_all (or detach them)
 * first if the adapter still needs their bytes. */
TIO_API void tio_pager_destroy(tio_pager *p);

/* Change the capacity (as tio_pager_create's arguments); it applies from the
 * next call that makes room.  Returns 0, -EINVAL, -EPERM. */
TIO_API int tio_pager_set_capacity(tio_pager *p, uint64_t capacity_bytes, double capacity_share);

/* A new kernel: the tensors the previous one used may be evicted again.
 * Returns 0, -EINVAL (NULL), -EPERM. */
TIO_API int tio_pager_kernel_begin(tio_pager *p);

/* Track `bytes` of resident memory at `addr` (a tensor just made, or one
 * the adapter sees first), used by the current kernel; *slot receives its
 * handle.  `movable` false: counted, never evicted (memory the adapter
 * cannot release).  Then makes room: evicts others until the capacity
 * holds (when the engine's space is full, what does not fit stays
 * resident, over the capacity, logged once).  Returns 0, -EINVAL (NULL addr
 * or slot, bytes 0), -EPERM, -ENOMEM, or the I/O error of an eviction (the
 * tensor is tracked all the same, and the memory stays resident). */
TIO_API int tio_pager_track(tio_pager *p, void *addr, uint64_t bytes, bool movable, uint32_t *slot);

/* Track a tensor whose memory is released and whose bytes are stored in
 * `extent` of the pager's engine (a tensor the plan's runtime offloaded,
 * handed over with tio_runtime_tensor_detach when an iteration leaves its
 * plan): it is evicted, and the pager owns the extent from now on.  It comes
 * back on its next tio_pager_use.  Returns 0, -EINVAL (NULL extent or slot,
 * bytes 0, an extent smaller than bytes), -EPERM, -ENOMEM. */
TIO_API int tio_pager_track_stored(tio_pager *p, uint64_t bytes, const tio_extent *extent, uint32_t *slot);

/* The tensor of `slot` died (the framework freed it): forgotten, its
 * stored copy's space returned; the slot may be handed out again.  Returns
 * 0, -EINVAL (no such slot), -EPERM. */
TIO_API int tio_pager_forget(tio_pager *p, uint32_t slot);

/* The current kernel uses `slot`: it may not be evicted until the next
 * kernel_begin; if it is evicted, room is made and it is fetched back
 * (allocate callback, read).  *addr (may be NULL) receives its address.
 * Returns 0 (resident), 1 (fetched), -EINVAL (no such slot), -EPERM, or an
 * allocation or I/O error (the tensor stays evicted, its copy intact). */
TIO_API int tio_pager_use(tio_pager *p, uint32_t slot, void **addr);

/* The current kernel is about to allocate `bytes`: make room for them now
 * (evicting what it does not use).  Returns 0, -EPERM, or an eviction's
 * error. */
TIO_API int tio_pager_reserve(tio_pager *p, uint64_t bytes);

/* Bring `slot` back if it is evicted, whatever the capacity, evicting
 * nothing: for a read between steps (the program's, outside any kernel).
 * It does not count toward peak_resident_bytes or the kernels over the
 * capacity, which describe kernels.  Returns 0 (resident), 1 (fetched),
 * -EINVAL (no such slot), -EPERM, or an allocation or I/O error (the tensor
 * stays evicted, its copy intact). */
TIO_API int tio_pager_fetch(tio_pager *p, uint32_t slot);

/* Bring every evicted tensor back, whatever the capacity (checkpointing,
 * the end of profiling); like tio_pager_fetch, not counted toward
 * peak_resident_bytes.  Returns 0, -EPERM, or the first error. */
TIO_API int tio_pager_fetch_all(tio_pager *p);

/* Is the tensor of `slot` tracked and resident?  (No I/O, owner thread.) */
TIO_API bool tio_pager_is_resident(const tio_pager *p, uint32_t slot);

/* Hand a tracked tensor over to its next owner (the runtime of a plan, with
 * tio_runtime_tensor_bind_stored): the slot is forgotten without freeing
 * its stored copy.  *resident says whether its memory is held; if not,
 * *extent is the engine extent holding its bytes, which the caller now
 * owns (tio_engine_free when done).  Returns 0, -EINVAL (no such slot, NULL
 * out pointers), -EPERM. */
TIO_API int tio_pager_detach(tio_pager *p, uint32_t slot, bool *resident, tio_extent *extent);

/* The pager's counters (tio_pager_stats: bytes, ns, counts) copied into
 * *out; capacity_bytes is the capacity in force now.  Nothing happens when
 * p or out is NULL.  Owner thread (not checked: no error to return). */
TIO_API void tio_pager_get_stats(const tio_pager *p, tio_pager_stats *out);

#ifdef __cplusplus
}
#endif
#endif
