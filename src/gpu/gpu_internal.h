/*
 * gpu/gpu_internal.h — teraio's own declarations of the CUDA runtime and
 * cuFile entry points it loads with dlopen, and the engine's GPU state (the
 * staging ring in staging.c, GPUDirect Storage in backend_cufile.c, the
 * attachment in gpu.c).  Only src/gpu and the GPU tests include it: the
 * engine reaches the GPU through the device route gpu.c sets at attach
 * (tio_engine_device_route in engine/engine_internal.h), and tio_engine.gpu
 * points to the tio_engine_gpu below.
 *
 * No CUDA or cuFile header is included anywhere in the library: the types
 * below are written from the published ABI (cuda_runtime_api.h,
 * driver_types.h; cufile.h as tabled in docs/gpu.md), with static asserts on
 * every size and offset teraio relies on.  tests/c/test_cuda_abi.c checks
 * the CUDA ones against the toolkit's headers where a toolkit is installed;
 * the stand-in libcufile the tests build reads every cuFile struct by raw
 * byte offsets, so a layout slip fails its tests.
 */
#ifndef TERAIO_GPU_INTERNAL_H
#define TERAIO_GPU_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/types.h>
#include <time.h>

#include "teraio/gpu.h"

/* ---- CUDA runtime (libcudart) ------------------------------------------ */

typedef int tio_cuda_err;   /* cudaError_t (an enum: 4 bytes) */
typedef void *tio_cuda_stream; /* cudaStream_t */
typedef void *tio_cuda_event;  /* cudaEvent_t */

enum {
    TIO_CUDA_SUCCESS = 0,
    TIO_CUDA_ERROR_INVALID_VALUE = 1,
    TIO_CUDA_ERROR_NO_DEVICE = 100,
    TIO_CUDA_ERROR_NOT_READY = 600,
};
enum { TIO_CUDA_MEMCPY_H2D = 1, TIO_CUDA_MEMCPY_D2H = 2, TIO_CUDA_MEMCPY_DEFAULT = 4 };
enum { TIO_CUDA_MEMORY_UNREGISTERED = 0, TIO_CUDA_MEMORY_HOST = 1, TIO_CUDA_MEMORY_DEVICE = 2,
       TIO_CUDA_MEMORY_MANAGED = 3 };
#define TIO_CUDA_STREAM_NON_BLOCKING 0x01u  /* cudaStreamNonBlocking */
#define TIO_CUDA_EVENT_DISABLE_TIMING 0x02u /* cudaEventDisableTiming */
#define TIO_CUDA_HOST_REGISTER_DEFAULT 0x00u

/* struct cudaPointerAttributes: CUDA 11 and 12 end after hostPointer (24
 * bytes), CUDA 13 adds `long reserved[8]` (88 bytes).  The runtime writes
 * its own size, so teraio passes room for more. */
typedef struct {
    int type;                /* enum cudaMemoryType */
    int device;
    void *device_pointer;
    void *host_pointer;
    long reserved[8];
    char room[160];
} tio_cuda_pointer_attributes;
_Static_assert(offsetof(tio_cuda_pointer_attributes, device) == 4, "cudaPointerAttributes.device");
_Static_assert(offsetof(tio_cuda_pointer_attributes, device_pointer) == 8,
               "cudaPointerAttributes.devicePointer");
_Static_assert(offsetof(tio_cuda_pointer_attributes, host_pointer) == 16,
               "cudaPointerAttributes.hostPointer");
_Static_assert(offsetof(tio_cuda_pointer_attributes, reserved) == 24,
               "cudaPointerAttributes.reserved");

typedef void (*tio_cuda_host_fn)(void *arg); /* cudaHostFn_t */

/* The entry points teraio calls, looked up by their plain (legacy default
 * stream) names; teraio always names its streams. */
typedef struct {
    tio_cuda_err (*GetDeviceCount)(int *count);
    tio_cuda_err (*SetDevice)(int device);
    tio_cuda_err (*GetDevice)(int *device);
    const char *(*GetErrorString)(tio_cuda_err err);
    tio_cuda_err (*RuntimeGetVersion)(int *v);
    tio_cuda_err (*DriverGetVersion)(int *v);
    tio_cuda_err (*HostRegister)(void *ptr, size_t size, unsigned flags);
    tio_cuda_err (*HostUnregister)(void *ptr);
    tio_cuda_err (*StreamCreateWithFlags)(tio_cuda_stream *s, unsigned flags);
    tio_cuda_err (*StreamDestroy)(tio_cuda_stream s);
    tio_cuda_err (*StreamWaitEvent)(tio_cuda_stream s, tio_cuda_event e, unsigned flags);
    tio_cuda_err (*StreamSynchronize)(tio_cuda_stream s);
    tio_cuda_err (*EventCreateWithFlags)(tio_cuda_event *e, unsigned flags);
    tio_cuda_err (*EventDestroy)(tio_cuda_event e);
    tio_cuda_err (*EventRecord)(tio_cuda_event e, tio_cuda_stream s);
    tio_cuda_err (*EventSynchronize)(tio_cuda_event e);
    tio_cuda_err (*MemcpyAsync)(void *dst, const void *src, size_t n, int kind, tio_cuda_stream s);
    tio_cuda_err (*Memcpy)(void *dst, const void *src, size_t n, int kind);
    tio_cuda_err (*LaunchHostFunc)(tio_cuda_stream s, tio_cuda_host_fn fn, void *arg);
    tio_cuda_err (*PointerGetAttributes)(tio_cuda_pointer_attributes *a, const void *p);
    tio_cuda_err (*Malloc)(void **p, size_t n);
    tio_cuda_err (*Free)(void *p);
    tio_cuda_err (*GetLastError)(void);
} tio_cudart;

/* cuda_rt.c: the loaded runtime, or NULL with `info` saying why (info may
 * be NULL).  Loaded once per process.  Thread-safe. */
const tio_cudart *tio_cudart_load(tio_cuda_info *info);
/* "cudaMemcpyAsync: invalid argument (CUDA error 1)" into buf. */
const char *tio_cuda_msg(const tio_cudart *rt, const char *call, tio_cuda_err err, char *buf,
                         size_t len);
/* Is `p` device memory (cudaMemoryTypeDevice)? */
bool tio_cuda_is_device(const tio_cudart *rt, const void *p);

/* ---- cuFile (libcufile), from cufile.h ------------------------------------ */

/* CUfileError_t, returned by value: {CUfileOpError err; CUresult cu_err}. */
typedef struct {
    int err;                 /* CU_FILE_SUCCESS 0, else 5000 + n */
    int cu_err;              /* CUresult when err is CU_FILE_CUDA_DRIVER_ERROR */
} tio_cufile_error;
_Static_assert(sizeof(tio_cufile_error) == 8, "CUfileError_t");
_Static_assert(offsetof(tio_cufile_error, cu_err) == 4, "CUfileError_t.cu_err");

enum {
    TIO_CU_FILE_SUCCESS = 0,
    TIO_CU_FILE_DRIVER_NOT_INITIALIZED = 5001,
    TIO_CU_FILE_DRIVER_INVALID_PROPS = 5002,
    TIO_CU_FILE_DRIVER_UNSUPPORTED_LIMIT = 5003,
    TIO_CU_FILE_DRIVER_VERSION_MISMATCH = 5004,
    TIO_CU_FILE_DRIVER_VERSION_READ_ERROR = 5005,
    TIO_CU_FILE_DRIVER_CLOSING = 5006,
    TIO_CU_FILE_PLATFORM_NOT_SUPPORTED = 5007,
    TIO_CU_FILE_IO_NOT_SUPPORTED = 5008,
    TIO_CU_FILE_DEVICE_NOT_SUPPORTED = 5009,
    TIO_CU_FILE_NVFS_DRIVER_ERROR = 5010,
    TIO_CU_FILE_CUDA_DRIVER_ERROR = 5011,
    TIO_CU_FILE_CUDA_POINTER_INVALID = 5012,
    TIO_CU_FILE_CUDA_MEMORY_TYPE_INVALID = 5013,
    TIO_CU_FILE_CUDA_POINTER_RANGE_ERROR = 5014,
    TIO_CU_FILE_CUDA_CONTEXT_MISMATCH = 5015,
    TIO_CU_FILE_INVALID_MAPPING_SIZE = 5016,
    TIO_CU_FILE_INVALID_MAPPING_RANGE = 5017,
    TIO_CU_FILE_INVALID_FILE_TYPE = 5018,
    TIO_CU_FILE_INVALID_FILE_OPEN_FLAG = 5019,
    TIO_CU_FILE_DIO_NOT_SET = 5020,
    TIO_CU_FILE_INVALID_VALUE = 5022,
    TIO_CU_FILE_MEMORY_ALREADY_REGISTERED = 5023,
    TIO_CU_FILE_MEMORY_NOT_REGISTERED = 5024,
    TIO_CU_FILE_PERMISSION_DENIED = 5025,
    TIO_CU_FILE_DRIVER_ALREADY_OPEN = 5026,
    TIO_CU_FILE_HANDLE_NOT_REGISTERED = 5027,
    TIO_CU_FILE_HANDLE_ALREADY_REGISTERED = 5028,
    TIO_CU_FILE_DEVICE_NOT_FOUND = 5029,
    TIO_CU_FILE_INTERNAL_ERROR = 5030,
    TIO_CU_FILE_GETNEWFD_FAILED = 5031,
    TIO_CU_FILE_NVFS_SETUP_ERROR = 5033,
    TIO_CU_FILE_IO_DISABLED = 5034,
    TIO_CU_FILE_BATCH_SUBMIT_FAILED = 5035,
    TIO_CU_FILE_GPU_MEMORY_PINNING_FAILED = 5036,
    TIO_CU_FILE_BATCH_FULL = 5037,
    TIO_CU_FILE_ASYNC_NOT_SUPPORTED = 5038,
};

enum { TIO_CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1 };

/* CUfileDescr_t: {type; union {int fd; void *handle}; const CUfileFSOps_t *fs_ops}. */
typedef struct {
    int type;
    union {
        int fd;
        void *handle;
    } handle;
    const void *fs_ops;      /* must be NULL */
} tio_cufile_descr;
_Static_assert(sizeof(tio_cufile_descr) == 24, "CUfileDescr_t");
_Static_assert(offsetof(tio_cufile_descr, handle) == 8, "CUfileDescr_t.handle");
_Static_assert(offsetof(tio_cufile_descr, fs_ops) == 16, "CUfileDescr_t.fs_ops");

typedef void *tio_cufile_handle;       /* CUfileHandle_t */
typedef void *tio_cufile_batch_handle; /* CUfileBatchHandle_t */

enum { TIO_CUFILE_BATCH = 1 };                 /* CUfileBatchMode_t */
enum { TIO_CUFILE_READ = 0, TIO_CUFILE_WRITE = 1 }; /* CUfileOpcode_t */

/* CUfileIOParams_t: mode first, then the batch union {devPtr_base,
 * file_offset, devPtr_offset, size}, fh, opcode, cookie. */
typedef struct {
    int mode;
    void *dev_ptr_base;
    off_t file_offset;
    off_t dev_ptr_offset;
    size_t size;
    tio_cufile_handle fh;
    int opcode;
    void *cookie;
} tio_cufile_io_params;
_Static_assert(sizeof(tio_cufile_io_params) == 64, "CUfileIOParams_t");
_Static_assert(offsetof(tio_cufile_io_params, dev_ptr_base) == 8, "CUfileIOParams_t.devPtr_base");
_Static_assert(offsetof(tio_cufile_io_params, file_offset) == 16, "CUfileIOParams_t.file_offset");
_Static_assert(offsetof(tio_cufile_io_params, dev_ptr_offset) == 24,
               "CUfileIOParams_t.devPtr_offset");
_Static_assert(offsetof(tio_cufile_io_params, size) == 32, "CUfileIOParams_t.size");
_Static_assert(offsetof(tio_cufile_io_params, fh) == 40, "CUfileIOParams_t.fh");
_Static_assert(offsetof(tio_cufile_io_params, opcode) == 48, "CUfileIOParams_t.opcode");
_Static_assert(offsetof(tio_cufile_io_params, cookie) == 56, "CUfileIOParams_t.cookie");

enum {
    TIO_CUFILE_WAITING = 0x1, TIO_CUFILE_PENDING = 0x2, TIO_CUFILE_INVALID = 0x4,
    TIO_CUFILE_CANCELED = 0x8, TIO_CUFILE_COMPLETE = 0x10, TIO_CUFILE_TIMEOUT = 0x20,
    TIO_CUFILE_FAILED = 0x40,
};

/* CUfileIOEvents_t: {void *cookie; CUfileStatus_t status; size_t ret}. */
typedef struct {
    void *cookie;
    int status;
    size_t ret;              /* read as ssize_t: < 0 an error, else bytes done */
} tio_cufile_io_event;
_Static_assert(sizeof(tio_cufile_io_event) == 24, "CUfileIOEvents_t");
_Static_assert(offsetof(tio_cufile_io_event, status) == 8, "CUfileIOEvents_t.status");
_Static_assert(offsetof(tio_cufile_io_event, ret) == 16, "CUfileIOEvents_t.ret");

#define TIO_CU_FILE_ALLOW_COMPAT_MODE 1u /* bit of nvfs.dcontrolflags */

/* CUfileDrvProps_t. */
typedef struct {
    struct {
        unsigned int major_version;
        unsigned int minor_version;
        size_t poll_thresh_size;
        size_t max_direct_io_size;
        unsigned int dstatusflags;
        unsigned int dcontrolflags;
    } nvfs;
    unsigned int fflags;
    unsigned int max_device_cache_size;
    unsigned int per_buffer_cache_size;
    unsigned int max_device_pinned_mem_size;
    unsigned int max_batch_io_size;
    unsigned int max_batch_io_timeout_msecs;
} tio_cufile_drv_props;
_Static_assert(sizeof(tio_cufile_drv_props) == 56, "CUfileDrvProps_t");
_Static_assert(offsetof(tio_cufile_drv_props, nvfs.poll_thresh_size) == 8, "nvfs.poll_thresh_size");
_Static_assert(offsetof(tio_cufile_drv_props, nvfs.dcontrolflags) == 28, "nvfs.dcontrolflags");
_Static_assert(offsetof(tio_cufile_drv_props, fflags) == 32, "CUfileDrvProps_t.fflags");
_Static_assert(offsetof(tio_cufile_drv_props, max_batch_io_size) == 48,
               "CUfileDrvProps_t.max_batch_io_size");

/* The most entries teraio puts in one batch (cuFile's io_batchsize default). */
#define TIO_CUFILE_MAX_BATCH 128u

typedef struct {
    tio_cufile_error (*DriverOpen)(void);
    tio_cufile_error (*DriverClose)(void);  /* cuFileDriverClose_v2, else the plain one */
    const char *close_symbol;               /* which of the two was found */
    tio_cufile_error (*DriverGetProperties)(tio_cufile_drv_props *props);
    tio_cufile_error (*HandleRegister)(tio_cufile_handle *fh, tio_cufile_descr *descr);
    void (*HandleDeregister)(tio_cufile_handle fh);
    tio_cufile_error (*BufRegister)(const void *base, size_t len, int flags);
    tio_cufile_error (*BufDeregister)(const void *base);
    ssize_t (*Read)(tio_cufile_handle fh, void *base, size_t size, off_t file_off, off_t buf_off);
    ssize_t (*Write)(tio_cufile_handle fh, const void *base, size_t size, off_t file_off,
                     off_t buf_off);
    tio_cufile_error (*GetVersion)(int *version);  /* NULL before 1.8 */
    /* Batch API, all four or none (cuFile >= 1.7). */
    tio_cufile_error (*BatchIOSetUp)(tio_cufile_batch_handle *b, unsigned nr);
    tio_cufile_error (*BatchIOSubmit)(tio_cufile_batch_handle b, unsigned nr,
                                      tio_cufile_io_params *params, unsigned flags);
    tio_cufile_error (*BatchIOGetStatus)(tio_cufile_batch_handle b, unsigned min_nr,
                                         unsigned *nr, tio_cufile_io_event *events,
                                         struct timespec *timeout);
    tio_cufile_error (*BatchIOCancel)(tio_cufile_batch_handle b);
    void (*BatchIODestroy)(tio_cufile_batch_handle b);
} tio_cufile_api;

/* cufile.c: the loaded library (symbols only; the driver is not opened), or
 * NULL with `why` filled.  Loaded once per process.  Thread-safe. */
const tio_cufile_api *tio_cufile_load(char *library, size_t library_len, char *why,
                                      size_t why_len);
/* Open the driver (reference-counted across engines) and read its
 * properties into *props.  Returns 0 or a -errno with `why` naming the
 * cuFile error. */
int tio_cufile_driver_open(const tio_cufile_api *api, tio_cufile_drv_props *props, char *why,
                           size_t why_len);
void tio_cufile_driver_close(const tio_cufile_api *api);
/* cuFile error -> -errno, and "cuFileBufRegister: CU_FILE_INVALID_VALUE
 * (5022)" (with the CUresult for CUDA driver errors). */
int tio_cufile_errno(tio_cufile_error e);
const char *tio_cufile_msg(const char *call, tio_cufile_error e, char *buf, size_t len);
const char *tio_cufile_error_name(int err);

/* ---- the engine's GPU attachment ----------------------------------------- */

typedef struct tio_staging tio_staging;   /* staging.c */
typedef struct tio_gds tio_gds;           /* backend_cufile.c */
struct tio_engine;
struct tio_chunk;
struct tio_req;

/* Test hooks for tio_engine_gpu_attach_test. */
typedef struct {
    bool ignore_cap_ipc_lock;   /* check RLIMIT_MEMLOCK even with CAP_IPC_LOCK */
    bool probe_prefer_cufile;   /* AUTO: take cufile whatever the timings */
} tio_engine_gpu_test_options;

typedef struct tio_engine_gpu {
    const tio_cudart *rt;
    int device;
    tio_cuda_stream stream;     /* compute stream (caller thread) */
    tio_engine_gpu_options opt;
    tio_engine_gpu_test_options test;
    tio_staging *staging;
    tio_gds *gds;
    uint8_t *dir_path;          /* [n_dirs] TIO_GPU_PATH_STAGING / _CUFILE */
    char reason[2048];

    /* Events recorded on the compute stream at submit, one per device
     * request, recycled (a leaf lock). */
    pthread_mutex_t ev_mu;
    tio_cuda_event *ev_free;
    uint32_t n_ev_free, cap_ev;
    tio_cuda_event *ev_all;     /* every event created, destroyed at detach */
    uint32_t n_ev_all, cap_ev_all;

    /* Counters (atomic: bumped on the engine's threads). */
    atomic_uint_fast64_t staged_bytes[2];   /* [TIO_OP_READ / WRITE] */
    atomic_uint_fast64_t cufile_bytes[2];
    atomic_uint_fast64_t copies, batches;
    atomic_uint max_batch;
} tio_engine_gpu;

/* gpu.c, for staging.c and backend_cufile.c (the engine's calls go through
 * the device route gpu.c sets at attach) */
/* Set the calling thread's current device (engine threads call it once). */
void tio_gpu_bind_thread(const tio_engine_gpu *g);
/* A CUDA call failed: "<call>: <CUDA's message> (CUDA error N)". */
int tio_gpu_fail(const tio_engine_gpu *g, int code, const char *call, tio_cuda_err err);

/* staging.c */
/* Map and pin the ring, register it, create the copy streams and start the
 * thread.  Returns 0 or -errno (message set). */
int tio_staging_start(struct tio_engine *e, tio_staging **out);
void tio_staging_stop(struct tio_engine *e, tio_staging *s);
/* Queue a device request's staged chunks (caller's thread). */
void tio_staging_submit(tio_staging *s, struct tio_req *r);
/* A staged chunk's disk transfer ended (backend thread, no lock held);
 * the staging ring completes it.  The device route's chunk_done. */
void tio_staging_chunk_done(struct tio_engine *e, struct tio_chunk *c, int err, const char *msg);
void tio_staging_describe(const tio_staging *s, tio_engine_gpu_stats *out, char *text,
                          size_t len);
/* The RLIMIT_MEMLOCK rule: `need` bytes locked by io_uring registration
 * under soft limit `limit` (RLIM_INFINITY: none).  Returns 0, or -ENOMEM
 * with `msg` naming the limit, the need and the fix. */
int tio_staging_memlock_check(uint64_t need, uint64_t limit, uint64_t ring_bytes,
                              uint32_t n_rings, uint64_t engine_bytes, char *msg, size_t len);

/* backend_cufile.c */
/* Open the driver and register every O_DIRECT backing file: 0, or -errno
 * with `why` (the GPU then stays on staging). */
int tio_gds_start(struct tio_engine *e, tio_gds **out, char *why, size_t why_len);
void tio_gds_stop(struct tio_engine *e, tio_gds *g);
/* Can directory `dir` use cuFile (its file registered)? */
bool tio_gds_dir_usable(const tio_gds *g, uint32_t dir, const char **why);
/* Queue the request's CUFILE chunks for their directories' cuFile threads
 * (caller's thread). */
void tio_gds_enqueue_request(tio_gds *g, struct tio_req *r);
bool tio_gds_compat_mode(const tio_gds *g);
const tio_cufile_api *tio_gds_api(const tio_gds *g);
const char *tio_gds_describe(const tio_gds *g);

/* gpu.c: tio_engine_gpu_attach with test hooks. */
int tio_engine_gpu_attach_test(struct tio_engine *e, const tio_engine_gpu_options *opt,
                               const tio_engine_gpu_test_options *test);

#endif
