/*
 * gpu/cuda_rt.c — the CUDA runtime, loaded with dlopen.
 *
 * Why dlopen and not a link: a library linked against libcudart cannot be
 * loaded where libcudart is missing (every CPU-only machine, the wheel on
 * a laptop), and one linked against libcudart.so.12 clashes with a PyTorch
 * that brought libcudart.so.13.  Loaded at run time, the same build works
 * everywhere, and in a PyTorch process teraio uses the very libcudart
 * PyTorch loaded (found among the loaded objects first), so both see the
 * same primary context, streams and events.
 *
 * The library is searched once per process (pthread_once); the outcome,
 * good or bad, is kept with its reason for tio_cuda_info_get.  "Available"
 * means every symbol teraio calls was found, a driver answered and at least
 * one device exists.  Built without CUDA (TIO_HAVE_CUDA 0) nothing is
 * searched: the state is TIO_GPU_NOT_BUILT.
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
static tio_cudart g_rt;
static tio_cuda_info g_info;
static bool g_ok;

#if TIO_HAVE_CUDA
/* The first already-loaded object whose file name starts with "libcudart.so". */
static int find_loaded(struct dl_phdr_info *info, size_t size, void *data)
{
    const char *name = info->dlpi_name, *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libcudart.so", 12) != 0)
        return 0;
    snprintf(data, sizeof g_info.library, "%s", name);
    return 1;
}

/* dlopen the first candidate that loads; its path (or name) into g_info. */
static void *open_library(char *why, size_t why_len)
{
    const char *env = tio_env("CUDART_LIBRARY");
    if (env && env[0]) {
        void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!h)
            snprintf(why, why_len, "TIO_CUDART_LIBRARY=%s: %s", env, dlerror());
        else
            snprintf(g_info.library, sizeof g_info.library, "%s", env);
        return h;
    }
    char loaded[sizeof g_info.library] = "";
    if (dl_iterate_phdr(find_loaded, loaded) && loaded[0]) {
        void *h = dlopen(loaded, RTLD_NOW | RTLD_LOCAL);
        if (h) {
            snprintf(g_info.library, sizeof g_info.library, "%s", loaded);
            return h;
        }
    }
    const char *names[] = {
        "libcudart.so.13", "libcudart.so.12",
#ifdef TIO_CUDA_LIBDIR
        TIO_CUDA_LIBDIR "/libcudart.so.13", TIO_CUDA_LIBDIR "/libcudart.so.12",
        TIO_CUDA_LIBDIR "/libcudart.so",
#endif
        "libcudart.so",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            snprintf(g_info.library, sizeof g_info.library, "%s", names[i]);
            return h;
        }
    }
    snprintf(why, why_len, "libcudart not found (no libcudart loaded in the process; tried "
             "libcudart.so.13, libcudart.so.12%s, libcudart.so; set TIO_CUDART_LIBRARY to "
             "its path)",
#ifdef TIO_CUDA_LIBDIR
             " and " TIO_CUDA_LIBDIR
#else
             ""
#endif
    );
    return NULL;
}

#endif

#define SYM(field, name) {(void **)&g_rt.field, name}

static void load_once(void)
{
    g_info.state = TIO_GPU_UNAVAILABLE;
#if !TIO_HAVE_CUDA
    g_info.state = TIO_GPU_NOT_BUILT;
    snprintf(g_info.reason, sizeof g_info.reason,
             "built without CUDA (no CUDA toolkit at configure time, or -DTIO_CUDA=OFF)");
    return;
#else
    void *h = open_library(g_info.reason, sizeof g_info.reason);
    if (!h)
        return;
    const struct { void **slot; const char *name; } syms[] = {
        SYM(GetDeviceCount, "cudaGetDeviceCount"), SYM(SetDevice, "cudaSetDevice"),
        SYM(GetDevice, "cudaGetDevice"), SYM(GetErrorString, "cudaGetErrorString"),
        SYM(RuntimeGetVersion, "cudaRuntimeGetVersion"),
        SYM(DriverGetVersion, "cudaDriverGetVersion"), SYM(HostRegister, "cudaHostRegister"),
        SYM(HostUnregister, "cudaHostUnregister"),
        SYM(StreamCreateWithFlags, "cudaStreamCreateWithFlags"),
        SYM(StreamDestroy, "cudaStreamDestroy"), SYM(StreamWaitEvent, "cudaStreamWaitEvent"),
        SYM(StreamSynchronize, "cudaStreamSynchronize"),
        SYM(EventCreateWithFlags, "cudaEventCreateWithFlags"),
        SYM(EventDestroy, "cudaEventDestroy"), SYM(EventRecord, "cudaEventRecord"),
        SYM(EventSynchronize, "cudaEventSynchronize"), SYM(MemcpyAsync, "cudaMemcpyAsync"),
        SYM(Memcpy, "cudaMemcpy"), SYM(LaunchHostFunc, "cudaLaunchHostFunc"),
        SYM(PointerGetAttributes, "cudaPointerGetAttributes"), SYM(Malloc, "cudaMalloc"),
        SYM(Free, "cudaFree"), SYM(GetLastError, "cudaGetLastError"),
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(h, syms[i].name);
        if (!*syms[i].slot) {
            snprintf(g_info.reason, sizeof g_info.reason, "%s has no symbol %s",
                     g_info.library, syms[i].name);
            return; /* the handle stays open: dlclose of a runtime is not worth the risk */
        }
    }
    g_rt.RuntimeGetVersion(&g_info.runtime_version);
    if (g_rt.DriverGetVersion(&g_info.driver_version) != TIO_CUDA_SUCCESS)
        g_info.driver_version = 0;
    int n = 0;
    tio_cuda_err err = g_rt.GetDeviceCount(&n);
    if (err != TIO_CUDA_SUCCESS || n <= 0) {
        char msg[200];
        snprintf(g_info.reason, sizeof g_info.reason, "%.110s: %.200s", g_info.library,
                 err != TIO_CUDA_SUCCESS ? tio_cuda_msg(&g_rt, "cudaGetDeviceCount", err, msg,
                                                        sizeof msg)
                                         : "cudaGetDeviceCount found no device");
        return;
    }
    g_info.devices = n;
    g_info.state = TIO_GPU_AVAILABLE;
    g_ok = true;
#endif
}

const tio_cudart *tio_cudart_load(tio_cuda_info *info)
{
    pthread_once(&g_once, load_once);
    if (info)
        *info = g_info;
    return g_ok ? &g_rt : NULL;
}

void tio_cuda_info_get(tio_cuda_info *out)
{
    tio_cudart_load(out);
}

const char *tio_cuda_msg(const tio_cudart *rt, const char *call, tio_cuda_err err, char *buf,
                         size_t len)
{
    const char *s = rt && rt->GetErrorString ? rt->GetErrorString(err) : NULL;
    snprintf(buf, len, "%s: %s (CUDA error %d)", call, s ? s : "unknown error", err);
    return buf;
}

bool tio_cuda_is_device(const tio_cudart *rt, const void *p)
{
    tio_cuda_pointer_attributes a;
    memset(&a, 0, sizeof a);
    if (rt->PointerGetAttributes(&a, p) != TIO_CUDA_SUCCESS) {
        rt->GetLastError(); /* CUDA < 11 fails for plain host memory: leave no error behind
                               for the framework's next launch check */
        return false;
    }
    return a.type == TIO_CUDA_MEMORY_DEVICE;
}
