/*
 * teraio/gpu.h — CUDA device memory through the engine: a pinned staging
 * ring, and GPUDirect Storage (cuFile) where it is faster.
 *
 * Once a GPU is attached (tio_engine_gpu_attach), tio_engine_submit_write /
 * submit_read / tio_engine_write / read accept CUDA device pointers as
 * buffers.  The engine asks CUDA which memory a buffer is
 * (cudaPointerGetAttributes) and moves device memory by one of two paths,
 * chosen per SSD directory:
 *
 *   staging  a pinned host ring, allocated, cudaHostRegister'ed and
 *            registered with io_uring once at attach, never per request.
 *            An offload copies device -> ring on a dedicated copy stream
 *            (cudaMemcpyAsync), then writes the ring to the SSD; a prefetch
 *            reads the SSD into the ring, then copies ring -> device on a
 *            second copy stream.  Requests move in chunks of chunk_bytes
 *            (one slot of the ring); up to 3 slots per direction, so the
 *            copy of one chunk overlaps the disk I/O of the next.  Urgent
 *            requests take the next free slot before queued normal ones,
 *            and prefetches never wait for an offload's slot.
 *   cufile   GPUDirect Storage: cuFile's batch API reads and writes device
 *            memory straight from the backing files (one cuFile handle per
 *            backing file, opened O_DIRECT; at most 128 entries per batch).
 *
 * Ordering with the compute stream (tio_engine_gpu_set_stream): each device
 * request records a CUDA event on that stream when it is submitted; its
 * first copy waits for that event (cudaStreamWaitEvent on the copy stream;
 * cuFile: cudaEventSynchronize before the batch is submitted).  So an
 * offload copies the bytes the kernels queued before it wrote, and a
 * prefetch into memory the caching allocator handed out again overwrites it
 * only after the kernels that used it before are done.  A request
 * completes (tio_engine_reap) only when its bytes are in place: for a
 * prefetch, after the copy into device memory has finished.  Kernels
 * launched after the completion was reaped therefore never read a tensor
 * whose prefetch has not completed, without record_stream.
 *
 * Loading: nothing of CUDA is linked.  libcudart and libcufile are opened
 * with dlopen on first use and looked up symbol by symbol, so one build runs
 * on machines with and without a GPU.  CUDA support is compiled in when the
 * build found a CUDA toolkit (CMake option TIO_CUDA=AUTO|ON|OFF); otherwise
 * every call here reports "not built".  Search order, first match wins:
 *   libcudart: $TERAIO_CUDART_LIBRARY (a path; nothing else is tried), a
 *              libcudart already loaded in the process (PyTorch's),
 *              libcudart.so.13 / .so.12 on the loader's path, the toolkit
 *              found at build time, libcudart.so.
 *   libcufile: $TERAIO_CUFILE_LIBRARY (likewise), one already loaded,
 *              libcufile.so.0 on the loader's path, beside the libcudart in
 *              use (the nvidia-cufile Python package sits beside
 *              nvidia-cuda-runtime: <site>/nvidia/cu13/lib or
 *              <site>/nvidia/cufile/lib), the toolkit found at build time.
 * Both are read once per process, at the first call that needs them.  The
 * older names $TIO_CUDART_LIBRARY and $TIO_CUFILE_LIBRARY are read when the
 * TERAIO_ ones are unset.
 * cuFile's driver is opened by the first attach that uses it and closed
 * (cuFileDriverClose_v2, else cuFileDriverClose) when the last engine using
 * it is destroyed.  Do not fork() after a GPU was attached.
 *
 * Integrity: the staging path checks CRC32C like host memory (on the ring's
 * bytes); the cufile path moves bytes that never touch host memory and
 * checks nothing (tio_engine_gpu_stats.unchecked_bytes counts them).
 *
 * Thread-safety: as the engine (one caller thread).  Info calls are
 * thread-safe.
 */
#ifndef TERAIO_GPU_H
#define TERAIO_GPU_H

#include "teraio/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TIO_GPU_NOT_BUILT = 0,   /* compiled without CUDA support */
    TIO_GPU_UNAVAILABLE = 1, /* compiled in, but no library / driver / device here */
    TIO_GPU_AVAILABLE = 2,
} tio_gpu_state;

/* What CUDA runtime this process can use. */
typedef struct {
    tio_gpu_state state;
    int devices;             /* cudaGetDeviceCount; 0 unless available */
    int runtime_version;     /* cudaRuntimeGetVersion, e.g. 13000; 0 if not loaded */
    int driver_version;      /* cudaDriverGetVersion; 0 if no driver */
    char library[256];       /* the libcudart loaded ("" if none) */
    char reason[320];        /* why not available; "" when available */
} tio_cuda_info;

/* Load libcudart if not done yet and describe it.  Never fails; `out`
 * fully written.  Thread-safe. */
TIO_API void tio_cuda_info_get(tio_cuda_info *out);

/* What cuFile (GPUDirect Storage) this process can use.  Filling it opens
 * cuFile's driver (which needs a CUDA device) and closes it again unless an
 * engine holds it. */
typedef struct {
    tio_gpu_state state;
    int version;             /* cuFileGetVersion (1000 * major + 10 * minor);
                                0 before cuFile 1.8 */
    bool compat_mode;        /* nvidia-fs is not loaded: cuFile does POSIX I/O
                                into host memory plus a copy (a correctness
                                fallback, not a fast path) */
    bool compat_allowed;     /* CU_FILE_ALLOW_COMPAT_MODE is set */
    bool batch;              /* the batch API exists (cuFile >= 1.7) */
    uint32_t max_batch_entries; /* min(max_batch_io_size, 128) */
    char library[256];       /* the libcufile loaded ("" if none) */
    char reason[320];        /* why not available, or the compat-mode note */
} tio_cufile_info;

/* Describe cuFile (loads libcudart and libcufile if needed).  Never fails.
 * Thread-safe. */
TIO_API void tio_cufile_info_get(tio_cufile_info *out);

typedef enum {
    TIO_GPU_PATH_AUTO = 0,    /* probe each directory, cufile only where faster */
    TIO_GPU_PATH_STAGING = 1, /* pinned staging ring */
    TIO_GPU_PATH_CUFILE = 2,  /* GPUDirect Storage (fail attach if unusable) */
} tio_gpu_path;

TIO_API const char *tio_gpu_path_name(tio_gpu_path path);

#define TIO_GPU_DEFAULT_PINNED_BYTES (256ull << 20)
#define TIO_GPU_DEFAULT_PROBE_BYTES (16ull << 20)
/* Slots of the staging ring, in all and per direction. */
#define TIO_GPU_MAX_SLOTS 6u
#define TIO_GPU_MAX_SLOTS_PER_DIRECTION 3u

typedef struct {
    int device;              /* CUDA device the memory lives on; -1 (default):
                                the calling thread's current device */
    uint64_t pinned_bytes;   /* the staging ring's pinned host memory, a fixed
                                budget; default 256 MiB */
    uint64_t chunk_bytes;    /* one slot: the most bytes one copy moves, a
                                multiple of 4 KiB, at least the engine's
                                min(request_bytes, stripe_bytes); 0 (default):
                                pinned_bytes / 6 rounded down to 2 MiB (but at
                                least that engine chunk) */
    tio_gpu_path path;       /* default AUTO */
    uint64_t probe_bytes;    /* AUTO: bytes written and read back per path
                                and directory; default 16 MiB (less where a
                                directory's file is smaller) */
} tio_engine_gpu_options;

TIO_API void tio_engine_gpu_options_default(tio_engine_gpu_options *opt);

/* Attach a GPU to `engine`: load CUDA, create the copy streams, map and
 * pin the staging ring (cudaHostRegister, tio_engine_register_buffer),
 * start its thread; with cuFile usable, open its driver, register each
 * O_DIRECT backing file and, for AUTO, probe each directory (a real write
 * and read of probe_bytes through both paths, checked byte for byte; the
 * faster one wins, the reason says by how much).  Call it before the
 * engine holds data (the probe writes at the start of each backing file),
 * at most once per engine.
 * Slots: n = min(6, pinned_bytes / chunk_bytes); offloads get ceil(n/2) (at
 * most 3), prefetches the rest; with n == 1 both directions share the slot.
 * Returns 0;
 *   -EOPNOTSUPP  built without CUDA;
 *   -ENODEV      libcudart not found, no driver or no device (the message
 *                is tio_cuda_info's reason), or the device number is out of
 *                range;
 *   -EINVAL      a configuration that cannot work, refused with the number
 *                it needs: pinned_bytes below one chunk ("pinned budget of N
 *                bytes is below one chunk of M bytes: give at least M"),
 *                chunk_bytes not a multiple of 4 KiB or below the engine's
 *                chunk; data already stored; attached already;
 *   -ENOMEM      RLIMIT_MEMLOCK too low for registering the ring with every
 *                io_uring ring of the engine (the message names the limit
 *                and the bytes needed, and how to raise it), or
 *                cudaHostRegister / allocation failed;
 *   -EPROTONOSUPPORT  path CUFILE forced but cuFile is unusable (why);
 *   -EIO         the probe read back other bytes than it wrote.
 * Caller's thread, with the device's context usable on it. */
TIO_API int tio_engine_gpu_attach(tio_engine *engine, const tio_engine_gpu_options *opt);

/* The CUDA stream (cudaStream_t; NULL: the legacy default stream) whose
 * work device requests are ordered after, see above.  PyTorch:
 * torch.cuda.current_stream().cuda_stream.  Returns 0 or -EINVAL (no GPU
 * attached). */
TIO_API int tio_engine_gpu_set_stream(tio_engine *engine, void *stream);

/* The path directory `dir` moves device memory by (AUTO when no GPU is
 * attached or dir is out of range). */
TIO_API tio_gpu_path tio_engine_gpu_dir_path(const tio_engine *engine, uint32_t dir);

/* Why each directory got its path, "; "-separated, e.g. "dir 0: staging
 * (cufile 1.9 GB/s, staging 3.2 GB/s, write + read of 16 MiB)" or "cuFile
 * unavailable: libcufile.so.0 not found"; with the staging ring's shape
 * first ("staging ring: 6 slots of 42 MiB").  "" without a GPU.  Owned by
 * the engine. */
TIO_API const char *tio_engine_gpu_reason(const tio_engine *engine);

typedef struct {
    uint64_t pinned_bytes;       /* the ring (slots x chunk_bytes) */
    uint64_t chunk_bytes;
    uint32_t slots_offload, slots_prefetch; /* per direction (shared: 1 and 1) */
    bool slots_shared;
    bool ring_fixed_buffer;      /* the ring is an io_uring fixed buffer */
    uint64_t staged_offload_bytes, staged_prefetch_bytes; /* through the ring */
    uint64_t cufile_write_bytes, cufile_read_bytes;
    uint64_t unchecked_bytes;    /* moved without a CRC32C (cufile) */
    uint64_t copies;             /* cudaMemcpyAsync calls of the ring */
    uint64_t batches;            /* cuFileBatchIOSubmit calls */
    uint32_t max_batch_entries_used; /* largest batch submitted */
    bool cufile_compat_mode;     /* cuFile in use and in compatibility mode */
} tio_engine_gpu_stats;

/* Counters since attach (all zero without a GPU).  Caller's thread. */
TIO_API void tio_engine_gpu_get_stats(const tio_engine *engine, tio_engine_gpu_stats *out);

/* Register a long-lived device buffer with cuFile (cuFileBufRegister), so
 * cufile transfers inside it skip cuFile's internal bounce buffers.  For a
 * few large buffers only (a pool, a probe buffer): registering per tensor
 * costs more than it saves.  Without the cufile path it records nothing.
 * Returns 0, -EINVAL (no GPU attached, bytes 0), or cuFile's error mapped
 * to -errno (message names the cuFile code). */
TIO_API int tio_engine_gpu_register_buffer(tio_engine *engine, void *dev, uint64_t bytes);
/* Undo tio_engine_gpu_register_buffer for `dev` (cuFileBufDeregister), before
 * the buffer is freed; without the cufile path a no-op.  Returns 0, -EINVAL
 * (no GPU attached), or cuFile's error mapped to -errno (a `dev` that was not
 * registered is cuFile's error too). */
TIO_API int tio_engine_gpu_unregister_buffer(tio_engine *engine, void *dev);

/* Copy `bytes` between any two addresses the caller can name, host or
 * device: with a GPU attached and a device pointer on either side, a
 * cudaMemcpyAsync on the compute stream and a wait for that stream (so it
 * is ordered like the device requests); else memcpy.  For small, rare
 * copies (the runtime's host tier).  Returns 0 or -EIO (CUDA's message). */
TIO_API int tio_engine_copy(tio_engine *engine, void *dst, const void *src, uint64_t bytes);

#ifdef __cplusplus
}
#endif
#endif
