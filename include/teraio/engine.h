/*
 * teraio/engine.h — asynchronous storage I/O between memory and SSD files.
 *
 * The engine moves bytes between addresses and files; it knows nothing of
 * tensors or plans.  Each SSD directory gets one preallocated backing file
 * (`teraio.<pid>.<16 random hex digits>.<dir>.data`, mode 0600, removed on
 * destroy), flock'ed while the engine lives.  At create, backing files of
 * that pattern in the directory that belong to this user and whose lock
 * nobody holds (left by a job that was killed) are removed, each logged as a
 * warning.  Space is handed out as extents in one logical address space
 * that is striped across the directories in `stripe_bytes` units (logical
 * offset o lives in directory (o / stripe) % n_dirs at file offset
 * (o / (stripe * n_dirs)) * stripe + o % stripe).  Extents are 4 KiB-
 * aligned; requests of any length (not only multiples of 4 KiB) and any
 * buffer alignment are accepted: unaligned parts go through aligned bounce
 * buffers.
 *
 * Backends, chosen by a probe that does a real aligned write and read in
 * each directory: io_uring with O_DIRECT; else a thread pool of
 * pread/pwrite (O_DIRECT where the file system allows it, buffered I/O
 * otherwise).  tio_engine_backend() says which and why.
 *
 * Queues: each directory keeps four pending queues, urgent and normal for
 * reads and for writes.  Its backend always takes urgent chunks first (reads
 * before writes), then alternates between normal reads and normal writes, so
 * a long stream of offloads cannot hold back a prefetch or the reverse.
 *
 * io_uring specifics: the backing file is registered with each ring (fixed
 * file), and so are the engine's bounce buffers (fixed buffers); memory the
 * caller registers with tio_engine_register_buffer is used with
 * IORING_OP_READ_FIXED / WRITE_FIXED too, which saves the kernel pinning
 * the pages of every request.  Registration pins memory, which counts
 * against RLIMIT_MEMLOCK for processes without CAP_IPC_LOCK; when the limit
 * is too low the engine says so (naming the limit and how to raise it) in
 * tio_engine_backend_reason and the log, and carries on with unregistered
 * buffers.
 *
 * Integrity (options.checksum, on by default): a write computes the CRC32C
 * of each chunk it wrote and keeps them with the extent; a read of exactly
 * that many bytes recomputes each chunk's and completes with TIO_ECORRUPT
 * when one differs: "read from '<file>' at offset <file offset> (<n> bytes):
 * CRC32C mismatch (written 0x.., read 0x..); tag <tag>, extent at offset
 * <o> (<n> bytes)" (a bounce-buffered chunk's bytes are then not copied to
 * the caller).  An extent whose last write failed cannot be read
 * (TIO_ECORRUPT, "last write failed"): a failed write never passes for
 * stored data.  Reads of another length than the last write are not
 * checked.  With checksums on, every request must name an extent exactly as
 * tio_engine_alloc returned it (-EINVAL otherwise).  The cost is measured in
 * docs/engine.md.
 *
 * Environment (read once, by tio_engine_create):
 *   TERAIO_ENGINE_BACKEND=auto|io_uring|psync  overrides options.backend,
 *       e.g. for systems whose seccomp filter breaks io_uring in odd ways.
 *       An invalid value makes create fail with -EINVAL.  The older name
 *       TIO_ENGINE_BACKEND is read when TERAIO_ENGINE_BACKEND is unset.
 * Fault injection and forced probe refusals for tests are not reachable from
 * here or from the environment: tests pass them explicitly (the private
 * src/engine/engine_test.h).
 *
 * Every completion's length is checked; short transfers are resubmitted for
 * the rest; EINTR/EAGAIN are retried; any other error completes the request
 * with -errno and a message naming the file and offset.
 *
 * Memory: each directory that holds data gets bounce buffers of
 * min(request_bytes, stripe_bytes): queue_depth of them (at least 4), at
 * most 64 MiB per directory, 256 MiB per engine, and no more than its share
 * of the space can use.  Beyond that: one ring (io_uring) or four threads
 * (psync) per directory and one allocation per request.
 *
 * Thread-safety: one engine may be used from one thread at a time (the
 * runtime's thread); it runs its own worker threads internally.  The
 * reference count (tio_engine_retain / tio_engine_destroy) is atomic.
 */
#ifndef TERAIO_ENGINE_H
#define TERAIO_ENGINE_H

#include "teraio/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TIO_EXTENT_ALIGN 4096u

typedef enum {
    TIO_BACKEND_AUTO = 0,     /* probe: io_uring, then psync */
    TIO_BACKEND_IO_URING = 1, /* io_uring only (fail if refused) */
    TIO_BACKEND_PSYNC = 2,    /* thread pool of pread/pwrite */
} tio_backend;

#define TIO_ENGINE_MAX_DIRS 64u

typedef struct {
    const char *const *dirs;  /* SSD directories (must exist, be writable) */
    uint32_t n_dirs;          /* 1 to TIO_ENGINE_MAX_DIRS */
    uint64_t space_bytes;     /* SSD space to preallocate, split over dirs (not
                                 the plan's capacity_bytes, the device budget) */
    uint32_t stripe_bytes;    /* striping unit, multiple of 4 KiB; default 1 MiB */
    uint32_t queue_depth;     /* in-flight requests per directory, <= 4096;
                                 default 32 */
    uint32_t request_bytes;   /* max bytes per I/O request, multiple of 4 KiB
                                 up to 1 GiB; default 1 MiB */
    tio_backend backend;      /* default AUTO */
    bool checksum;            /* CRC32C per chunk (see above); default on */
} tio_engine_options;

/* Defaults for everything except dirs/n_dirs/space_bytes.  create also
 * treats 0 in stripe_bytes, queue_depth or request_bytes as the default. */
TIO_API void tio_engine_options_default(tio_engine_options *opt);

typedef struct tio_engine tio_engine;

/* A region of the engine's striped space. */
typedef struct {
    uint64_t offset;   /* logical offset, multiple of TIO_EXTENT_ALIGN */
    uint64_t bytes;    /* reserved length, multiple of TIO_EXTENT_ALIGN */
} tio_extent;

/* Create the engine: check each directory, create and preallocate the
 * backing files, probe the backend.  `opt->dirs` is copied: it need not
 * outlive the call.  The logical space is space_bytes rounded up to
 * 4 KiB.
 * Returns 0; -ENOENT / -ENOTDIR / -EACCES (a directory missing or not
 * writable: message names it); -ENOSPC (cannot preallocate); -EPROTONOSUPPORT
 * (backend IO_URING forced but refused); -EINVAL; -ENOMEM. */
TIO_API int tio_engine_create(const tio_engine_options *opt, tio_engine **out);

/* Drop the caller's reference.  The last reference waits for in-flight
 * requests, closes and deletes the backing files; completions not reaped
 * are dropped.  NULL is a no-op. */
TIO_API void tio_engine_destroy(tio_engine *engine);

/* Take one more reference (returns `engine`; NULL stays NULL): the engine
 * stays open until every reference is dropped with tio_engine_destroy.  A
 * runtime holds one while it exists, so an engine destroyed by its creator
 * while a runtime still uses it stays valid until the runtime is destroyed.
 * The count is atomic; everything else keeps the one-thread rule below. */
TIO_API tio_engine *tio_engine_retain(tio_engine *engine);

/* The backend in use and, if it is not the preferred one, why
 * (e.g. "psync: io_uring_queue_init: Operation not permitted"; with
 * "buffered I/O: O_DIRECT refused by <dir>" appended, "; "-separated, when
 * a file system refused O_DIRECT).  The reason is "" for io_uring with
 * O_DIRECT everywhere; never NULL, owned by the engine. */
TIO_API tio_backend tio_engine_backend(const tio_engine *engine);
TIO_API const char *tio_engine_backend_reason(const tio_engine *engine);
TIO_API const char *tio_backend_name(tio_backend backend);

/* Whether the io_uring rings use registered (fixed) buffers and the
 * registered backing file; false for psync and after a refused
 * registration (the reason says why). */
TIO_API bool tio_engine_fixed_buffers(const tio_engine *engine);
TIO_API bool tio_engine_fixed_files(const tio_engine *engine);

/* Register [addr, addr + bytes) with every ring, so that requests whose
 * buffer lies inside it (4 KiB-aligned parts, which go to the disk without a
 * bounce buffer) use fixed-buffer I/O.  The memory must stay valid until
 * tio_engine_unregister_buffer or destroy.  Registration uses one slot per
 * started GiB of a region, TIO_ENGINE_MAX_REGISTERED slots in all.  With the
 * psync backend or when fixed buffers are off, the call records nothing and
 * returns 0.  The call also asks the kernel to back the region's 2 MiB-
 * aligned part with huge pages (madvise MADV_HUGEPAGE, and a collapse of the
 * pages already present; the bytes do not change): a fixed buffer of 4 KiB
 * pages is one segment per page, which splits every 1 MiB request on disks
 * that take fewer segments (docs/engine.md).  Allocate 2 MiB-aligned to get
 * the whole region.
 * Returns 0; -EINVAL (bytes == 0, overlaps a registered region); -ENOSPC
 * (out of slots); -ENOMEM with a message naming RLIMIT_MEMLOCK and the
 * fix when the kernel refuses to pin that much; another -errno from
 * io_uring_register.  Caller's thread only. */
#define TIO_ENGINE_MAX_REGISTERED 64u
TIO_API int tio_engine_register_buffer(tio_engine *engine, void *addr, uint64_t bytes);
/* Forget a region registered at `addr`.  Requests already submitted keep
 * their pages pinned until they complete.  Returns 0 or -EINVAL (not
 * registered; always 0 where register recorded nothing). */
TIO_API int tio_engine_unregister_buffer(tio_engine *engine, void *addr);

/* Space accounting of the extent allocator.  Fragmentation shows as
 * largest_free_bytes < free_bytes (1 - largest/free is the usual measure). */
typedef struct {
    uint64_t space_bytes;         /* the logical space (space_bytes rounded up) */
    uint64_t free_bytes;          /* sum of the free ranges */
    uint64_t largest_free_bytes;  /* the largest allocation that can succeed */
    uint32_t free_extents;        /* number of free ranges (never touching) */
    uint32_t used_extents;        /* extents allocated and not freed */
} tio_engine_space;
TIO_API void tio_engine_space_stats(const tio_engine *engine, tio_engine_space *out);

/* Reserve space for `bytes` (rounded up to 4 KiB), first fit.
 * Returns 0, -ENOSPC (no free range that large), -EINVAL (bytes == 0),
 * -ENOMEM.  Not thread-safe (the engine's one caller thread). */
TIO_API int tio_engine_alloc(tio_engine *engine, uint64_t bytes, tio_extent *out);
/* Return an extent's space (the extent exactly as alloc gave it); adjacent
 * free ranges are merged.  Returns 0 or -EINVAL (not allocated). */
TIO_API int tio_engine_free(tio_engine *engine, const tio_extent *extent);

/* Queue a write of `bytes` (<= extent->bytes) from `buf` into the extent, or
 * a read into `buf`.  `buf` must stay valid until the request completes.
 * `tag` is returned in the completion.  Returns 0 or -EINVAL (extent outside
 * the space, bytes > extent->bytes), -ENOMEM.  bytes == 0 completes at once.
 * Urgent requests are served before queued non-urgent ones (those not yet
 * handed to the kernel or a worker thread). */
TIO_API int tio_engine_submit_write(tio_engine *engine, const tio_extent *extent,
                                    const void *buf, uint64_t bytes, uint64_t tag, bool urgent);
TIO_API int tio_engine_submit_read(tio_engine *engine, const tio_extent *extent,
                                   void *buf, uint64_t bytes, uint64_t tag, bool urgent);

typedef struct {
    uint64_t tag;
    int result;        /* 0, -errno of the first failure, or TIO_ECORRUPT
                          (message in tio_engine_completion_error) */
} tio_completion;

/* Collect finished requests: waits until at least `min_complete` are
 * available (0: don't wait), stores up to `max` in `out`, oldest first.
 * Returns the number stored (>= 0), or -EINVAL when min_complete > max or
 * min_complete > tio_engine_in_flight() (it would wait forever).  If a
 * stored completion failed, tio_last_error() holds the first one's message. */
TIO_API int tio_engine_reap(tio_engine *engine, tio_completion *out, uint32_t max,
                            uint32_t min_complete);

/* Message of a failed completion with this tag returned by the most recent
 * tio_engine_reap, e.g. "write to '/ssd/teraio.12.0.0.data' at offset 1048576
 * (4096 bytes): Input/output error"; "" if there is none.  Valid until the
 * next reap. */
TIO_API const char *tio_engine_completion_error(const tio_engine *engine, uint64_t tag);

/* Requests submitted and not yet reaped. */
TIO_API uint32_t tio_engine_in_flight(const tio_engine *engine);

/* Synchronous helpers: submit one request and wait for it (other requests'
 * completions that arrive meanwhile stay queued for tio_engine_reap).
 * Return 0, a submit error, or the request's -errno (message in
 * tio_last_error()). */
TIO_API int tio_engine_write(tio_engine *engine, const tio_extent *extent, const void *buf,
                             uint64_t bytes);
TIO_API int tio_engine_read(tio_engine *engine, const tio_extent *extent, void *buf,
                            uint64_t bytes);

/* Path of directory i's backing file (for tests and tools); NULL if
 * dir >= n_dirs. */
TIO_API const char *tio_engine_backing_path(const tio_engine *engine, uint32_t dir);

#ifdef __cplusplus
}
#endif
#endif
