/* Reaches the driver like cudarc and other loaders: dlopen libcuda RTLD_LOCAL, dlsym each entry
 * point by its versioned name. Prints which object each looked-up pointer lives in. */
#define _GNU_SOURCE
#define VRAMTRACE_NO_PROTOTYPES
#include <dlfcn.h>
#include <string.h>
#include "cuda_decls.h"

static void *sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) { fprintf(stderr, "dlsym %s: %s\n", name, dlerror()); exit(12); }
    Dl_info info;
    if (dladdr(p, &info) && info.dli_fname)
        printf("resolved %s %s %s\n", name, strstr(info.dli_fname, "vramtrace_preload") ? "preload" : "driver",
               info.dli_sname ? info.dli_sname : "?");
    return p;
}

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 12; }
    CUresult (*init)(unsigned) = sym(h, "cuInit");
    CUresult (*get)(CUdevice *, int) = sym(h, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) = sym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*set)(CUcontext) = sym(h, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = sym(h, "cuMemAlloc_v2");
    CUresult (*mfree)(CUdeviceptr) = sym(h, "cuMemFree_v2");
    CUresult (*halloc)(void **, size_t, unsigned) = sym(h, "cuMemHostAlloc");
    CUresult (*hfree)(void *) = sym(h, "cuMemFreeHost");
    USE_DEVICE(init, get, retain, set, 0);
    CUdeviceptr a, b;
    void *hp;
    CHECK(alloc(&a, 3 << 20));
    printf("cuMemAlloc_v2 %llu %d\n", a, 3 << 20);
    CHECK(alloc(&b, 4097));
    printf("cuMemAlloc_v2 %llu 4097\n", b);
    CHECK(halloc(&hp, 8192, 0));
    printf("cuMemHostAlloc %llu 8192\n", (unsigned long long)(uintptr_t)hp);
    CHECK(mfree(a));
    CHECK(mfree(b));
    CHECK(hfree(hp));
    return 0;
}
