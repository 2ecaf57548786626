/* What NVTX's loader does on the first NVTX call: dlopen NVTX_INJECTION64_PATH, look up
 * InitializeInjectionNvtx2 on that handle with dlsym and call it. Then allocates and frees
 * device memory. Linked with -lcuda. Prints "injection <result>" and the pointers. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include "cuda_decls.h"

static void *export_table(unsigned id) {
    (void)id;
    return NULL;
}

int main(void) {
    const char *path = getenv("NVTX_INJECTION64_PATH");
    int result = -1;
    if (path && *path) {
        void *lib = dlopen(path, RTLD_LAZY);
        if (!lib) {
            fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
            return 11;
        }
        int (*init)(void *) = (int (*)(void *))dlsym(lib, "InitializeInjectionNvtx2");
        if (!init) return 12;
        Dl_info di;
        if (dladdr((void *)init, &di) && di.dli_fname) {
            const char *base = di.dli_fname;
            for (const char *c = di.dli_fname; *c; c++)
                if (*c == '/') base = c + 1;
            printf("init from %s\n", base);
        }
        result = init((void *)export_table);
    }
    printf("injection %d\n", result);
    USE_DEVICE(cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, 0);
    CUdeviceptr a, b;
    CHECK(cuMemAlloc_v2(&a, 1 << 20));
    CHECK(cuMemAlloc_v2(&b, 3 << 20));
    printf("a %llu\nb %llu\n", a, b);
    CHECK(cuMemFree_v2(a));
    CHECK(cuMemFree_v2(b));
    return 0;
}
