/* Linked with -lcuda: allocates, then dlopens the library named on its command line and
 * allocates through it. */
#include <dlfcn.h>
#include "cuda_decls.h"

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    USE_DEVICE(cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, 0);
    CUdeviceptr a;
    CHECK(cuMemAlloc_v2(&a, 1000));
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 12; }
    CUdeviceptr (*late)(size_t) = (CUdeviceptr (*)(size_t))dlsym(lib, "vramtrace_late_alloc");
    CUdeviceptr b = late(2000);
    printf("late %llu\n", b);
    CHECK(cuMemFree_v2(b));
    CHECK(cuMemFree_v2(a));
    return 0;
}
