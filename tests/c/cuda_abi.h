/* The few CUDA driver entry points the end-to-end test programs call, declared by hand from the
 * driver's documented ABI (no NVIDIA header is used or copied). */
#ifndef VRAMTRACE_TEST_CUDA_ABI_H
#define VRAMTRACE_TEST_CUDA_ABI_H
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;

typedef CUresult (*cuInit_t)(unsigned int);
typedef CUresult (*cuDeviceGet_t)(CUdevice *, int);
typedef CUresult (*cuDevicePrimaryCtxRetain_t)(CUcontext *, CUdevice);
typedef CUresult (*cuCtxSetCurrent_t)(CUcontext);
typedef CUresult (*cuMemAlloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*cuMemFree_t)(CUdeviceptr);
typedef CUresult (*cuMemAllocAsync_t)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*cuMemFreeAsync_t)(CUdeviceptr, CUstream);
typedef CUresult (*cuMemGetInfo_t)(size_t *, size_t *);
typedef CUresult (*cuMemHostAlloc_t)(void **, size_t, unsigned int);
typedef CUresult (*cuMemFreeHost_t)(void *);
typedef CUresult (*cuGetProcAddress_v2_t)(const char *, void **, int, unsigned long long, int *);

#define CHECK(call)                                                                  \
    do {                                                                             \
        CUresult r_ = (call);                                                        \
        if (r_ != 0) {                                                               \
            fprintf(stderr, "%s:%d: %s returned %d\n", __FILE__, __LINE__, #call, r_); \
            exit(10);                                                                \
        }                                                                            \
    } while (0)

#endif
