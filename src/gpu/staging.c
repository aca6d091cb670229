/*
 * gpu/staging.c — the pinned staging ring: device memory to and from the
 * SSDs through host memory, copies overlapped with disk I/O.
 *
 * The ring is one allocation of `slots x chunk_bytes`, made once at attach:
 * 2 MiB-aligned (huge pages where the kernel gives them), pinned with
 * cudaHostRegister and registered with io_uring (tio_engine_register_buffer)
 * once, so neither CUDA nor the kernel pins anything per request.  Its slots
 * are split between the two directions (offloads: device -> host -> SSD;
 * prefetches: SSD -> host -> device), each with its own copy stream, so a
 * prefetch never waits for an offload's slot or copy.
 *
 * A device request arrives with its chunks cut by the engine as usual (at
 * most request_bytes, never across a stripe unit).  The ring's thread packs
 * runs of consecutive chunks into groups of at most chunk_bytes, placed in
 * the direction's open slot; small tensors share a slot, a tensor larger
 * than a slot moves one slot's worth at a time.  A slot is reused once every
 * group in it has ended.
 *
 *   offload group:  [copy stream D2H] wait for the request's ready event,
 *                   cudaMemcpyAsync device -> slot, host function "copied"
 *                   -> the chunks go to their directories' queues -> when
 *                   each write ends it completes; the last frees its room.
 *   prefetch group: the chunks go to their directories' queues, reading
 *                   into the slot -> when all have ended: [copy stream H2D]
 *                   wait for the ready event (first copy of the request),
 *                   cudaMemcpyAsync slot -> device, host function "copied"
 *                   -> the chunks complete, the room is freed.
 *
 * So while one group's bytes are on the copy engine, the previous group's
 * are on the disk.  Waiting requests are served urgent first (reads before
 * writes), then normal reads and writes in turn, as the disk queues are.
 *
 * Threads: one ring thread makes every CUDA call of the ring (its device
 * set once) and every group decision; the engine's backend threads report
 * finished chunks (tio_staging_chunk_done), CUDA's callback thread reports
 * finished copies (copied()).  Both only queue the group and wake the ring
 * thread, so none of them ever calls CUDA or waits.  The ring's mutex is
 * never held across a CUDA call or an engine call.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>

#include "engine/engine_internal.h"
#include "gpu/gpu_internal.h"

#define MIB (1024ull * 1024ull)

typedef struct {
    char *base;
    uint64_t used;           /* bytes handed out since the slot was last empty */
    uint32_t groups;         /* groups holding part of it */
    bool closed;             /* too full for the next group: wait until empty */
} stage_slot;

typedef struct stage_group {
    struct stage_group *next;
    tio_staging *s;
    tio_req *r;
    uint32_t first, n;       /* chunks [first, first + n) of r, all STAGED */
    stage_slot *slot;
    char *host;              /* its room in the slot */
    char *dev;               /* chunks[first].user_ptr */
    uint64_t bytes;          /* bytes of device memory it covers */
    uint32_t left;           /* chunks whose disk transfer has not ended */
    int err;                 /* first failure of a chunk (prefetch) */
    char msg[384];
    uint8_t op;
} stage_group;

struct tio_staging {
    tio_engine *e;
    tio_engine_gpu *g;
    const tio_cudart *rt;
    char *ring;
    uint64_t ring_bytes, chunk_bytes;
    bool host_registered, io_registered;
    stage_slot slots[TIO_GPU_MAX_SLOTS];
    uint32_t n_slots;
    stage_slot *pool[2][TIO_GPU_MAX_SLOTS_PER_DIRECTION]; /* [op]; shared: both slot 0 */
    uint32_t n_pool[2], open[2];
    tio_cuda_stream stream[2];   /* [TIO_OP_READ]: host -> device, [WRITE]: device -> host */

    pthread_t thread;
    bool started;
    pthread_mutex_t mu;          /* guards everything below */
    pthread_cond_t cv;           /* the ring thread waits here */
    tio_req *head[TIO_N_CLASSES][2], *tail[TIO_N_CLASSES][2]; /* waiting for room */
    uint8_t next_op;
    stage_group *copied;         /* copies that finished */
    stage_group *disk_done;      /* prefetch groups whose reads all ended */
    stage_group *spare;          /* ended groups, for reuse */
    uint32_t active;             /* groups alive */
    bool stop;
};

/* ---- slots ------------------------------------------------------------- */

/* Room for `need` bytes (at most chunk_bytes) in direction op's open slot,
 * moving on to the next empty slot when it is too full.  Returns the slot
 * and sets *off, or NULL when every slot of the direction is busy; with
 * `avail` the most the open slot could give now (0: none), so a run can be
 * cut to fit.  s->mu held. */
static stage_slot *slot_room(tio_staging *s, int op, uint64_t *avail)
{
    for (uint32_t tries = 0; tries <= s->n_pool[op]; tries++) {
        stage_slot *sl = s->pool[op][s->open[op]];
        if (sl->groups == 0) {
            sl->used = 0;
            sl->closed = false;
        }
        if (!sl->closed && sl->used < s->chunk_bytes) {
            *avail = s->chunk_bytes - sl->used;
            return sl;
        }
        sl->closed = true;
        s->open[op] = (s->open[op] + 1) % s->n_pool[op];
    }
    *avail = 0;
    return NULL;
}

static void slot_release(stage_slot *sl)
{
    if (--sl->groups == 0) {
        sl->used = 0;
        sl->closed = false;
    }
}

/* ---- groups ------------------------------------------------------------ */

static stage_group *group_new(tio_staging *s)
{
    stage_group *g = s->spare;
    if (g)
        s->spare = g->next;
    else if (!(g = malloc(sizeof *g)))
        return NULL;
    memset(g, 0, sizeof *g);
    g->s = s;
    s->active++;
    return g;
}

/* s->mu held. */
static void group_end(tio_staging *s, stage_group *g)
{
    slot_release(g->slot);
    g->next = s->spare;
    s->spare = g;
    s->active--;
    pthread_cond_signal(&s->cv);
}

static void push(stage_group **list, stage_group *g)
{
    g->next = *list;
    *list = g;
}

/* Take the next group of request r: the run of STAGED chunks from
 * r->stage_next that fits the open slot's room.  Returns NULL when no room
 * is free (try again when a group ends); sets *done once every staged chunk
 * of r is in a group.  s->mu held. */
static stage_group *take_group(tio_staging *s, tio_req *r, bool *done, bool *oom)
{
    uint32_t i = r->stage_next;
    while (i < r->n_chunks && r->chunks[i].path != TIO_CHUNK_STAGED)
        i++;
    *done = i == r->n_chunks;
    if (*done)
        return NULL;
    uint64_t avail;
    stage_slot *sl = slot_room(s, r->op, &avail);
    if (!sl)
        return NULL;
    char *dev = r->chunks[i].user_ptr;
    uint32_t j = i;
    uint64_t room = 0;
    for (; j < r->n_chunks && r->chunks[j].path == TIO_CHUNK_STAGED; j++) {
        uint64_t end = (uint64_t)(r->chunks[j].user_ptr - dev) + r->chunks[j].io_len;
        if (end > avail)
            break;
        room = end;
    }
    if (j == i) {
        /* not even one chunk fits what is left: close it, next slot */
        sl->closed = true;
        s->open[r->op] = (s->open[r->op] + 1) % s->n_pool[r->op];
        if (!slot_room(s, r->op, &avail) || avail < r->chunks[i].io_len)
            return NULL;
        return take_group(s, r, done, oom);
    }
    stage_group *g = group_new(s);
    if (!g) {
        *oom = true;
        return NULL;
    }
    g->r = r;
    g->op = r->op;
    g->first = i;
    g->n = j - i;
    g->left = g->n;
    g->slot = sl;
    g->host = sl->base + sl->used;
    g->dev = dev;
    tio_chunk *last = &r->chunks[j - 1];
    g->bytes = (uint64_t)(last->user_ptr - dev) + last->user_len;
    sl->used += room;
    sl->groups++;
    for (uint32_t k = i; k < j; k++) {
        tio_chunk *c = &r->chunks[k];
        c->group = g;
        c->io_ptr = g->host + (c->user_ptr - dev);
    }
    r->stage_next = j;
    return g;
}

/* The next waiting request of class cls and op, or NULL. */
static tio_req *queue_head(tio_staging *s, int cls, int op) { return s->head[cls][op]; }

static void queue_pop(tio_staging *s, int cls, int op)
{
    tio_req *r = s->head[cls][op];
    s->head[cls][op] = r->stage_link;
    if (!s->head[cls][op])
        s->tail[cls][op] = NULL;
    r->stage_link = NULL;
}

/* Groups for waiting requests while there is room, urgent first (reads
 * before writes), then normal reads and writes in turn.  Requests whose
 * group could not be allocated are failed by the caller (*failed).
 * s->mu held. */
static uint32_t form_groups(tio_staging *s, stage_group **out, uint32_t max, tio_req **failed)
{
    uint32_t n = 0;
    *failed = NULL;
    int order[4][2] = {{TIO_CLASS_URGENT, TIO_OP_READ}, {TIO_CLASS_URGENT, TIO_OP_WRITE},
                       {TIO_CLASS_NORMAL, s->next_op}, {TIO_CLASS_NORMAL, !s->next_op}};
    for (int q = 0; q < 4 && n < max; q++) {
        int cls = order[q][0], op = order[q][1];
        tio_req *r;
        while (n < max && (r = queue_head(s, cls, op)) != NULL) {
            bool done = false, oom = false;
            stage_group *g = take_group(s, r, &done, &oom);
            if (g) {
                out[n++] = g;
                if (cls == TIO_CLASS_NORMAL)
                    s->next_op = (uint8_t)!op;
                continue;
            }
            if (done) {
                queue_pop(s, cls, op);
                continue;
            }
            if (oom) {
                queue_pop(s, cls, op);
                r->stage_link = *failed;
                *failed = r;
                continue;
            }
            break; /* no room in this direction now */
        }
    }
    return n;
}

/* ---- the ring thread's work ------------------------------------------- */

static void copied(void *arg)
{
    stage_group *g = arg;
    tio_staging *s = g->s;
    pthread_mutex_lock(&s->mu);
    push(&s->copied, g);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Complete every chunk of g: the first failure (err) on the first chunk,
 * then free its room.  No lock held. */
static void complete_group(tio_staging *s, stage_group *g, int err, const char *msg)
{
    tio_req *r = g->r;
    uint32_t first = g->first, n = g->n;
    if (!err)
        atomic_fetch_add(&s->g->staged_bytes[g->op], g->bytes);
    pthread_mutex_lock(&s->mu);
    group_end(s, g); /* the room is free before the request can be reaped */
    pthread_mutex_unlock(&s->mu);
    for (uint32_t k = 0; k < n; k++)
        tio_chunk_complete(s->e, &r->chunks[first + k], k == 0 ? err : 0, msg);
}

/* A CUDA call for group g failed: its chunks fail. */
static void fail_group(tio_staging *s, stage_group *g, const char *call, tio_cuda_err err)
{
    char msg[384];
    tio_cuda_msg(s->rt, call, err, msg, sizeof msg);
    s->rt->GetLastError();
    tio_log(TIO_LOG_ERROR, "gpu: staging: %s", msg);
    complete_group(s, g, -EIO, msg);
}

/* Queue a copy of group g on its direction's stream, after the request's
 * ready event for its first copy, with a host function at the end. */
static void start_copy(tio_staging *s, stage_group *g)
{
    const tio_cudart *rt = s->rt;
    tio_cuda_stream st = s->stream[g->op];
    tio_cuda_err err;
    if (!g->r->stage_waited) {
        g->r->stage_waited = true;
        if ((err = rt->StreamWaitEvent(st, g->r->ready_ev, 0)) != TIO_CUDA_SUCCESS)
            return fail_group(s, g, "cudaStreamWaitEvent", err);
    }
    if (g->op == TIO_OP_WRITE)
        err = rt->MemcpyAsync(g->host, g->dev, g->bytes, TIO_CUDA_MEMCPY_D2H, st);
    else
        err = rt->MemcpyAsync(g->dev, g->host, g->bytes, TIO_CUDA_MEMCPY_H2D, st);
    if (err != TIO_CUDA_SUCCESS)
        return fail_group(s, g, "cudaMemcpyAsync", err);
    atomic_fetch_add(&s->g->copies, 1);
    if ((err = rt->LaunchHostFunc(st, copied, g)) != TIO_CUDA_SUCCESS) {
        rt->StreamSynchronize(st); /* the copy may still read or write the slot */
        return fail_group(s, g, "cudaLaunchHostFunc", err);
    }
}

/* Hand g's chunks to their directories (writes: the slot now holds the
 * device bytes; reads: they read into the slot). */
static void start_disk(tio_staging *s, stage_group *g)
{
    tio_req *r = g->r;
    uint32_t first = g->first, n = g->n;
    tio_chunk *last = &r->chunks[first + n - 1];
    if (g->op == TIO_OP_WRITE && last->io_len > last->user_len)
        memset(last->io_ptr + last->user_len, 0, last->io_len - last->user_len);
    for (uint32_t k = 0; k < n; k++)
        tio_dir_enqueue(s->e, &r->chunks[first + k]); /* g may end from here on */
}

static void *ring_main(void *arg)
{
    tio_staging *s = arg;
    tio_gpu_bind_thread(s->g);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        stage_group *start[16], *copies = s->copied, *disk = s->disk_done;
        tio_req *failed;
        s->copied = s->disk_done = NULL;
        uint32_t n = form_groups(s, start, 16, &failed);
        if (!copies && !disk && n == 0 && !failed) {
            if (s->stop && s->active == 0)
                break;
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        for (stage_group *g = copies, *next; g; g = next) {
            next = g->next;
            if (g->op == TIO_OP_WRITE)
                start_disk(s, g);
            else
                complete_group(s, g, 0, "");
        }
        for (stage_group *g = disk, *next; g; g = next) {
            next = g->next;
            if (g->err)
                complete_group(s, g, g->err, g->msg);
            else
                start_copy(s, g);
        }
        for (uint32_t i = 0; i < n; i++) {
            if (start[i]->op == TIO_OP_WRITE)
                start_copy(s, start[i]);
            else
                start_disk(s, start[i]);
        }
        for (tio_req *r = failed, *next; r; r = next) {
            next = r->stage_link;
            for (uint32_t k = r->stage_next; k < r->n_chunks; k++)
                if (r->chunks[k].path == TIO_CHUNK_STAGED)
                    tio_chunk_complete(s->e, &r->chunks[k], -ENOMEM,
                                       "staging: out of memory for a group");
        }
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- engine hooks -------------------------------------------------------- */

void tio_staging_submit(tio_staging *s, tio_req *r)
{
    int cls = r->chunks[0].cls;
    pthread_mutex_lock(&s->mu);
    r->stage_link = NULL;
    if (s->tail[cls][r->op])
        s->tail[cls][r->op]->stage_link = r;
    else
        s->head[cls][r->op] = r;
    s->tail[cls][r->op] = r;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void tio_staging_chunk_done(tio_engine *e, tio_chunk *c, int err, const char *msg)
{
    stage_group *g = c->group;
    tio_staging *s = g->s;
    if (g->op == TIO_OP_WRITE) {
        bool last;
        pthread_mutex_lock(&s->mu);
        last = --g->left == 0;
        if (last) {
            if (!err)
                atomic_fetch_add(&s->g->staged_bytes[TIO_OP_WRITE], g->bytes);
            group_end(s, g);
        }
        pthread_mutex_unlock(&s->mu);
        tio_chunk_complete(e, c, err, msg);
        return;
    }
    pthread_mutex_lock(&s->mu);
    if (err && !g->err) {
        g->err = err;
        snprintf(g->msg, sizeof g->msg, "%s", msg);
    }
    if (--g->left == 0) {
        push(&s->disk_done, g);
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- start / stop ------------------------------------------------------ */

int tio_staging_memlock_check(uint64_t need, uint64_t limit, uint64_t ring_bytes,
                              uint32_t n_rings, uint64_t engine_bytes, char *msg, size_t len)
{
    if (limit == (uint64_t)RLIM_INFINITY || need <= limit)
        return 0;
    char a[32], b[32], c[32], d[32];
    snprintf(msg, len, "gpu: RLIMIT_MEMLOCK is %llu bytes (%s), the staging ring needs %llu "
             "bytes (%s) locked: its %s registered with each of %u io_uring ring(s), beside "
             "%s of the engine's bounce buffers; raise the limit ('ulimit -l unlimited', "
             "LimitMEMLOCK=infinity in a systemd unit, '--ulimit memlock=-1' for docker) or "
             "lower pinned_bytes",
             (unsigned long long)limit, tio_format_bytes(limit, a), (unsigned long long)need,
             tio_format_bytes(need, b), tio_format_bytes(ring_bytes, c), n_rings,
             tio_format_bytes(engine_bytes, d));
    return -ENOMEM;
}

/* CAP_IPC_LOCK in the effective set: io_uring then accounts nothing. */
static bool has_cap_ipc_lock(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return false;
    char line[256];
    unsigned long long eff = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "CapEff: %llx", &eff) == 1)
            break;
    fclose(f);
    return (eff >> 14) & 1; /* CAP_IPC_LOCK = 14 */
}

/* Refuse a ring io_uring could not register: RLIMIT_MEMLOCK must cover it
 * once per ring, on top of the engine's own registered bounce buffers. */
static int check_memlock(tio_engine *e, uint64_t ring_bytes)
{
    if (e->backend != TIO_BACKEND_IO_URING)
        return 0;
    if (has_cap_ipc_lock() && !e->gpu->test.ignore_cap_ipc_lock)
        return 0;
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
        return 0;
    uint64_t engine_bytes = 0;
    for (uint32_t i = 0; i < e->n_dirs; i++)
        engine_bytes += (uint64_t)e->dirs[i].n_bounce * e->bounce_bytes;
    uint64_t need = engine_bytes + ring_bytes * e->n_dirs;
    char msg[640];
    int rc = tio_staging_memlock_check(need, rl.rlim_cur, ring_bytes, e->n_dirs, engine_bytes,
                                       msg, sizeof msg);
    return rc ? tio_fail(rc, "%s", msg) : 0;
}

/* Slots from the budget: n = min(6, pinned / chunk); offloads ceil(n/2),
 * prefetches the rest, one slot shared when n == 1. */
static void lay_out_slots(tio_staging *s, uint32_t n)
{
    s->n_slots = n;
    for (uint32_t i = 0; i < n; i++)
        s->slots[i].base = s->ring + i * s->chunk_bytes;
    if (n == 1) {
        s->pool[TIO_OP_WRITE][0] = s->pool[TIO_OP_READ][0] = &s->slots[0];
        s->n_pool[TIO_OP_WRITE] = s->n_pool[TIO_OP_READ] = 1;
        return;
    }
    uint32_t w = (n + 1) / 2;
    for (uint32_t i = 0; i < n; i++) {
        int op = i < w ? TIO_OP_WRITE : TIO_OP_READ;
        s->pool[op][s->n_pool[op]++] = &s->slots[i];
    }
}

static void free_staging(tio_staging *s)
{
    const tio_cudart *rt = s->rt;
    for (int op = 0; op < 2; op++)
        if (s->stream[op])
            rt->StreamDestroy(s->stream[op]);
    if (s->io_registered)
        tio_engine_unregister_buffer(s->e, s->ring);
    if (s->host_registered)
        rt->HostUnregister(s->ring);
    free(s->ring);
    while (s->spare) {
        stage_group *g = s->spare;
        s->spare = g->next;
        free(g);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

int tio_staging_start(tio_engine *e, tio_staging **out)
{
    tio_engine_gpu *gpu = e->gpu;
    const tio_cudart *rt = gpu->rt;
    uint64_t chunk = gpu->opt.chunk_bytes;
    uint64_t n = gpu->opt.pinned_bytes / chunk;
    if (n > TIO_GPU_MAX_SLOTS)
        n = TIO_GPU_MAX_SLOTS;
    uint64_t ring_bytes = n * chunk;
    int rc = check_memlock(e, ring_bytes);
    if (rc)
        return rc;
    tio_staging *s = calloc(1, sizeof *s);
    if (!s)
        return tio_fail(-ENOMEM, "gpu: out of memory");
    s->e = e;
    s->g = gpu;
    s->rt = rt;
    s->chunk_bytes = chunk;
    s->ring_bytes = ring_bytes;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    void *p;
    if (posix_memalign(&p, 2 * MIB, ring_bytes) != 0) {
        free_staging(s);
        return tio_fail(-ENOMEM, "gpu: out of memory for a %llu-byte staging ring",
                        (unsigned long long)ring_bytes);
    }
    s->ring = p;
    tio_request_huge_pages(p, ring_bytes);
    memset(p, 0, ring_bytes); /* fault it in before it is pinned */
    lay_out_slots(s, (uint32_t)n);
    tio_cuda_err err = rt->HostRegister(p, ring_bytes, TIO_CUDA_HOST_REGISTER_DEFAULT);
    if (err != TIO_CUDA_SUCCESS) {
        rc = tio_gpu_fail(gpu, -ENOMEM, "cudaHostRegister of the staging ring", err);
        free_staging(s);
        return rc;
    }
    s->host_registered = true;
    for (int op = 0; op < 2; op++)
        if ((err = rt->StreamCreateWithFlags(&s->stream[op], TIO_CUDA_STREAM_NON_BLOCKING)) !=
            TIO_CUDA_SUCCESS) {
            s->stream[op] = NULL;
            rc = tio_gpu_fail(gpu, -ENOMEM, "cudaStreamCreateWithFlags", err);
            free_staging(s);
            return rc;
        }
    if ((rc = tio_engine_register_buffer(e, p, ring_bytes)) != 0) {
        free_staging(s);
        return rc;
    }
    s->io_registered = e->fixed_bufs;
    if ((rc = pthread_create(&s->thread, NULL, ring_main, s)) != 0) {
        free_staging(s);
        return tio_fail(-rc, "gpu: cannot start the staging thread: %s", tio_strerror(-rc));
    }
    s->started = true;
    *out = s;
    return 0;
}

void tio_staging_stop(tio_engine *e, tio_staging *s)
{
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    free_staging(s);
}

void tio_staging_describe(const tio_staging *s, tio_engine_gpu_stats *out, char *text,
                          size_t len)
{
    if (out) {
        out->pinned_bytes = s->ring_bytes;
        out->chunk_bytes = s->chunk_bytes;
        out->slots_offload = s->n_pool[TIO_OP_WRITE];
        out->slots_prefetch = s->n_pool[TIO_OP_READ];
        out->slots_shared = s->n_slots == 1;
        out->ring_fixed_buffer = s->io_registered;
    }
    if (text) {
        char a[32];
        snprintf(text, len, "staging ring: %u slot(s) of %s (%u offload, %u prefetch%s)%s",
                 s->n_slots, tio_format_bytes(s->chunk_bytes, a), s->n_pool[TIO_OP_WRITE],
                 s->n_pool[TIO_OP_READ], s->n_slots == 1 ? ", shared" : "",
                 s->io_registered ? ", an io_uring fixed buffer" : "");
    }
}
