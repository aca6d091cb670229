/*
 * engine/engine_internal.h — the engine's private data structures, shared by
 * the front end (engine.c), the extent allocator (extent_map.c) and the two
 * backends (backend_uring.c, backend_psync.c).
 *
 * A user request becomes one tio_req holding an array of chunks.  A chunk is
 * the unit of disk I/O: at most request_bytes, never crossing a stripe unit,
 * so it maps to one contiguous range of one directory's backing file.  Each
 * directory owns four pending queues (urgent/normal x read/write) that its
 * backend drains, urgent first, normal reads and writes alternating: the
 * io_uring backend keeps up to queue_depth chunks in its ring, the psync
 * backend hands them to its worker threads.  Each directory also owns a slab
 * of bounce buffers (one allocation, registered with its ring when fixed
 * buffers are on), handed out from a free stack: no allocation per chunk.
 * When a request's last chunk finishes, the request moves to the engine's
 * completed list, where tio_engine_reap (or a synchronous helper) picks it
 * up.
 *
 * Device memory (gpu.h) is src/gpu's, reached only through the device
 * route (tio_engine_device_route below): the engine knows no CUDA call and
 * includes nothing of src/gpu, and src/gpu sits on the engine.  A request
 * whose buffer the route claims has its chunks marked STAGED or CUFILE.
 * STAGED chunks reach the pending queues only once the staging ring has
 * given them pinned host memory (and, for writes, copied the device bytes
 * into it); when their disk transfer ends the route's chunk_done takes them
 * back and completes them after the copy to the device.  CUFILE chunks go
 * to their directory's cuFile threads instead of the pending queues.
 *
 * Locks: tio_dir.mu, then tio_engine.done_mu, never the other way round;
 * registering a buffer takes every tio_dir.mu in directory order.  The
 * staging ring's and the cuFile threads' own mutexes are never held while
 * an engine lock is taken.
 */
#ifndef TERAIO_ENGINE_INTERNAL_H
#define TERAIO_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "common/util.h"
#include "engine/engine_test.h"
#include "teraio/engine.h"

enum { TIO_OP_READ = 0, TIO_OP_WRITE = 1 };
enum { TIO_CLASS_URGENT = 0, TIO_CLASS_NORMAL = 1, TIO_N_CLASSES = 2 };
/* How a chunk's bytes reach its memory (tio_chunk.path). */
enum { TIO_CHUNK_HOST = 0, TIO_CHUNK_STAGED = 1, TIO_CHUNK_CUFILE = 2 };

/* Extent states kept by the allocator for checksums. */
enum { TIO_XS_EMPTY = 0, TIO_XS_WRITING, TIO_XS_VALID, TIO_XS_FAILED };

/* Slots of a ring's registered-buffer table: the directory's bounce buffers
 * first, then TIO_ENGINE_MAX_REGISTERED slots for the caller's regions. */
#define TIO_NO_SLOT UINT32_MAX
#define TIO_REG_SLOT_BYTES (1ull << 30)

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
    uint8_t fault;          /* TIO_FAULT_* (test hook), consumed by the first attempt */
    uint8_t path;           /* TIO_CHUNK_HOST / STAGED / CUFILE */
    uint32_t bounce_slot;   /* index of `bounce` in its directory's slab */
    uint64_t file_off;      /* where the chunk starts in the backing file */
    uint32_t io_len;        /* bytes moved on disk (user_len rounded up to 4 KiB
                               when a bounce buffer is used) */
    uint32_t user_len;      /* bytes of the user buffer this chunk covers */
    uint32_t done;          /* bytes of io_len transferred so far */
    uint32_t retries;
    uint32_t crc;           /* checksum on: a write's CRC32C of its bytes, set
                               when it finishes; a read's expected one */
    char *user_ptr;         /* user buffer for this chunk */
    char *bounce;           /* aligned bounce buffer, or NULL */
    char *io_ptr;           /* user_ptr or bounce once prepared, else NULL;
                               STAGED: its place in the staging ring */
    void *group;            /* STAGED: the staging ring's group holding it */
} tio_chunk;

/* Pending chunks, four queues: [class][op]. */
typedef struct {
    tio_chunk *head[TIO_N_CLASSES][2], *tail[TIO_N_CLASSES][2];
    uint8_t next_op;        /* normal class: the op to try first next time */
} tio_queue;

/* The next chunk: urgent first (reads before writes), then normal reads and
 * writes in turn.  NULL when all four are empty.  Caller holds the lock that
 * guards `q`. */
tio_chunk *tio_queue_pop(tio_queue *q);
void tio_queue_push_back(tio_queue *q, tio_chunk *c);
/* Back to the front of its op's urgent queue (a retry goes first). */
void tio_queue_push_front(tio_queue *q, tio_chunk *c);
bool tio_queue_empty(const tio_queue *q);

/* One user request: completed when chunks_left reaches 0. */
struct tio_req {
    struct tio_req *next;   /* completed list link */
    uint64_t tag;
    int result;             /* 0 or the first chunk failure (-errno) */
    bool sync;              /* owned by tio_engine_read/write, not reaped */
    bool finished;
    uint8_t op;
    bool verify;            /* checksum on: each chunk checks its crc */
    bool track;             /* checksum on: chunks compute their crc, reap
                               records them with the extent */
    bool device;            /* buf is CUDA device memory (gpu.h) */
    bool no_crc;            /* some chunk moves by cuFile: nothing is checked,
                               a write records its extent as unchecked */
    bool stage_waited;      /* staging: a copy stream waits for ready_ev */
    void *ready_ev;         /* device: the CUDA event the route recorded on the
                               compute stream at submit */
    struct tio_req *stage_link; /* staging ring's queue of requests */
    uint32_t stage_next;    /* staging: first chunk not yet in a group */
    char *buf;
    uint64_t bytes;
    tio_extent extent;
    uint32_t n_chunks;
    uint32_t chunks_left;
    char msg[384];          /* message for a failed result */
    tio_chunk chunks[];
};

struct tio_uring;           /* defined by backend_uring.c */

/* What the front end needs from a backend; one table per backend
 * (tio_uring_ops, tio_psync_ops), chosen at create. */
typedef struct {
    tio_backend id;
    /* Start the backend's threads (and rings) for every directory.  On
     * failure returns -errno with `why` describing it; nothing is left
     * started. */
    int (*start)(tio_engine *engine, char *why, size_t why_len);
    /* Work may be available on `dir` (new chunks, or a bounce buffer came
     * back); dir->mu held. */
    void (*kick)(tio_dir *dir);
    /* All requests finished: stop the threads (and close the rings). */
    void (*stop)(tio_engine *engine);
} tio_backend_ops;

/* The device-memory route: how requests on device memory leave the engine
 * and come back.  One table, gpu/gpu.c's, set in tio_engine.device by
 * tio_engine_gpu_attach and cleared by its detach; the engine calls it only
 * while it is set, so the dependency points one way, src/gpu -> src/engine.
 * Its state is tio_engine.gpu, opaque here. */
typedef struct {
    /* Is `buf` device memory this route moves?  Caller's thread. */
    bool (*is_device)(const tio_engine *engine, const void *buf);
    /* A device request (r->device set): set its chunks' paths (force_path:
     * TIO_CHUNK_STAGED or _CUFILE for all, 0: each directory's choice) and
     * record its ready event.  Returns 0 or -errno (message set); caller's
     * thread. */
    int (*prepare)(tio_engine *engine, tio_req *r, uint8_t force_path);
    /* Hand a prepared request's chunks to their paths (instead of the
     * pending queues); caller's thread, no lock held. */
    void (*enqueue)(tio_engine *engine, tio_req *r);
    /* A device request's last chunk is done: recycle what prepare took;
     * done_mu held (the route's lock under it is a leaf). */
    void (*request_done)(tio_engine *engine, tio_req *r);
    /* A STAGED chunk's disk transfer ended with `err` (`msg` when err != 0):
     * the route completes it (tio_chunk_complete) once its bytes are in
     * place.  Backend thread, no lock held. */
    void (*chunk_done)(tio_engine *engine, tio_chunk *c, int err, const char *msg);
    /* Stop and free the route's state and clear tio_engine.device (after
     * every request has ended: tio_engine_destroy). */
    void (*detach)(tio_engine *engine);
} tio_engine_device_route;

struct tio_dir {
    tio_engine *engine;
    uint32_t index;
    char *path;             /* the SSD directory */
    char *file;             /* its backing file (path/name, for messages) */
    char *name;             /* the backing file's name in dirfd */
    int dirfd;              /* the SSD directory, open while the engine is */
    int fd;                 /* the backing file, flock'ed while open */
    bool created;           /* we created `file`: unlink it on destroy */
    bool direct;            /* fd opened with O_DIRECT */
    uint64_t data_bytes;    /* bytes of the space stored here (whole stripe units) */
    uint64_t file_bytes;    /* data_bytes, at least 4 KiB (for the probe) */

    pthread_mutex_t mu;     /* guards everything below */
    pthread_cond_t cv;      /* psync workers wait here for chunks */
    tio_queue pending;      /* chunks the backend has not taken yet */
    uint32_t inflight;      /* chunks in the io_uring ring */
    bool stop;

    char *slab;             /* n_bounce bounce buffers of engine->bounce_bytes
                               (none in a directory that holds no data) */
    uint32_t n_bounce;
    uint32_t *bounce_free;  /* stack of free slab indices */
    uint32_t n_bounce_free;

    struct tio_uring *uring;      /* io_uring backend state */
    pthread_t *workers;           /* psync backend threads */
    uint32_t n_workers;
};

/* An allocated extent and, for checksums, what was last written to it: the
 * CRC32C of each chunk of that write.  A read of the same length is cut into
 * the same chunks, so each chunk checks its own bytes. */
typedef struct {
    tio_extent x;
    uint64_t crc_bytes;     /* length of the write the crcs cover */
    uint32_t *crcs;         /* [n_crcs] (malloc'ed, cap_crcs allocated) */
    uint32_t n_crcs, cap_crcs;
    uint8_t state;          /* TIO_XS_* */
} tio_used_extent;

/* Sorted free list and sorted list of allocated extents over [0, space_bytes). */
typedef struct {
    uint64_t space_bytes;
    tio_extent *free;
    uint32_t n_free, cap_free;
    tio_used_extent *used;
    uint32_t n_used, cap_used;
} tio_extent_map;

/* A caller's buffer registered with the rings, in slots of at most
 * TIO_REG_SLOT_BYTES starting at `slot` (absolute index in the table). */
typedef struct {
    char *addr;
    uint64_t bytes;
    uint32_t slot;
    uint32_t n_slots;
} tio_region;

struct tio_engine {
    atomic_uint refs;           /* tio_engine_retain / destroy */
    tio_engine_options opt;
    tio_backend backend;
    const tio_backend_ops *ops; /* the backend in use */
    char reason[512];
    tio_dir *dirs;
    uint32_t n_dirs;
    tio_extent_map map;
    uint32_t bounce_bytes;  /* size of each bounce buffer */
    uint32_t n_bounce;      /* the most bounce buffers of any directory: the
                               first ring slots; callers' regions follow */

    const tio_engine_device_route *device; /* tio_engine_gpu_attach; NULL without */
    struct tio_engine_gpu *gpu; /* the route's state (src/gpu), NULL without */

    /* Test hooks (engine_test.h), all zero outside tests. */
    tio_engine_test_options test;
    uint64_t chunk_count[2]; /* chunks created per op, for test.fault_nth
                                (caller thread only) */

    /* io_uring registration.  `regions` is written by the caller's thread
     * with every directory's mutex held and read under any one of them. */
    bool fixed_bufs, fixed_files;
    tio_region regions[TIO_ENGINE_MAX_REGISTERED];
    uint32_t n_regions;

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
int tio_extent_map_init(tio_extent_map *map, uint64_t space_bytes);
void tio_extent_map_fini(tio_extent_map *map);
int tio_extent_map_alloc(tio_extent_map *map, uint64_t bytes, tio_extent *out);
int tio_extent_map_free(tio_extent_map *map, const tio_extent *extent);
/* The allocated extent exactly equal to `extent`, or NULL. */
tio_used_extent *tio_extent_map_find(tio_extent_map *map, const tio_extent *extent);
void tio_extent_map_stats(const tio_extent_map *map, tio_engine_space *out);

/* crc32c.c: CRC32C of n bytes continuing from `crc` (0 to start);
 * hardware where the CPU has it.  _sw always uses the table (for tests). */
uint32_t tio_crc32c(uint32_t crc, const void *data, size_t n);
uint32_t tio_crc32c_sw(uint32_t crc, const void *data, size_t n);

/* engine.c, used by the backends */
/* Attach the I/O pointer (a bounce buffer from the chunk's directory, filled
 * for writes) if not done yet; dir->mu held.  Returns 0, or -EAGAIN when
 * every bounce buffer of the directory is taken (one comes back with the
 * next finished chunk). */
int tio_chunk_prepare(tio_engine *engine, tio_chunk *chunk);
/* Outcome of one transfer attempt that moved `res` bytes (or -errno). */
enum { TIO_CHUNK_DONE = 0, TIO_CHUNK_RETRY = 1, TIO_CHUNK_FAILED = 2 };
int tio_chunk_account(tio_chunk *chunk, int64_t res, int *err);
/* Finish a chunk with 0 or -errno: copy out reads, release the bounce buffer,
 * and complete the request when it was the last chunk (verifying a read's
 * checksum).  Takes dir->mu (bounce chunks) and done_mu: call it with
 * neither held. */
void tio_chunk_finish(tio_engine *engine, tio_chunk *chunk, int err);
/* The last step of tio_chunk_finish: count the chunk done with `err` (and
 * `msg` when err != 0) and publish the request when it was the last one.
 * Takes done_mu: call it with no lock held.  The staging ring calls it for
 * STAGED chunks once their bytes are in place. */
void tio_chunk_complete(tio_engine *engine, tio_chunk *chunk, int err, const char *msg);
/* Queue chunk `c` on its directory for the backend (takes dir->mu). */
void tio_dir_enqueue(tio_engine *engine, tio_chunk *c);
/* A synchronous device transfer of `bytes` between `buf` and directory
 * `dir`'s backing file at file offset 0, all of it in that directory, by
 * `path` (TIO_CHUNK_STAGED / CUFILE), no checksum: the attach probe.
 * Returns 0 or the request's -errno (message set). */
int tio_engine_dir_io(tio_engine *engine, uint32_t dir, int op, void *buf, uint64_t bytes,
                      uint8_t path);
/* Pop the next pending chunk of `dir` (urgent first, then normal reads and
 * writes in turn); dir->mu held. */
static inline tio_chunk *tio_dir_pop(tio_dir *dir) { return tio_queue_pop(&dir->pending); }
/* Push a chunk back to the front of its op's urgent queue; dir->mu held. */
static inline void tio_dir_push_front(tio_dir *dir, tio_chunk *chunk)
{
    tio_queue_push_front(&dir->pending, chunk);
}

/* backend_uring.c: one ring + completion thread per dir; start probes each
 * ring and registers the backing file and the bounce slab (a refused
 * registration only turns fixed files/buffers off and appends the reason).
 * Built without liburing, start always refuses. */
extern const tio_backend_ops tio_uring_ops;
/* Register / clear slots [slot, slot + n) of every ring; `iov` NULL clears.
 * Returns 0 or -errno (the memlock message is the caller's). */
struct iovec;
int tio_uring_update_slots(tio_engine *engine, uint32_t slot, const struct iovec *iov,
                           uint32_t n);

/* backend_psync.c: a few pread/pwrite worker threads per dir. */
extern const tio_backend_ops tio_psync_ops;

/* backing_file.c: remove the directory's stale backing files (unlocked:
 * their job is gone; logged), create dir->file under a fresh random name,
 * flock it, preallocate it and probe it with a real aligned write and read,
 * falling back to buffered I/O when the file system refuses O_DIRECT.
 * Returns 0 or -errno (message names the file). */
int tio_backing_file_open(tio_engine *engine, tio_dir *dir);
/* Check that `path` is a writable directory: 0, or -ENOENT / -ENOTDIR /
 * -EACCES / -errno naming it. */
int tio_dir_check(const char *path);
/* Delete it (if we created it) and close it. */
void tio_backing_file_close(tio_dir *dir);

/* fault.c: check test options (NULL: none) into *out.  Mark chunk `c` (just built, op `op`) if the test options pick
 * it; caller thread.  And the fault's effect on one transfer attempt that
 * moved `*res` bytes: true when the attempt is to be retried as is (an
 * injected delay is over), else *res may be replaced by the injected
 * outcome. */
int tio_engine_test_check(const tio_engine_test_options *in, tio_engine_test_options *out);
void tio_fault_arm(tio_engine *engine, tio_chunk *c);
bool tio_fault_apply(tio_chunk *c, int64_t *res);

/* engine.c: back the 2 MiB-aligned part of [addr, addr + bytes) with
 * transparent huge pages where the kernel can (MADV_HUGEPAGE, then
 * MADV_COLLAPSE for pages already present); best effort, no error. */
void tio_request_huge_pages(void *addr, uint64_t bytes);
/* engine.c: append "; "-separated text to the backend reason. */
void tio_engine_append_reason(tio_engine *engine, const char *text);
/* engine.c: the RLIMIT_MEMLOCK message for registering `bytes`. */
void tio_memlock_message(char *out, size_t len, uint64_t bytes);

#endif
