/*
 * gpu/cufile.c — cuFile (GPUDirect Storage), loaded with dlopen.
 *
 * No cufile.h: teraio declares the few types it passes (gpu_internal.h,
 * with static asserts on their layout) and looks every entry point up on
 * its own.  Rules from cufile.h and NVIDIA's GDS guides, each kept here:
 *   - cufile.h maps cuFileDriverClose to cuFileDriverClose_v2: look up the
 *     _v2 name first, then the plain one;
 *   - the batch API (cuFile >= 1.7) and cuFileGetVersion (>= 1.8) may be
 *     missing: a missing one is a missing feature, not an error;
 *   - the driver is reference-counted: one close per open.  teraio opens
 *     it once per process while some engine uses it (g_open_count);
 *   - GDS is real only with nvidia-fs loaded: after
 *     cuFileDriverGetProperties, nvfs version 0.0 means compatibility mode
 *     (cuFile does POSIX I/O into host memory and copies), which is
 *     reported, never hidden;
 *   - cufile.h's error-string helper is static inline, not exported: the
 *     names below are teraio's table of the published codes.
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "gpu/gpu_internal.h"
#include "teraio_config.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static tio_cufile_api g_api;
static bool g_ok;
static char g_library[256], g_why[320];

static pthread_mutex_t g_open_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_open_count;
static tio_cufile_drv_props g_props;

const char *tio_cufile_error_name(int err)
{
    static const char *const names[] = {
        [0] = "CU_FILE_SUCCESS",
        [1] = "CU_FILE_DRIVER_NOT_INITIALIZED",
        [2] = "CU_FILE_DRIVER_INVALID_PROPS",
        [3] = "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
        [4] = "CU_FILE_DRIVER_VERSION_MISMATCH",
        [5] = "CU_FILE_DRIVER_VERSION_READ_ERROR",
        [6] = "CU_FILE_DRIVER_CLOSING",
        [7] = "CU_FILE_PLATFORM_NOT_SUPPORTED",
        [8] = "CU_FILE_IO_NOT_SUPPORTED",
        [9] = "CU_FILE_DEVICE_NOT_SUPPORTED",
        [10] = "CU_FILE_NVFS_DRIVER_ERROR",
        [11] = "CU_FILE_CUDA_DRIVER_ERROR",
        [12] = "CU_FILE_CUDA_POINTER_INVALID",
        [13] = "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
        [14] = "CU_FILE_CUDA_POINTER_RANGE_ERROR",
        [15] = "CU_FILE_CUDA_CONTEXT_MISMATCH",
        [16] = "CU_FILE_INVALID_MAPPING_SIZE",
        [17] = "CU_FILE_INVALID_MAPPING_RANGE",
        [18] = "CU_FILE_INVALID_FILE_TYPE",
        [19] = "CU_FILE_INVALID_FILE_OPEN_FLAG",
        [20] = "CU_FILE_DIO_NOT_SET",
        [22] = "CU_FILE_INVALID_VALUE",
        [23] = "CU_FILE_MEMORY_ALREADY_REGISTERED",
        [24] = "CU_FILE_MEMORY_NOT_REGISTERED",
        [25] = "CU_FILE_PERMISSION_DENIED",
        [26] = "CU_FILE_DRIVER_ALREADY_OPEN",
        [27] = "CU_FILE_HANDLE_NOT_REGISTERED",
        [28] = "CU_FILE_HANDLE_ALREADY_REGISTERED",
        [29] = "CU_FILE_DEVICE_NOT_FOUND",
        [30] = "CU_FILE_INTERNAL_ERROR",
        [31] = "CU_FILE_GETNEWFD_FAILED",
        [33] = "CU_FILE_NVFS_SETUP_ERROR",
        [34] = "CU_FILE_IO_DISABLED",
        [35] = "CU_FILE_BATCH_SUBMIT_FAILED",
        [36] = "CU_FILE_GPU_MEMORY_PINNING_FAILED",
        [37] = "CU_FILE_BATCH_FULL",
        [38] = "CU_FILE_ASYNC_NOT_SUPPORTED",
        [39] = "CU_FILE_INTERNAL_BATCH_SETUP_ERROR",
        [40] = "CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR",
        [41] = "CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR",
        [42] = "CU_FILE_INTERNAL_BATCH_CANCEL_ERROR",
        [43] = "CU_FILE_NOMEM_ERROR",
        [44] = "CU_FILE_IO_ERROR",
        [45] = "CU_FILE_INTERNAL_BUF_REGISTER_ERROR",
        [46] = "CU_FILE_HASH_OPR_ERROR",
        [47] = "CU_FILE_INVALID_CONTEXT_ERROR",
        [48] = "CU_FILE_NVFS_INTERNAL_DRIVER_ERROR",
        [49] = "CU_FILE_BATCH_NOCOMPAT_ERROR",
    };
    int i = err == 0 ? 0 : err - 5000;
    if (i < 0 || i >= (int)(sizeof names / sizeof names[0]) || !names[i])
        return "unknown cuFile error";
    return names[i];
}

/* The errno closest to each cuFile failure, so callers can tell bad
 * arguments from missing support from exhausted resources. */
int tio_cufile_errno(tio_cufile_error e)
{
    switch (e.err) {
    case TIO_CU_FILE_SUCCESS:
        return 0;
    case TIO_CU_FILE_INVALID_VALUE:
    case TIO_CU_FILE_CUDA_POINTER_INVALID:
    case TIO_CU_FILE_CUDA_MEMORY_TYPE_INVALID:
    case TIO_CU_FILE_CUDA_POINTER_RANGE_ERROR:
    case TIO_CU_FILE_INVALID_MAPPING_SIZE:
    case TIO_CU_FILE_INVALID_MAPPING_RANGE:
    case TIO_CU_FILE_INVALID_FILE_TYPE:
    case TIO_CU_FILE_INVALID_FILE_OPEN_FLAG:
    case TIO_CU_FILE_DIO_NOT_SET:
    case TIO_CU_FILE_MEMORY_NOT_REGISTERED:
    case TIO_CU_FILE_HANDLE_NOT_REGISTERED:
        return -EINVAL;
    case TIO_CU_FILE_MEMORY_ALREADY_REGISTERED:
    case TIO_CU_FILE_HANDLE_ALREADY_REGISTERED:
    case TIO_CU_FILE_DRIVER_ALREADY_OPEN:
        return -EEXIST;
    case TIO_CU_FILE_PLATFORM_NOT_SUPPORTED:
    case TIO_CU_FILE_IO_NOT_SUPPORTED:
    case TIO_CU_FILE_DEVICE_NOT_SUPPORTED:
    case TIO_CU_FILE_ASYNC_NOT_SUPPORTED:
    case TIO_CU_FILE_IO_DISABLED:
        return -EOPNOTSUPP;
    case TIO_CU_FILE_DRIVER_NOT_INITIALIZED:
    case TIO_CU_FILE_DEVICE_NOT_FOUND:
    case TIO_CU_FILE_DRIVER_VERSION_MISMATCH:
    case TIO_CU_FILE_DRIVER_VERSION_READ_ERROR:
        return -ENODEV;
    case TIO_CU_FILE_PERMISSION_DENIED:
        return -EACCES;
    case TIO_CU_FILE_GPU_MEMORY_PINNING_FAILED:
    case 5043: /* CU_FILE_NOMEM_ERROR */
        return -ENOMEM;
    case TIO_CU_FILE_BATCH_FULL:
    case TIO_CU_FILE_DRIVER_CLOSING:
        return -EBUSY;
    default:
        return -EIO;
    }
}

const char *tio_cufile_msg(const char *call, tio_cufile_error e, char *buf, size_t len)
{
    if (e.err == TIO_CU_FILE_CUDA_DRIVER_ERROR)
        snprintf(buf, len, "%s: %s (%d, CUresult %d)", call, tio_cufile_error_name(e.err), e.err,
                 e.cu_err);
    else
        snprintf(buf, len, "%s: %s (%d)", call, tio_cufile_error_name(e.err), e.err);
    return buf;
}

#if TIO_HAVE_CUDA
/* The first loaded object named libcufile.so*, or libcudart's directory. */
typedef struct {
    const char *prefix;
    char path[256];
} find_ctx;

static int find_loaded(struct dl_phdr_info *info, size_t size, void *data)
{
    find_ctx *f = data;
    const char *name = info->dlpi_name, *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, f->prefix, strlen(f->prefix)) != 0)
        return 0;
    snprintf(f->path, sizeof f->path, "%s", name);
    return 1;
}

static void *try_open(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h)
        snprintf(g_library, sizeof g_library, "%.255s", path);
    return h;
}

/* Beside the libcudart in use: nvidia-cufile installs next to
 * nvidia-cuda-runtime (cu13: both in nvidia/cu13/lib; cu12:
 * nvidia/cuda_runtime/lib and nvidia/cufile/lib). */
static void *open_beside_cudart(void)
{
    tio_cuda_info info;
    tio_cudart_load(&info);
    find_ctx f = {.prefix = "libcudart.so"};
    const char *cudart = info.library;
    if (!strchr(cudart, '/') && dl_iterate_phdr(find_loaded, &f))
        cudart = f.path;
    const char *slash = strrchr(cudart, '/');
    if (!slash)
        return NULL;
    char dir[256], path[320];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - cudart), cudart);
    snprintf(path, sizeof path, "%s/libcufile.so.0", dir);
    void *h = try_open(path);
    if (!h) {
        snprintf(path, sizeof path, "%s/../../cufile/lib/libcufile.so.0", dir);
        h = try_open(path);
    }
    return h;
}

static void *open_library(void)
{
    const char *env = tio_env("CUFILE_LIBRARY");
    if (env && env[0]) {
        void *h = try_open(env);
        if (!h)
            snprintf(g_why, sizeof g_why, "TIO_CUFILE_LIBRARY=%s: %s", env, dlerror());
        return h;
    }
    find_ctx f = {.prefix = "libcufile.so"};
    void *h = NULL;
    if (dl_iterate_phdr(find_loaded, &f))
        h = try_open(f.path);
    if (!h)
        h = try_open("libcufile.so.0");
    if (!h)
        h = open_beside_cudart();
#ifdef TIO_CUDA_LIBDIR
    if (!h)
        h = try_open(TIO_CUDA_LIBDIR "/libcufile.so.0");
#endif
    if (!h)
        snprintf(g_why, sizeof g_why, "libcufile.so.0 not found (not loaded, not on the loader's "
                 "path, not beside libcudart%s; set TIO_CUFILE_LIBRARY to its path)",
#ifdef TIO_CUDA_LIBDIR
                 " or in " TIO_CUDA_LIBDIR
#else
                 ""
#endif
        );
    return h;
}

#endif

#define SYM(field, name) {(void **)&g_api.field, name}

static void load_once(void)
{
#if !TIO_HAVE_CUDA
    snprintf(g_why, sizeof g_why, "built without CUDA");
    return;
#else
    void *h = open_library();
    if (!h)
        return;
    const struct { void **slot; const char *name; } required[] = {
        SYM(DriverOpen, "cuFileDriverOpen"),
        SYM(DriverGetProperties, "cuFileDriverGetProperties"),
        SYM(HandleRegister, "cuFileHandleRegister"),
        SYM(HandleDeregister, "cuFileHandleDeregister"),
        SYM(BufRegister, "cuFileBufRegister"), SYM(BufDeregister, "cuFileBufDeregister"),
        SYM(Read, "cuFileRead"), SYM(Write, "cuFileWrite"),
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        *required[i].slot = dlsym(h, required[i].name);
        if (!*required[i].slot) {
            snprintf(g_why, sizeof g_why, "%s has no symbol %s", g_library, required[i].name);
            return;
        }
    }
    g_api.close_symbol = "cuFileDriverClose_v2";
    *(void **)&g_api.DriverClose = dlsym(h, "cuFileDriverClose_v2");
    if (!g_api.DriverClose) {
        g_api.close_symbol = "cuFileDriverClose";
        *(void **)&g_api.DriverClose = dlsym(h, "cuFileDriverClose");
    }
    if (!g_api.DriverClose) {
        snprintf(g_why, sizeof g_why, "%s has neither cuFileDriverClose_v2 nor "
                 "cuFileDriverClose", g_library);
        return;
    }
    *(void **)&g_api.GetVersion = dlsym(h, "cuFileGetVersion");
    const struct { void **slot; const char *name; } batch[] = {
        SYM(BatchIOSetUp, "cuFileBatchIOSetUp"), SYM(BatchIOSubmit, "cuFileBatchIOSubmit"),
        SYM(BatchIOGetStatus, "cuFileBatchIOGetStatus"),
        SYM(BatchIOCancel, "cuFileBatchIOCancel"), SYM(BatchIODestroy, "cuFileBatchIODestroy"),
    };
    bool all = true;
    for (size_t i = 0; i < sizeof batch / sizeof batch[0]; i++)
        all = (*batch[i].slot = dlsym(h, batch[i].name)) != NULL && all;
    if (!all)
        for (size_t i = 0; i < sizeof batch / sizeof batch[0]; i++)
            *batch[i].slot = NULL;
    g_ok = true;
#endif
}

const tio_cufile_api *tio_cufile_load(char *library, size_t library_len, char *why,
                                      size_t why_len)
{
    pthread_once(&g_once, load_once);
    if (library)
        snprintf(library, library_len, "%s", g_library);
    if (why)
        snprintf(why, why_len, "%s", g_why);
    return g_ok ? &g_api : NULL;
}

int tio_cufile_driver_open(const tio_cufile_api *api, tio_cufile_drv_props *props, char *why,
                           size_t why_len)
{
    pthread_mutex_lock(&g_open_mu);
    int rc = 0;
    if (g_open_count == 0) {
        tio_cufile_error e = api->DriverOpen();
        if (e.err != TIO_CU_FILE_SUCCESS) {
            tio_cufile_msg("cuFileDriverOpen", e, why, why_len);
            rc = tio_cufile_errno(e);
            goto out;
        }
        memset(&g_props, 0, sizeof g_props);
        e = api->DriverGetProperties(&g_props);
        if (e.err != TIO_CU_FILE_SUCCESS) {
            tio_cufile_msg("cuFileDriverGetProperties", e, why, why_len);
            rc = tio_cufile_errno(e);
            api->DriverClose();
            goto out;
        }
    }
    g_open_count++;
    *props = g_props;
out:
    pthread_mutex_unlock(&g_open_mu);
    return rc;
}

void tio_cufile_driver_close(const tio_cufile_api *api)
{
    pthread_mutex_lock(&g_open_mu);
    if (g_open_count > 0 && --g_open_count == 0) {
        tio_cufile_error e = api->DriverClose();
        if (e.err != TIO_CU_FILE_SUCCESS) {
            char msg[160];
            tio_log(TIO_LOG_WARN, "gpu: %s", tio_cufile_msg(api->close_symbol, e, msg, sizeof msg));
        }
    }
    pthread_mutex_unlock(&g_open_mu);
}

void tio_cufile_info_get(tio_cufile_info *out)
{
    memset(out, 0, sizeof *out);
    out->state = TIO_GPU_UNAVAILABLE;
#if !TIO_HAVE_CUDA
    out->state = TIO_GPU_NOT_BUILT;
    snprintf(out->reason, sizeof out->reason, "built without CUDA");
    return;
#else
    const tio_cufile_api *api = tio_cufile_load(out->library, sizeof out->library, out->reason,
                                                sizeof out->reason);
    if (!api)
        return;
    out->batch = api->BatchIOSubmit != NULL;
    int v = 0;
    if (api->GetVersion && api->GetVersion(&v).err == TIO_CU_FILE_SUCCESS)
        out->version = v;
    tio_cuda_info cuda;
    if (!tio_cudart_load(&cuda)) {
        snprintf(out->reason, sizeof out->reason, "needs CUDA: %.300s", cuda.reason);
        return;
    }
    tio_cufile_drv_props props;
    if (tio_cufile_driver_open(api, &props, out->reason, sizeof out->reason) != 0)
        return;
    tio_cufile_driver_close(api);
    out->compat_allowed = props.nvfs.dcontrolflags & TIO_CU_FILE_ALLOW_COMPAT_MODE;
    out->compat_mode = props.nvfs.major_version == 0 && props.nvfs.minor_version == 0;
    uint32_t max = props.max_batch_io_size ? props.max_batch_io_size : TIO_CUFILE_MAX_BATCH;
    out->max_batch_entries = max < TIO_CUFILE_MAX_BATCH ? max : TIO_CUFILE_MAX_BATCH;
    out->state = TIO_GPU_AVAILABLE;
    if (out->compat_mode)
        snprintf(out->reason, sizeof out->reason, "compatibility mode: nvidia-fs is not loaded "
                 "(cuFile does POSIX I/O into host memory and copies)%s",
                 out->compat_allowed ? "" : "; allow_compat_mode is off, so I/O will fail");
#endif
}
