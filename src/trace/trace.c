/*
 * trace/trace.c — the trace data model: building a trace in memory and
 * checking that it is consistent.
 *
 * A trace is three flat arrays (tensors, kernels, accesses) rather than a
 * graph of small objects: a paper-scale iteration has ~100k kernels and ~1M
 * accesses, and every consumer (lifetime analysis, planner, simulator) walks
 * the accesses in kernel order.  The accesses of kernel k are the slice
 * accesses[first_access .. first_access + n_accesses), so appending an access
 * always extends the most recently added kernel.
 *
 * File reading and writing live in trace_io.c.
 */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "teraio/trace.h"
#include "trace/trace_internal.h"

static const char *const kind_names[] = {
    [TIO_KIND_PARAMETER] = "parameter",
    [TIO_KIND_GRADIENT] = "gradient",
    [TIO_KIND_OPTIMIZER_STATE] = "optimizer_state",
    [TIO_KIND_ACTIVATION] = "activation",
    [TIO_KIND_TEMPORARY] = "temporary",
};

const char *tio_tensor_kind_name(tio_tensor_kind kind)
{
    if ((unsigned)kind > TIO_KIND_TEMPORARY)
        return NULL;
    return kind_names[kind];
}

static char *copy_string(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

int tio_trace_create(const char *model, tio_trace **out)
{
    if (!out)
        return tio_fail(-EINVAL, "tio_trace_create: out is NULL");
    *out = NULL;
    if (model && !tio_trace_model_ok(model, strlen(model)))
        return tio_fail(-EINVAL, "trace model text must be one line without control characters");
    tio_trace *t = calloc(1, sizeof *t);
    if (!t)
        return tio_fail(-ENOMEM, "out of memory creating a trace");
    if (model && !(t->model = copy_string(model))) {
        free(t);
        return tio_fail(-ENOMEM, "out of memory creating a trace");
    }
    *out = t;
    return 0;
}

void tio_trace_destroy(tio_trace *trace)
{
    if (!trace)
        return;
    for (uint32_t i = 0; i < trace->n_tensors; i++)
        free(trace->tensors[i].name);
    for (uint32_t k = 0; k < trace->n_kernels; k++)
        free(trace->kernels[k].name);
    free(trace->tensors);
    free(trace->kernels);
    free(trace->accesses);
    free(trace->model);
    free(trace);
}

int tio_trace_add_tensor(tio_trace *trace, uint64_t bytes, tio_tensor_kind kind, bool global,
                         const char *name, uint32_t *id)
{
    if (!trace)
        return tio_fail(-EINVAL, "tio_trace_add_tensor: trace is NULL");
    if (bytes == 0)
        return tio_fail(-EINVAL, "tensor %u: size must be > 0 bytes", trace->n_tensors);
    if ((unsigned)kind > TIO_KIND_TEMPORARY)
        return tio_fail(-EINVAL, "tensor %u: kind %d out of range", trace->n_tensors, (int)kind);
    if (name && !tio_trace_name_ok(name, strlen(name)))
        return tio_fail(-EINVAL, "tensor %u: name must be non-empty without whitespace",
                        trace->n_tensors);
    if (trace->n_tensors == UINT32_MAX)
        return tio_fail(-ENOMEM, "trace has the most tensors an id can number");
    int rc = tio_grow((void **)&trace->tensors, &trace->cap_tensors, trace->n_tensors + 1,
                      sizeof *trace->tensors);
    if (rc)
        return rc;
    char *copy = NULL;
    if (name && !(copy = copy_string(name)))
        return tio_fail(-ENOMEM, "out of memory adding tensor %u", trace->n_tensors);
    tio_trace_tensor *t = &trace->tensors[trace->n_tensors];
    t->id = trace->n_tensors;
    t->bytes = bytes;
    t->kind = kind;
    t->global = global;
    t->name = copy;
    t->free_kernel = 0;
    if (id)
        *id = t->id;
    trace->n_tensors++;
    return 0;
}

int tio_trace_add_kernel(tio_trace *trace, const char *name, uint64_t duration_ns)
{
    if (!trace)
        return tio_fail(-EINVAL, "tio_trace_add_kernel: trace is NULL");
    if (!name || !tio_trace_name_ok(name, strlen(name)))
        return tio_fail(-EINVAL, "kernel %u: name must be non-empty without whitespace",
                        trace->n_kernels);
    if (trace->n_kernels >= TIO_TRACE_MAX_KERNELS)
        return tio_fail(-ENOMEM, "trace has the most kernels it may hold (%u)",
                        TIO_TRACE_MAX_KERNELS);
    int rc = tio_grow((void **)&trace->kernels, &trace->cap_kernels, trace->n_kernels + 1,
                      sizeof *trace->kernels);
    if (rc)
        return rc;
    char *copy = copy_string(name);
    if (!copy)
        return tio_fail(-ENOMEM, "out of memory adding kernel %u", trace->n_kernels);
    tio_trace_kernel *k = &trace->kernels[trace->n_kernels];
    k->name = copy;
    k->duration_ns = duration_ns;
    k->first_access = trace->n_accesses;
    k->n_accesses = 0;
    trace->n_kernels++;
    return 0;
}

int tio_trace_add_access(tio_trace *trace, uint32_t tensor, uint8_t mode)
{
    if (!trace)
        return tio_fail(-EINVAL, "tio_trace_add_access: trace is NULL");
    if (trace->n_kernels == 0)
        return tio_fail(-EINVAL, "access to tensor %u before any kernel was added", tensor);
    uint32_t k = trace->n_kernels - 1;
    if (mode == 0 || (mode & ~(TIO_ACCESS_READ | TIO_ACCESS_WRITE)))
        return tio_fail(-EINVAL, "kernel %u: access mode %u is not READ/WRITE bits", k, mode);
    if (tensor >= trace->n_tensors)
        return tio_fail(TIO_EUNKNOWN, "kernel %u: access to unknown tensor %u (%u tensors)", k,
                        tensor, trace->n_tensors);
    /* A kernel touches few tensors (an optimizer step over all parameters is
     * the worst case, a few thousand), so a scan of its own accesses is
     * cheaper than keeping a per-tensor index inside the public struct. */
    tio_trace_kernel *kern = &trace->kernels[k];
    tio_trace_access *a = trace->accesses + kern->first_access;
    for (uint32_t i = 0; i < kern->n_accesses; i++) {
        if (a[i].tensor == tensor) {
            a[i].mode |= mode;
            return 0;
        }
    }
    if (trace->n_accesses == UINT32_MAX)
        return tio_fail(-ENOMEM, "trace has the most accesses it may hold");
    int rc = tio_grow((void **)&trace->accesses, &trace->cap_accesses, trace->n_accesses + 1,
                      sizeof *trace->accesses);
    if (rc)
        return rc;
    trace->accesses[trace->n_accesses].tensor = tensor;
    trace->accesses[trace->n_accesses].mode = mode;
    trace->n_accesses++;
    kern->n_accesses++;
    return 0;
}

int tio_trace_set_free_kernel(tio_trace *trace, uint32_t tensor, uint32_t kernel)
{
    if (!trace)
        return tio_fail(-EINVAL, "tio_trace_set_free_kernel: trace is NULL");
    if (tensor >= trace->n_tensors)
        return tio_fail(TIO_EUNKNOWN, "free kernel of unknown tensor %u (%u tensors)", tensor,
                        trace->n_tensors);
    if (trace->tensors[tensor].global)
        return tio_fail(-EINVAL, "tensor %u: a global tensor has no free kernel", tensor);
    if (kernel == 0 || kernel > trace->n_kernels)
        return tio_fail(-EINVAL, "tensor %u: free kernel %u outside [1, %u]", tensor, kernel,
                        trace->n_kernels);
    trace->tensors[tensor].free_kernel = kernel;
    return 0;
}

/* Each free_kernel (when set) lies after its tensor's last access
 * (`last[t]`) and at most at n_kernels, and only intermediates have one. */
static int validate_free_kernels(const tio_trace *trace, const uint32_t *last)
{
    for (uint32_t i = 0; i < trace->n_tensors; i++) {
        const tio_trace_tensor *t = &trace->tensors[i];
        if (t->free_kernel == 0)
            continue;
        if (t->global)
            return tio_fail(TIO_EPARSE, "tensor %u: a global tensor has free kernel %u", i,
                            t->free_kernel);
        if (t->free_kernel <= last[i] || t->free_kernel > trace->n_kernels)
            return tio_fail(TIO_EPARSE,
                            "tensor %u: free kernel %u is not in (%u, %u] (after its last "
                            "access, at most the kernel count)",
                            i, t->free_kernel, last[i], trace->n_kernels);
    }
    return 0;
}

static int validate_tensors(const tio_trace *trace)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < trace->n_tensors; i++) {
        const tio_trace_tensor *t = &trace->tensors[i];
        if (t->id != i)
            return tio_fail(TIO_EPARSE, "tensor %u: id is %u, expected its index", i, t->id);
        if (t->bytes == 0)
            return tio_fail(TIO_EPARSE, "tensor %u: size is 0 bytes", i);
        if ((unsigned)t->kind > TIO_KIND_TEMPORARY)
            return tio_fail(TIO_EPARSE, "tensor %u: kind %d out of range", i, (int)t->kind);
        if (t->name && !tio_trace_name_ok(t->name, strlen(t->name)))
            return tio_fail(TIO_EPARSE, "tensor %u: name is empty or has whitespace", i);
        if (__builtin_add_overflow(total, t->bytes, &total))
            return tio_fail(TIO_EPARSE, "tensor %u: total tensor bytes overflow 64 bits", i);
    }
    return 0;
}

static int validate_kernels(const tio_trace *trace, uint32_t *seen)
{
    uint64_t next_access = 0, total_ns = 0;
    if (trace->n_kernels > TIO_TRACE_MAX_KERNELS)
        return tio_fail(TIO_EPARSE, "trace has %u kernels, more than %u", trace->n_kernels,
                        TIO_TRACE_MAX_KERNELS);
    for (uint32_t k = 0; k < trace->n_kernels; k++) {
        const tio_trace_kernel *kern = &trace->kernels[k];
        if (!kern->name || !tio_trace_name_ok(kern->name, strlen(kern->name)))
            return tio_fail(TIO_EPARSE, "kernel %u: name is missing, empty or has whitespace", k);
        if (kern->first_access != next_access)
            return tio_fail(TIO_EPARSE, "kernel %u: accesses start at %u, expected %llu", k,
                            kern->first_access, (unsigned long long)next_access);
        next_access += kern->n_accesses;
        if (next_access > trace->n_accesses)
            return tio_fail(TIO_EPARSE, "kernel %u: accesses run past the %u recorded", k,
                            trace->n_accesses);
        if (__builtin_add_overflow(total_ns, kern->duration_ns, &total_ns))
            return tio_fail(TIO_EPARSE, "kernel %u: total duration overflows 64 bits", k);
        const tio_trace_access *a = trace->accesses + kern->first_access;
        for (uint32_t i = 0; i < kern->n_accesses; i++) {
            if (a[i].tensor >= trace->n_tensors)
                return tio_fail(TIO_EPARSE, "kernel %u: access to unknown tensor %u", k,
                                a[i].tensor);
            if (a[i].mode == 0 || (a[i].mode & ~(TIO_ACCESS_READ | TIO_ACCESS_WRITE)))
                return tio_fail(TIO_EPARSE, "kernel %u: tensor %u has access mode %u", k,
                                a[i].tensor, a[i].mode);
            if (seen[a[i].tensor] == k)
                return tio_fail(TIO_EPARSE, "kernel %u: tensor %u accessed twice", k,
                                a[i].tensor);
            seen[a[i].tensor] = k;
        }
    }
    if (next_access != trace->n_accesses)
        return tio_fail(TIO_EPARSE, "%u accesses recorded but kernels cover %llu",
                        trace->n_accesses, (unsigned long long)next_access);
    return 0;
}

int tio_trace_validate(const tio_trace *trace)
{
    if (!trace)
        return tio_fail(-EINVAL, "tio_trace_validate: trace is NULL");
    if (trace->model && !tio_trace_model_ok(trace->model, strlen(trace->model)))
        return tio_fail(TIO_EPARSE, "trace model text has a control character");
    int rc = validate_tensors(trace);
    if (rc)
        return rc;
    /* seen[t]: last kernel that accessed tensor t (UINT32_MAX: none yet),
     * which finds duplicates within a kernel and unused tensors in one pass. */
    uint32_t *seen = malloc((trace->n_tensors ? trace->n_tensors : 1) * sizeof *seen);
    if (!seen)
        return tio_fail(-ENOMEM, "out of memory validating a trace");
    memset(seen, 0xff, trace->n_tensors * sizeof *seen);
    rc = validate_kernels(trace, seen);
    for (uint32_t i = 0; !rc && i < trace->n_tensors; i++)
        if (seen[i] == UINT32_MAX)
            rc = tio_fail(TIO_EPARSE, "tensor %u is never accessed by any kernel", i);
    if (!rc)
        rc = validate_free_kernels(trace, seen);
    free(seen);
    return rc;
}

uint64_t tio_trace_iteration_ns(const tio_trace *trace)
{
    uint64_t total = 0;
    if (!trace)
        return 0;
    for (uint32_t k = 0; k < trace->n_kernels; k++)
        if (__builtin_add_overflow(total, trace->kernels[k].duration_ns, &total))
            return UINT64_MAX;
    return total;
}
