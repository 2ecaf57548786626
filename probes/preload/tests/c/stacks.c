/* Linked with -lcuda, built without frame pointers: allocations through two named functions of
 * the program, three times from one call site and once from another, for the stack tests. */
#include "cuda_decls.h"

__attribute__((noinline)) CUdeviceptr vramtrace_test_inner(size_t n) {
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, n));
    __asm__ volatile("" ::: "memory");
    return p;
}

__attribute__((noinline)) CUdeviceptr vramtrace_test_outer(size_t n) {
    CUdeviceptr p = vramtrace_test_inner(n + 1);
    __asm__ volatile("" ::: "memory");
    return p;
}

int main(void) {
    USE_DEVICE(cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, 0);
    CUdeviceptr p[3];
    /* A volatile counter keeps the loop a loop: one call site, three calls. */
    for (volatile int i = 0; i < 3; i++) p[i] = vramtrace_test_outer(1000);
    CUdeviceptr q = vramtrace_test_inner(5000);
    for (int i = 0; i < 3; i++) CHECK(cuMemFree_v2(p[i]));
    CHECK(cuMemFree_v2(q));
    return 0;
}
