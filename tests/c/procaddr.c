/* Reaches the driver the way cudart 13 does: dlopen libcuda, dlsym cuGetProcAddress_v2 once, ask
 * it for "cuGetProcAddress" itself, then resolve base names with a version (and flag 2 for the
 * per-thread-default-stream twins) through the pointer it got back. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "cuda_abi.h"

#define PER_THREAD 2ULL

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 12; }
    cuGetProcAddress_v2_t gpa0 = (cuGetProcAddress_v2_t)dlsym(h, "cuGetProcAddress_v2");
    cuGetProcAddress_v2_t gpa = NULL;
    int st = 0;
    CHECK(gpa0("cuGetProcAddress", (void **)&gpa, 13000, 0, &st));
    cuInit_t init; cuDeviceGet_t get; cuDevicePrimaryCtxRetain_t retain; cuCtxSetCurrent_t set;
    cuMemAlloc_t alloc; cuMemFree_t mfree; cuMemAllocAsync_t alloc_ptsz; cuMemFreeAsync_t free_ptsz;
    cuMemGetInfo_t info;
    CHECK(gpa("cuInit", (void **)&init, 2000, 0, &st));
    CHECK(gpa("cuDeviceGet", (void **)&get, 2000, 0, &st));
    CHECK(gpa("cuDevicePrimaryCtxRetain", (void **)&retain, 7000, 0, &st));
    CHECK(gpa("cuCtxSetCurrent", (void **)&set, 4000, 0, &st));
    CHECK(gpa("cuMemAlloc", (void **)&alloc, 3020, 0, &st));
    CHECK(gpa("cuMemFree", (void **)&mfree, 3020, 0, &st));
    CHECK(gpa("cuMemAllocAsync", (void **)&alloc_ptsz, 11020, PER_THREAD, &st));
    CHECK(gpa("cuMemFreeAsync", (void **)&free_ptsz, 11020, PER_THREAD, &st));
    CHECK(gpa("cuMemGetInfo", (void **)&info, 3020, 0, &st));
    CUdevice dev;
    CUcontext ctx;
    CHECK(init(0));
    CHECK(get(&dev, 0));
    CHECK(retain(&ctx, dev));
    CHECK(set(ctx));
    CUdeviceptr a, b;
    CHECK(alloc(&a, 7u << 20));
    CHECK(alloc_ptsz(&b, 9u << 20, NULL));
    size_t free_b, total_b;
    CHECK(info(&free_b, &total_b));
    /* Ask for exactly one byte more than is free: the driver must refuse. */
    CUdeviceptr c;
    CUresult r = alloc(&c, free_b + 1);
    if (r != 2) { fprintf(stderr, "expected OOM (2), got %d\n", r); return 11; }
    CHECK(free_ptsz(b, NULL));
    CHECK(mfree(a));
    printf("done\n");
    return 0;
}
