/*
 * tests/c/standin_cudart.c — a stand-in libcudart for machines without a
 * GPU: the CUDA runtime entry points teraio loads, with "device memory" in
 * host memory and every stream a thread that runs its operations in order.
 *
 * It models what the staging ring's correctness depends on, and checks it:
 *   - streams run their work in order, concurrently with each other and
 *     with the host; cudaMemcpyAsync is a memcpy on the stream's thread
 *     (optionally slowed down: standin_cuda_set_copy_delay_us);
 *   - events complete when their stream reaches them; cudaStreamWaitEvent
 *     holds a stream until the event's latest record completes;
 *   - cudaLaunchHostFunc runs the function on the stream's thread;
 *   - cudaMalloc'ed memory is "device" memory for cudaPointerGetAttributes;
 *     a copy whose kind does not match its pointers fails with
 *     cudaErrorInvalidValue, and an asynchronous copy to or from host memory
 *     that was not cudaHostRegister'ed is counted (real CUDA would run it
 *     synchronously: the ring must never cause one);
 *   - standin_cuda_pause holds every stream, so tests can queue work in a
 *     known order before any of it runs;
 *   - standin_cuda_launch_gate queues a "kernel" that holds its stream
 *     until the test opens it, so a test knows what ran before what;
 *   - standin_cuda_launch_fill queues a "kernel" on a stream that writes a
 *     byte over device memory after a delay, so tests can prove that copies
 *     wait for the compute stream.
 * Devices: $TERAIO_STANDIN_CUDA_DEVICES, else $TIO_STANDIN_CUDA_DEVICES
 * (default 1; 0: cudaGetDeviceCount fails with cudaErrorNoDevice, as on a
 * machine without a GPU).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

enum { OK = 0, INVALID_VALUE = 1, INVALID_DEVICE = 101, NO_DEVICE = 100, NOT_READY = 600,
       HOST_ALREADY_REGISTERED = 712, HOST_NOT_REGISTERED = 713 };
enum { H2D = 1, D2H = 2, DEFAULT_KIND = 4 };

typedef struct event {
    uint64_t recorded, completed;
} event;

typedef enum { OP_COPY, OP_RECORD, OP_WAIT, OP_HOSTFN, OP_FILL, OP_GATE } op_kind;

typedef struct op {
    struct op *next;
    op_kind kind;
    void *dst;
    const void *src;
    size_t n;
    int fill;
    unsigned delay_us;
    event *ev;
    uint64_t gen;
    void (*fn)(void *);
    void *arg;
} op;

typedef struct stream {
    pthread_t thread;
    op *head, *tail;
    bool busy, stop;
    int device;
} stream;

typedef struct { char *p; size_t n; int kind; int device; } range;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static range g_ranges[4096];
static int g_n_ranges;
static stream *g_legacy;
static unsigned g_copy_delay_us;
static bool g_paused;          /* streams start no operation while set */
static uint64_t g_gates_opened; /* OP_GATE n passes once this reaches n */
static uint64_t g_gates;
/* The calling thread's current device (a key, not _Thread_local: LeakSanitizer
 * trips over dynamic TLS in dlopen'ed libraries). */
static pthread_key_t g_device_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static void make_key(void) { pthread_key_create(&g_device_key, NULL); }
static int current_device(void)
{
    pthread_once(&g_key_once, make_key);
    return (int)(intptr_t)pthread_getspecific(g_device_key);
}
static void set_current_device(int d)
{
    pthread_once(&g_key_once, make_key);
    pthread_setspecific(g_device_key, (void *)(intptr_t)d);
}
static struct {
    unsigned long host_registers, host_unregisters, copies, pageable_copies, streams, events;
    unsigned long bytes[5];
    int devices_seen[8];
} g_stats;

/* ---- memory ------------------------------------------------------------- */

static range *find_range(const void *p)
{
    for (int i = 0; i < g_n_ranges; i++)
        if ((const char *)p >= g_ranges[i].p && (const char *)p < g_ranges[i].p + g_ranges[i].n)
            return &g_ranges[i];
    return NULL;
}

static int add_range(void *p, size_t n, int kind)
{
    if (g_n_ranges == (int)(sizeof g_ranges / sizeof g_ranges[0]))
        return -1;
    g_ranges[g_n_ranges++] = (range){p, n, kind, current_device()};
    return 0;
}

static void drop_range(range *r) { *r = g_ranges[--g_n_ranges]; }

static int ndevices(void)
{
    /* tio_env's rule (src/common/env.c), spelled out: a stand-in libcudart
     * links nothing of teraio */
    const char *v = getenv("TERAIO_STANDIN_CUDA_DEVICES");
    if (!v)
        v = getenv("TIO_STANDIN_CUDA_DEVICES");
    return v ? atoi(v) : 1;
}

/* ---- streams ------------------------------------------------------------ */

static void sleep_us(unsigned us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

static void *stream_main(void *arg)
{
    stream *s = arg;
    set_current_device(s->device);
    pthread_mutex_lock(&g_mu);
    for (;;) {
        op *o = s->head;
        if (!o || g_paused) {
            if (s->stop)
                break;
            pthread_cond_wait(&g_cv, &g_mu);
            continue;
        }
        if ((o->kind == OP_WAIT && o->ev->completed < o->gen) ||
            (o->kind == OP_GATE && g_gates_opened < o->gen)) {
            pthread_cond_wait(&g_cv, &g_mu);
            continue;
        }
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        s->busy = true;
        unsigned delay = g_copy_delay_us;
        pthread_mutex_unlock(&g_mu);
        switch (o->kind) {
        case OP_COPY:
            if (delay)
                sleep_us(delay);
            memcpy(o->dst, o->src, o->n);
            break;
        case OP_FILL:
            sleep_us(o->delay_us);
            memset(o->dst, o->fill, o->n);
            break;
        case OP_HOSTFN:
            o->fn(o->arg);
            break;
        default:
            break;
        }
        pthread_mutex_lock(&g_mu);
        if (o->kind == OP_RECORD && o->ev->completed < o->gen)
            o->ev->completed = o->gen;
        s->busy = false;
        free(o);
        pthread_cond_broadcast(&g_cv);
    }
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

static stream *new_stream(void)
{
    stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->device = current_device();
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        free(s);
        return NULL;
    }
    return s;
}

/* The stream a handle names; NULL is the legacy default stream. g_mu held. */
static stream *resolve(void *handle)
{
    if (handle)
        return handle;
    if (!g_legacy)
        g_legacy = new_stream();
    return g_legacy;
}

static int enqueue(void *handle, op *o)
{
    if (!o)
        return INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    stream *s = resolve(handle);
    o->next = NULL;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    return OK;
}

static op *new_op(op_kind kind)
{
    op *o = calloc(1, sizeof *o);
    if (o)
        o->kind = kind;
    return o;
}

/* ---- the runtime API ---------------------------------------------------- */

API int cudaGetDeviceCount(int *n)
{
    *n = ndevices();
    return *n > 0 ? OK : NO_DEVICE;
}

API int cudaSetDevice(int d)
{
    if (d < 0 || d >= ndevices())
        return INVALID_DEVICE;
    set_current_device(d);
    pthread_mutex_lock(&g_mu);
    if (d < 8)
        g_stats.devices_seen[d] = 1;
    pthread_mutex_unlock(&g_mu);
    return OK;
}

API int cudaGetDevice(int *d)
{
    *d = current_device();
    return OK;
}

API const char *cudaGetErrorString(int err)
{
    switch (err) {
    case OK: return "no error";
    case INVALID_VALUE: return "invalid argument";
    case NO_DEVICE: return "no CUDA-capable device is detected";
    case INVALID_DEVICE: return "invalid device ordinal";
    case NOT_READY: return "device not ready";
    case HOST_ALREADY_REGISTERED: return "part or all of the requested memory range is already mapped";
    case HOST_NOT_REGISTERED: return "pointer does not correspond to a registered memory region";
    }
    return "unrecognized error code";
}

API int cudaGetLastError(void) { return OK; }
API int cudaRuntimeGetVersion(int *v) { *v = 13000; return OK; }
API int cudaDriverGetVersion(int *v) { *v = 13000; return OK; }

API int cudaHostRegister(void *p, size_t n, unsigned flags)
{
    pthread_mutex_lock(&g_mu);
    int rc = find_range(p) ? HOST_ALREADY_REGISTERED : add_range(p, n, 1) ? INVALID_VALUE : OK;
    if (rc == OK)
        g_stats.host_registers++;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

API int cudaHostUnregister(void *p)
{
    pthread_mutex_lock(&g_mu);
    range *r = find_range(p);
    int rc = r && r->p == p && r->kind == 1 ? OK : HOST_NOT_REGISTERED;
    if (rc == OK) {
        drop_range(r);
        g_stats.host_unregisters++;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

API int cudaMalloc(void **p, size_t n)
{
    void *m = NULL;
    if (posix_memalign(&m, 512, n ? n : 1) != 0)
        return 2; /* cudaErrorMemoryAllocation */
    pthread_mutex_lock(&g_mu);
    int rc = add_range(m, n ? n : 1, 2);
    pthread_mutex_unlock(&g_mu);
    if (rc) {
        free(m);
        return 2;
    }
    *p = m;
    return OK;
}

API int cudaFree(void *p)
{
    if (!p)
        return OK;
    pthread_mutex_lock(&g_mu);
    range *r = find_range(p);
    int rc = r && r->p == p && r->kind == 2 ? OK : INVALID_VALUE;
    if (rc == OK)
        drop_range(r);
    pthread_mutex_unlock(&g_mu);
    if (rc == OK)
        free(p);
    return rc;
}

/* cudaPointerAttributes as CUDA 13 has it (88 bytes) */
struct attrs { int type; int device; void *dev; void *host; long reserved[8]; };

API int cudaPointerGetAttributes(struct attrs *a, const void *p)
{
    pthread_mutex_lock(&g_mu);
    range *r = find_range(p);
    memset(a, 0, sizeof *a);
    if (r) {
        a->type = r->kind;
        a->device = r->device;
        if (r->kind == 2)
            a->dev = (void *)p;
        else
            a->host = (void *)p;
    }
    pthread_mutex_unlock(&g_mu);
    return OK;
}

static void bump(unsigned long *counter)
{
    pthread_mutex_lock(&g_mu);
    (*counter)++;
    pthread_mutex_unlock(&g_mu);
}

API int cudaStreamCreateWithFlags(void **s, unsigned flags)
{
    if (!(*s = new_stream()))
        return INVALID_VALUE;
    bump(&g_stats.streams);
    return OK;
}

API int cudaStreamSynchronize(void *handle)
{
    pthread_mutex_lock(&g_mu);
    stream *s = resolve(handle);
    while (s->head || s->busy)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    return OK;
}

API int cudaStreamDestroy(void *handle)
{
    stream *s = handle;
    if (!s)
        return INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    s->stop = true;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    pthread_join(s->thread, NULL);
    free(s);
    return OK;
}

API int cudaEventCreateWithFlags(void **e, unsigned flags)
{
    if (!(*e = calloc(1, sizeof(event))))
        return INVALID_VALUE;
    bump(&g_stats.events);
    return OK;
}

API int cudaEventDestroy(void *e)
{
    free(e);
    return OK;
}

API int cudaEventRecord(void *e, void *handle)
{
    op *o = new_op(OP_RECORD);
    if (!o)
        return INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    o->ev = e;
    o->gen = ++o->ev->recorded;
    pthread_mutex_unlock(&g_mu);
    return enqueue(handle, o);
}

API int cudaEventQuery(void *e)
{
    event *ev = e;
    pthread_mutex_lock(&g_mu);
    int rc = ev->completed >= ev->recorded ? OK : NOT_READY;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

API int cudaEventSynchronize(void *e)
{
    event *ev = e;
    pthread_mutex_lock(&g_mu);
    uint64_t want = ev->recorded;
    while (ev->completed < want)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    return OK;
}

API int cudaStreamWaitEvent(void *handle, void *e, unsigned flags)
{
    op *o = new_op(OP_WAIT);
    if (!o)
        return INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    o->ev = e;
    o->gen = o->ev->recorded;
    pthread_mutex_unlock(&g_mu);
    return enqueue(handle, o);
}

static op *copy_op(void *dst, const void *src, size_t n)
{
    op *o = new_op(OP_COPY);
    if (o) {
        o->dst = dst;
        o->src = src;
        o->n = n;
    }
    return o;
}

/* Does the copy's kind match its pointers?  Counts pageable async copies. */
static int check_copy(void *dst, const void *src, int kind, bool async)
{
    pthread_mutex_lock(&g_mu);
    range *d = find_range(dst), *s = find_range(src);
    bool ddev = d && d->kind == 2, sdev = s && s->kind == 2;
    int rc = OK;
    if ((kind == H2D && (sdev || !ddev)) || (kind == D2H && (!sdev || ddev)))
        rc = INVALID_VALUE;
    if (rc == OK && async && ((kind == H2D && !s) || (kind == D2H && !d)))
        g_stats.pageable_copies++;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

API int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *handle)
{
    int rc = check_copy(dst, src, kind, true);
    if (rc)
        return rc;
    op *o = copy_op(dst, src, n);
    if (!o)
        return INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    g_stats.copies++;
    g_stats.bytes[kind < 5 ? kind : 0] += n;
    pthread_mutex_unlock(&g_mu);
    return enqueue(handle, o);
}

API int cudaMemcpy(void *dst, const void *src, size_t n, int kind)
{
    int rc = check_copy(dst, src, kind, false);
    if (rc)
        return rc;
    op *o = copy_op(dst, src, n);
    if (!o)
        return INVALID_VALUE;
    if ((rc = enqueue(NULL, o)) != OK)
        return rc;
    return cudaStreamSynchronize(NULL);
}

API int cudaLaunchHostFunc(void *handle, void (*fn)(void *), void *arg)
{
    op *o = new_op(OP_HOSTFN);
    if (!o)
        return INVALID_VALUE;
    o->fn = fn;
    o->arg = arg;
    return enqueue(handle, o);
}

/* ---- controls for tests ---------------------------------------------------- */

API void standin_cuda_set_copy_delay_us(unsigned us)
{
    pthread_mutex_lock(&g_mu);
    g_copy_delay_us = us;
    pthread_mutex_unlock(&g_mu);
}

/* Hold every stream before its next operation (on) or let them go (off). */
API void standin_cuda_pause(int on)
{
    pthread_mutex_lock(&g_mu);
    g_paused = on;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* A "kernel" on `handle` that holds the stream until standin_cuda_open_gate
 * is called (as often as gates were launched before it). */
API int standin_cuda_launch_gate(void *handle)
{
    op *o = new_op(OP_GATE);
    if (!o)
        return INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    o->gen = ++g_gates;
    pthread_mutex_unlock(&g_mu);
    return enqueue(handle, o);
}

API void standin_cuda_open_gate(void)
{
    pthread_mutex_lock(&g_mu);
    g_gates_opened++;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* A "kernel" on `handle`: after delay_us, memset(dst, byte, n). */
API int standin_cuda_launch_fill(void *handle, void *dst, int byte, size_t n, unsigned delay_us)
{
    op *o = new_op(OP_FILL);
    if (!o)
        return INVALID_VALUE;
    o->dst = dst;
    o->fill = byte;
    o->n = n;
    o->delay_us = delay_us;
    return enqueue(handle, o);
}

typedef struct {
    unsigned long host_registers, host_unregisters, copies, pageable_copies, streams, events;
    unsigned long h2d_bytes, d2h_bytes;
    int registered_ranges;
} standin_cuda_stats;

API void standin_cuda_get_stats(standin_cuda_stats *out)
{
    pthread_mutex_lock(&g_mu);
    out->host_registers = g_stats.host_registers;
    out->host_unregisters = g_stats.host_unregisters;
    out->copies = g_stats.copies;
    out->pageable_copies = g_stats.pageable_copies;
    out->streams = g_stats.streams;
    out->events = g_stats.events;
    out->h2d_bytes = g_stats.bytes[H2D];
    out->d2h_bytes = g_stats.bytes[D2H];
    out->registered_ranges = 0;
    for (int i = 0; i < g_n_ranges; i++)
        out->registered_ranges += g_ranges[i].kind == 1;
    pthread_mutex_unlock(&g_mu);
}

API int standin_cuda_device_seen(int d)
{
    pthread_mutex_lock(&g_mu);
    int seen = d >= 0 && d < 8 && g_stats.devices_seen[d];
    pthread_mutex_unlock(&g_mu);
    return seen;
}
