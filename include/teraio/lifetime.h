/*
 * teraio/lifetime.h — when each tensor is idle, and how much memory is live.
 *
 * From a trace: for every tensor, its inactive periods (gaps between two
 * consecutive uses longer than one kernel; for global tensors also the gap
 * that wraps from its last use in one iteration to its first use in the
 * next; for an intermediate tensor the program holds past its last use, the
 * tail from that use to its free), the memory curve M[k] (bytes that must
 * be resident at kernel k if nothing moves: global tensors always, intermediate tensors from their first
 * access to their last, or to the kernel before their free_kernel when the
 * trace records a later one), and the statistics the TERAIO paper
 * (arXiv 2506.06472, §2) reports about them.
 *
 * Ownership: a tio_lifetime owns its arrays.  Read-only after creation; safe
 * to read from many threads.
 */
#ifndef TERAIO_LIFETIME_H
#define TERAIO_LIFETIME_H

#include "teraio/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One inactive period of one tensor.  The tensor is used at kernel
 * `last_use` and next at kernel `next_use`; kernels last_use+1 .. next_use-1
 * do not touch it (next_use - last_use >= 2).  For a wrap-around period of a
 * global tensor, next_use is expressed in the *next* iteration's numbering
 * plus n_kernels, i.e. next_use = first_use + n_kernels > last_use, and
 * `wraps` is true.  A global tensor used by exactly one kernel k has one
 * wrap-around period (k, k + n_kernels), except in a one-kernel trace,
 * where no kernel lies between its uses.
 *
 * A tail period (`tail` true) is an intermediate tensor's time after its
 * last use while the program still holds it (a Python variable, a gradient
 * waiting for zero_grad, autograd's saved tensors): the trace records a
 * free_kernel >= last_use + 2, and next_use is that free_kernel (n_kernels
 * when it was still held at the end).  Nothing uses the tensor there, so a
 * plan moves it out with an offload and no prefetch (plan.h); it is the
 * tensor's last period.  Without free records there are no tails. */
typedef struct {
    uint32_t tensor;
    uint32_t last_use;     /* kernel index in [0, n_kernels) */
    uint32_t next_use;     /* kernel index, may be >= n_kernels when wraps; a tail's
                              free_kernel (<= n_kernels) */
    bool wraps;
    uint64_t bytes;        /* tensor size */
    uint64_t idle_ns;      /* sum of durations of kernels strictly between */
    bool tail;             /* no next use: the tensor is freed at next_use */
} tio_inactive_period;

typedef struct tio_lifetime {
    uint32_t n_kernels;
    uint32_t n_tensors;
    uint64_t *memory_bytes;      /* [n_kernels] M[k] */
    uint64_t *active_bytes;      /* [n_kernels] bytes accessed by kernel k */
    uint64_t peak_bytes;         /* max_k M[k] */
    uint32_t peak_kernel;        /* first k with M[k] == peak_bytes */
    uint64_t max_active_bytes;   /* max_k active_bytes[k] (<= floor_bytes) */
    uint32_t *first_use;         /* [n_tensors] first access kernel */
    uint32_t *last_use;          /* [n_tensors] last access kernel */
    uint64_t *start_ns;          /* [n_kernels + 1] prefix sums of durations */
    uint32_t n_periods;
    tio_inactive_period *periods;/* [n_periods], sorted by (tensor, last_use) */
    uint64_t *tensor_bytes;      /* [n_tensors] size of each tensor (copied from the
                                    trace, for the size statistics) */
    uint64_t floor_bytes;        /* the working-set floor: max_k of M[k] less the bytes
                                    of the inactive periods that cover k (tails
                                    included).  What kernel k accesses, plus what stays
                                    resident there with no period to move it in (a
                                    global tensor no kernel accesses).  No plan goes
                                    below it; >= max_active_bytes. */
    uint32_t floor_kernel;       /* first k where the floor is reached; what is held
                                    there without a period is floor_bytes -
                                    active_bytes[floor_kernel] */
    uint32_t max_active_kernel;  /* first k with active_bytes[k] == max_active_bytes
                                    (0 for a trace with no accesses) */
} tio_lifetime;

/* Analyse a valid trace.  Returns 0, TIO_EPARSE (trace fails validation),
 * -ENOMEM.  *out is owned by the caller (tio_lifetime_destroy). */
TIO_API int tio_lifetime_analyze(const tio_trace *trace, tio_lifetime **out);

TIO_API void tio_lifetime_destroy(tio_lifetime *lt);

/* Idle time in ns of kernels [from, to) where indices may run past
 * n_kernels (wrapping into the next iteration). */
TIO_API uint64_t tio_lifetime_span_ns(const tio_lifetime *lt, uint64_t from, uint64_t to);

/* Why a tensor stays resident at the floor kernel (tio_lifetime_floor_tensors). */
typedef enum {
    TIO_FLOOR_ACCESSED = 0,     /* the floor kernel reads or writes it */
    TIO_FLOOR_HELD_AFTER_LAST_USE = 1, /* an intermediate past its last use, not yet freed,
                                  with no period to move it in.  Not produced since tail
                                  periods exist (every such tensor has one); kept so that
                                  the values stay what they were */
    TIO_FLOOR_NEVER_ACCESSED = 2, /* a global tensor no kernel accesses (a frozen buffer) */
} tio_floor_reason;

typedef struct {
    uint32_t tensor;            /* trace tensor id */
    uint64_t bytes;
    tio_floor_reason reason;
} tio_floor_tensor;

/* Name of a reason ("accessed", "held after its last use", "never accessed"). */
TIO_API const char *tio_floor_reason_name(tio_floor_reason reason);

/* The tensors that make the working-set floor: resident at floor_kernel
 * with no inactive period there to move them in, the largest first (ties by
 * id); their bytes sum to floor_bytes.  Writes the first min(cap, total) to
 * `out` (may be NULL when cap is 0) and the total to *n.  `trace` must be the
 * analysed one.  Returns 0, -EINVAL (NULL trace, lifetime or n; a trace of
 * other sizes; out NULL with cap > 0), -ENOMEM.  Thread-safe (reads only). */
TIO_API int tio_lifetime_floor_tensors(const tio_trace *trace, const tio_lifetime *lt,
                                       tio_floor_tensor *out, uint32_t cap, uint32_t *n);

#define TIO_SIZE_BUCKETS 8
/* The paper's statistics. */
typedef struct {
    double mean_active_share;     /* mean over kernels of active_bytes[k] / peak */
    double max_active_share;      /* max over kernels of the same */
    uint64_t size_bucket_limit[TIO_SIZE_BUCKETS]; /* upper bound (bytes) of each bucket;
                                     the last is UINT64_MAX */
    uint32_t size_bucket_count[TIO_SIZE_BUCKETS]; /* tensors per size bucket:
                                     <1 MiB, <4, <16, <64, <256 MiB, <1 GiB, <4 GiB, rest */
    uint32_t n_periods;
    uint32_t n_periods_long;      /* periods with idle_ns >= round-trip time */
    double long_period_share;     /* n_periods_long / n_periods (0 if none) */
    double long_period_bytes_share; /* same, weighted by bytes */
} tio_lifetime_stats;

/* Statistics; a period is "long" if it lasts at least the time to write the
 * tensor to SSD and read it back: bytes / write_gbps + bytes / read_gbps
 * (GB/s = 1e9 bytes/s).  Returns 0 or -EINVAL (bandwidth <= 0). */
TIO_API int tio_lifetime_stats_compute(const tio_lifetime *lt, double ssd_read_gbps,
                                       double ssd_write_gbps, tio_lifetime_stats *out);

#ifdef __cplusplus
}
#endif
#endif
