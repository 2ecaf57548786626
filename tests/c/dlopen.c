/* Reaches the driver through dlopen + dlsym on the library's handle, as cudarc and most loaders
 * do; a dlsym on a handle never sees LD_PRELOAD symbols, so only the preload's dlsym hook can
 * catch it. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "cuda_abi.h"

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 12; }
    cuInit_t init = (cuInit_t)dlsym(h, "cuInit");
    cuDeviceGet_t get = (cuDeviceGet_t)dlsym(h, "cuDeviceGet");
    cuDevicePrimaryCtxRetain_t retain = (cuDevicePrimaryCtxRetain_t)dlsym(h, "cuDevicePrimaryCtxRetain");
    cuCtxSetCurrent_t set = (cuCtxSetCurrent_t)dlsym(h, "cuCtxSetCurrent");
    cuMemAlloc_t alloc = (cuMemAlloc_t)dlsym(h, "cuMemAlloc_v2");
    cuMemFree_t mfree = (cuMemFree_t)dlsym(h, "cuMemFree_v2");
    cuMemAllocAsync_t alloc_async = (cuMemAllocAsync_t)dlsym(h, "cuMemAllocAsync");
    cuMemFreeAsync_t free_async = (cuMemFreeAsync_t)dlsym(h, "cuMemFreeAsync");
    CUdevice dev;
    CUcontext ctx;
    CHECK(init(0));
    CHECK(get(&dev, 0));
    CHECK(retain(&ctx, dev));
    CHECK(set(ctx));
    CUdeviceptr a, b;
    CHECK(alloc(&a, 3u << 20));
    CHECK(alloc_async(&b, 5u << 20, NULL));
    CHECK(free_async(b, NULL));
    CHECK(mfree(a));
    printf("done\n");
    return 0;
}
