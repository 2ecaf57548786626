/* A library the late_load program dlopens after it has already allocated: its allocation's
 * stack runs through a module that did not exist when the first stack was taken. */
#include "cuda_decls.h"

__attribute__((noinline)) CUdeviceptr vramtrace_late_alloc(size_t n) {
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, n));
    __asm__ volatile("" ::: "memory");
    return p;
}
