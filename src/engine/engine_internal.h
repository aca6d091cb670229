/*
 * engine/engine_internal.h — the engine's private data structures, shared by
 * the front end (engine.c), the extent allocator (extent_map.c) and the two
 * backends (backend_uring.c, backend_psync.c).
 *
 * A user request becomes one tio_req holding an array of chunks.  A chunk is
 * the unit of disk I/O: at most request_bytes, never crossing a stripe unit,
 * so it maps to one contiguous range of one directory's backing file.  Each
 * directory owns a pending queue of chunks in two priority classes (urgent
 * first) that its backend drains: the io_uring backend keeps up to
 * queue_depth chunks in its ring, the psync backend hands them to its worker
 * threads.  When a request's last chunk finishes, the request moves to the
 * engine's completed list, where tio_engine_reap (or a synchronous helper)
 * picks it up.
 *
 * Locks, always taken in this order: tio_dir.mu, then tio_engine.pool_mu or
 * tio_engine.done_mu (never both of the last two at once).
 */
#ifndef TERAIO_ENGINE_INTERNAL_H
#define TERAIO_ENGINE_INTERNAL_H

#include <pthread.h>

#include "common/util.h"
#include "teraio/engine.h"

enum { TIO_OP_READ = 0, TIO_OP_WRITE = 1 };
enum { TIO_CLASS_URGENT = 0, TIO_CLASS_NORMAL = 1, TIO_N_CLASSES = 2 };

/* Fault injection (TIO_ENGINE_FAULT): what happens to the chosen chunk. */
enum { TIO_FAULT_NONE = 0, TIO_FAULT_EIO, TIO_FAULT_ENOSPC, TIO_FAULT_SHORT };

/* Give up on a chunk after this many retries (EINTR/EAGAIN/short) in a row. */
#define TIO_CHUNK_MAX_RETRIES 1000u

typedef struct tio_req tio_req;
typedef struct tio_dir tio_dir;

/* One contiguous transfer to or from one backing file. */
typedef struct tio_chunk {
    struct tio_chunk *next; /* pending queue link */
    tio_req *req;
    tio_dir *dir;
    uint8_t op;             /* TIO_OP_READ / TIO_OP_WRITE */
    uint8_t cls;            /* TIO_CLASS_* */
    uint8_t fault;          /* TIO_FAULT_*, consumed by the first attempt */
    uint64_t file_off;      /* where the chunk starts in the backing file */
    uint32_t io_len;        /* bytes moved on disk (user_len rounded up to 4 KiB
                               when a bounce buffer is used) */
    uint32_t user_len;      /* bytes of the user buffer this chunk covers */
    uint32_t done;          /* bytes of io_len transferred so far */
    uint32_t retries;
    char *user_ptr;         /* user buffer for this chunk */
    char *bounce;           /* aligned bounce buffer, or NULL */
    char *io_ptr;           /* user_ptr or bounce once prepared, else NULL */
} tio_chunk;

/* One user request: completed when chunks_left reaches 0. */
struct tio_req {
    struct tio_req *next;   /* completed list link */
    uint64_t tag;
    int result;             /* 0 or the first chunk failure (-errno) */
    bool sync;              /* owned by tio_engine_read/write, not reaped */
    bool finished;
    uint32_t n_chunks;
    uint32_t chunks_left;
    char msg[384];          /* message for a failed result */
    tio_chunk chunks[];
};

struct tio_uring;           /* defined by backend_uring.c */

struct tio_dir {
    tio_engine *engine;
    uint32_t index;
    char *path;             /* the SSD directory */
    char *file;             /* its backing file */
    int fd;
    bool created;           /* we created `file`: unlink it on destroy */
    bool direct;            /* fd opened with O_DIRECT */
    uint64_t file_bytes;

    pthread_mutex_t mu;     /* guards everything below */
    pthread_cond_t cv;      /* psync workers wait here for chunks */
    tio_chunk *head[TIO_N_CLASSES], *tail[TIO_N_CLASSES];
    uint32_t inflight;      /* chunks in the io_uring ring */
    bool stop;

    struct tio_uring *uring;      /* io_uring backend state */
    pthread_t *workers;           /* psync backend threads */
    uint32_t n_workers;
};

/* Sorted free list and sorted list of allocated extents over [0, capacity). */
typedef struct {
    uint64_t capacity;
    tio_extent *free;
    uint32_t n_free, cap_free;
    tio_extent *used;
    uint32_t n_used, cap_used;
} tio_extent_map;

struct tio_engine {
    tio_engine_options opt;
    tio_backend backend;
    char reason[512];
    tio_dir *dirs;
    uint32_t n_dirs;
    tio_extent_map map;
    uint32_t bounce_bytes;  /* size of each bounce buffer */

    /* Fault injection, parsed from TIO_ENGINE_FAULT at create. */
    uint8_t fault_kind;
    uint8_t fault_op;
    uint64_t fault_nth;
    uint64_t chunk_count[2]; /* chunks created per op (caller thread only) */

    pthread_mutex_t pool_mu; /* bounce buffer pool */
    void **pool;
    uint32_t n_pool, cap_pool;

    pthread_mutex_t done_mu;
    pthread_cond_t done_cv;
    tio_req *done_head, *done_tail;
    uint32_t n_done;         /* non-sync requests on the completed list */
    uint32_t n_unfinished;   /* requests with chunks still outstanding */

    uint32_t in_flight;      /* submitted, not reaped (caller thread only) */
    struct { uint64_t tag; char msg[384]; } *errs; /* failures of the last reap */
    uint32_t n_errs, cap_errs;
};

/* extent_map.c */
int tio_extent_map_init(tio_extent_map *map, uint64_t capacity);
void tio_extent_map_fini(tio_extent_map *map);
int tio_extent_map_alloc(tio_extent_map *map, uint64_t bytes, tio_extent *out);
int tio_extent_map_free(tio_extent_map *map, const tio_extent *extent);

/* engine.c, used by the backends */
/* Attach the I/O pointer (bounce buffer, filled for writes) if not done yet.
 * Returns 0 or -ENOMEM. */
int tio_chunk_prepare(tio_engine *engine, tio_chunk *chunk);
/* Outcome of one transfer attempt that moved `res` bytes (or -errno). */
enum { TIO_CHUNK_DONE = 0, TIO_CHUNK_RETRY = 1, TIO_CHUNK_FAILED = 2 };
int tio_chunk_account(tio_chunk *chunk, int64_t res, int *err);
/* Finish a chunk with 0 or -errno: copy out reads, release the bounce buffer,
 * and complete the request when it was the last chunk.  Takes done_mu. */
void tio_chunk_finish(tio_engine *engine, tio_chunk *chunk, int err);
/* Pop the next pending chunk of `dir` (urgent first); dir->mu held. */
tio_chunk *tio_dir_pop(tio_dir *dir);
/* Push a chunk back to the front of the urgent class; dir->mu held. */
void tio_dir_push_front(tio_dir *dir, tio_chunk *chunk);

/* backend_uring.c: probe and start one ring + completion thread per dir.
 * On failure returns -errno with `why` describing it; nothing is left
 * started. */
int tio_uring_start(tio_engine *engine, char *why, size_t why_len);
/* New chunks are pending on `dir`; dir->mu held. */
void tio_uring_kick(tio_dir *dir);
/* All requests finished: stop the threads and close the rings. */
void tio_uring_stop(tio_engine *engine);

/* backend_psync.c */
int tio_psync_start(tio_engine *engine, char *why, size_t why_len);
void tio_psync_kick(tio_dir *dir);
void tio_psync_stop(tio_engine *engine);

#endif
