/*
 * tests/c/test_cuda_abi.c — teraio's own declarations of the CUDA runtime
 * (src/gpu/gpu_internal.h) against the toolkit's cuda_runtime_api.h,
 * where the build found a toolkit (CMake adds its include directory to this
 * test only; the library itself never includes a CUDA header).
 *
 * Checked at compile time: the error codes, copy kinds, memory types and
 * flags teraio passes or tests for, and the offsets of
 * cudaPointerAttributes' fields, with teraio's struct at least as large as
 * the toolkit's (the runtime writes its whole struct).  cuFile has no
 * header in the CUDA toolkit this project builds with: its layout is
 * checked by the stand-in library (test_cufile.c).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>

#include "gpu/gpu_internal.h"

#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define HAVE_HEADER 1

_Static_assert((int)cudaSuccess == (int)TIO_CUDA_SUCCESS, "cudaSuccess");
_Static_assert((int)cudaErrorInvalidValue == (int)TIO_CUDA_ERROR_INVALID_VALUE, "cudaErrorInvalidValue");
_Static_assert((int)cudaErrorNoDevice == (int)TIO_CUDA_ERROR_NO_DEVICE, "cudaErrorNoDevice");
_Static_assert((int)cudaErrorNotReady == (int)TIO_CUDA_ERROR_NOT_READY, "cudaErrorNotReady");
_Static_assert(sizeof(cudaError_t) == sizeof(tio_cuda_err), "cudaError_t");
_Static_assert(sizeof(cudaStream_t) == sizeof(tio_cuda_stream), "cudaStream_t");
_Static_assert(sizeof(cudaEvent_t) == sizeof(tio_cuda_event), "cudaEvent_t");
_Static_assert((int)cudaMemcpyHostToDevice == (int)TIO_CUDA_MEMCPY_H2D, "cudaMemcpyHostToDevice");
_Static_assert((int)cudaMemcpyDeviceToHost == (int)TIO_CUDA_MEMCPY_D2H, "cudaMemcpyDeviceToHost");
_Static_assert((int)cudaMemcpyDefault == (int)TIO_CUDA_MEMCPY_DEFAULT, "cudaMemcpyDefault");
_Static_assert((int)cudaMemoryTypeUnregistered == (int)TIO_CUDA_MEMORY_UNREGISTERED, "Unregistered");
_Static_assert((int)cudaMemoryTypeHost == (int)TIO_CUDA_MEMORY_HOST, "cudaMemoryTypeHost");
_Static_assert((int)cudaMemoryTypeDevice == (int)TIO_CUDA_MEMORY_DEVICE, "cudaMemoryTypeDevice");
_Static_assert((int)cudaMemoryTypeManaged == (int)TIO_CUDA_MEMORY_MANAGED, "cudaMemoryTypeManaged");
_Static_assert((int)cudaStreamNonBlocking == (int)TIO_CUDA_STREAM_NON_BLOCKING, "cudaStreamNonBlocking");
_Static_assert((int)cudaEventDisableTiming == (int)TIO_CUDA_EVENT_DISABLE_TIMING, "cudaEventDisableTiming");
_Static_assert((int)cudaHostRegisterDefault == (int)TIO_CUDA_HOST_REGISTER_DEFAULT, "cudaHostRegisterDefault");
_Static_assert(offsetof(struct cudaPointerAttributes, type) ==
               offsetof(tio_cuda_pointer_attributes, type), "cudaPointerAttributes.type");
_Static_assert(offsetof(struct cudaPointerAttributes, device) ==
               offsetof(tio_cuda_pointer_attributes, device), "cudaPointerAttributes.device");
_Static_assert(offsetof(struct cudaPointerAttributes, devicePointer) ==
               offsetof(tio_cuda_pointer_attributes, device_pointer), "devicePointer");
_Static_assert(offsetof(struct cudaPointerAttributes, hostPointer) ==
               offsetof(tio_cuda_pointer_attributes, host_pointer), "hostPointer");
_Static_assert(sizeof(struct cudaPointerAttributes) <= sizeof(tio_cuda_pointer_attributes),
               "room for the runtime's cudaPointerAttributes");
#else
#define HAVE_HEADER 0
#endif

/* The checks above ran when this compiled; at run time, say which. */
static void test_cuda_abi_checked(void **state)
{
#if HAVE_HEADER
    print_message("checked against cuda_runtime_api.h of CUDA %d.%d\n", CUDART_VERSION / 1000,
                  CUDART_VERSION % 1000 / 10);
    assert_true(sizeof(struct cudaPointerAttributes) >= 24);
#endif
}

int main(void)
{
#if !HAVE_HEADER
    printf("needs the CUDA toolkit's headers (none found at configure time)\n");
    return 77;
#endif
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_cuda_abi_checked)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
