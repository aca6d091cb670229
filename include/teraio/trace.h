/*
 * teraio/trace.h — the trace of one training iteration.
 *
 * A trace is what the profiler saw in one iteration (forward, backward,
 * optimizer step): the sequence of kernels (one per operator launch, with its
 * measured or modelled duration), the tensors (one per storage allocation,
 * identified by a stable id), and which tensors each kernel read and wrote.
 * Lifetime analysis and planning consume it; the file format is documented
 * in docs/formats.md ("teraio-trace", versions 1 to 3, line-oriented text).
 *
 * Ownership: a tio_trace owns all of its arrays and strings.  The struct is
 * public for reading; change it only through the tio_trace_* functions.
 * Thread-safety: a trace may be read from many threads at once; building or
 * destroying it needs exclusive access.
 */
#ifndef TERAIO_TRACE_H
#define TERAIO_TRACE_H

#include "teraio/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The newest file version this build reads (it reads 1 and 2 too) and
 * writes (only when some tensor has a free_kernel; otherwise it writes 1). */
#define TIO_TRACE_VERSION 3

/* What a tensor is for.  Parameters, gradients and optimizer states are
 * normally global tensors (alive across iterations); activations (saved in
 * the forward pass for the backward pass) and temporaries are intermediate. */
typedef enum {
    TIO_KIND_PARAMETER = 0,
    TIO_KIND_GRADIENT = 1,
    TIO_KIND_OPTIMIZER_STATE = 2,
    TIO_KIND_ACTIVATION = 3,
    TIO_KIND_TEMPORARY = 4,
} tio_tensor_kind;

/* Access mode bits of one kernel on one tensor. */
enum { TIO_ACCESS_READ = 1, TIO_ACCESS_WRITE = 2 };

typedef struct {
    uint32_t id;          /* stable id == index in tio_trace.tensors */
    uint64_t bytes;       /* storage size in bytes (> 0) */
    tio_tensor_kind kind;
    bool global;          /* lives across iterations (wrap-around periods) */
    char *name;           /* optional label ("layers.0.attn.wq"), may be NULL */
    /* Intermediate tensors: the kernel before which the storage was freed,
     * so its memory is held over [first access, free_kernel - 1], which may
     * run past the last access (a Python variable or autograd still holds
     * it); n_kernels: still held when the iteration ended.  0: not recorded,
     * the tensor is taken as freed right after its last access.  Global
     * tensors: always 0. */
    uint32_t free_kernel;
} tio_trace_tensor;

typedef struct {
    uint32_t tensor;      /* tensor id */
    uint8_t mode;         /* TIO_ACCESS_READ | TIO_ACCESS_WRITE bits, non-zero */
} tio_trace_access;

typedef struct {
    char *name;           /* operator name, e.g. "aten::mm" */
    uint64_t duration_ns; /* kernel time */
    uint32_t first_access;/* index into tio_trace.accesses */
    uint32_t n_accesses;  /* accesses of this kernel (each tensor at most once) */
} tio_trace_kernel;

typedef struct tio_trace {
    uint32_t n_tensors;
    tio_trace_tensor *tensors;   /* [n_tensors], tensors[i].id == i */
    uint32_t n_kernels;
    tio_trace_kernel *kernels;   /* [n_kernels], kernel k at index k */
    uint32_t n_accesses;
    tio_trace_access *accesses;  /* [n_accesses], grouped by kernel in order */
    char *model;                 /* free-text description, may be NULL */
    /* private: builder capacities */
    uint32_t cap_tensors, cap_kernels, cap_accesses;
} tio_trace;

/* Create an empty trace.  `model` (may be NULL) is copied; it must be one
 * line without control characters other than tab (it is stored on one line
 * of the trace file).  Returns 0, -EINVAL (bad model text), or -ENOMEM. */
TIO_API int tio_trace_create(const char *model, tio_trace **out);

/* Free a trace and everything it owns.  NULL is a no-op. */
TIO_API void tio_trace_destroy(tio_trace *trace);

/* Append a tensor; its id is the current n_tensors, returned in *id (which
 * may be NULL).  `bytes` must be > 0; `name` may be NULL and is copied; a
 * name must be one token: non-empty, no whitespace or control characters.
 * Returns 0, -EINVAL (bytes == 0, kind out of range, bad name), -ENOMEM. */
TIO_API int tio_trace_add_tensor(tio_trace *trace, uint64_t bytes, tio_tensor_kind kind,
                                 bool global, const char *name, uint32_t *id);

/* Append a kernel (index n_kernels) with its duration in nanoseconds.
 * `name` is copied and must be one token (no whitespace or control
 * characters).  Returns 0, -EINVAL (name NULL/empty/not one token), -ENOMEM
 * (also when the trace already has 2^31 - 1 kernels). */
TIO_API int tio_trace_add_kernel(tio_trace *trace, const char *name, uint64_t duration_ns);

/* Record that the most recently added kernel accesses `tensor` with `mode`
 * (READ/WRITE bits).  A second access to the same tensor by the same kernel
 * merges the mode bits.  Returns 0, -EINVAL (no kernel yet, mode 0),
 * TIO_EUNKNOWN (no such tensor), -ENOMEM. */
TIO_API int tio_trace_add_access(tio_trace *trace, uint32_t tensor, uint8_t mode);

/* Record that intermediate tensor `tensor` was freed before kernel `kernel`
 * (see free_kernel above; call it once the kernels are added).
 * Returns 0, TIO_EUNKNOWN (no such tensor), -EINVAL (a global tensor, kernel
 * 0 or past n_kernels).  That it lies after the last access is checked by
 * tio_trace_validate. */
TIO_API int tio_trace_set_free_kernel(tio_trace *trace, uint32_t tensor, uint32_t kernel);

/* Check internal consistency: every tensor accessed at least once, ids in
 * range, accesses grouped per kernel, each tensor at most once per kernel,
 * valid modes and names, total bytes and total duration below 2^64, a
 * free_kernel only on intermediate tensors, after their last access and at
 * most n_kernels.
 * Returns 0, TIO_EPARSE with the reason in tio_last_error(), or -ENOMEM. */
TIO_API int tio_trace_validate(const tio_trace *trace);

/* Write the trace to `path` atomically (temp file, fsync, rename).
 * Returns 0, TIO_EPARSE (the trace fails tio_trace_validate, so it could
 * not be loaded back), or -errno of the failing system call (message names
 * the file). */
TIO_API int tio_trace_save(const tio_trace *trace, const char *path);

/* Read a trace file.  On success *out owns a new trace.
 * Returns 0; -ENOENT/-EACCES/... (file); TIO_EPARSE (message names
 * "path:line: field 'x': expected ..."); TIO_EVERSION; -ENOMEM. */
TIO_API int tio_trace_load(const char *path, tio_trace **out);

/* Parse a trace from memory (`len` bytes, need not be NUL-terminated);
 * `origin` names it in error messages.  Same returns as tio_trace_load. */
TIO_API int tio_trace_parse(const char *text, size_t len, const char *origin, tio_trace **out);

/* Name of a kind ("parameter", "gradient", "optimizer_state", "activation",
 * "temporary"), or NULL if out of range. */
TIO_API const char *tio_tensor_kind_name(tio_tensor_kind kind);

/* Sum of duration_ns over all kernels. */
TIO_API uint64_t tio_trace_iteration_ns(const tio_trace *trace);

#ifdef __cplusplus
}
#endif
#endif
