/* Resolves through the odd driver's cuGetProcAddress_v2 like cudart does, allocates through
 * each pointer, and prints where each pointer lives and which driver functions ran. */
#define _GNU_SOURCE
#define VRAMTRACE_NO_PROTOTYPES
#include <dlfcn.h>
#include <string.h>
#include "cuda_decls.h"

typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long, int *);

static void *look(gpa_t gpa, const char *name, unsigned long long flags, const char *label) {
    void *p = NULL;
    int status;
    CHECK(gpa(name, &p, 13000, flags, &status));
    Dl_info info;
    if (dladdr(p, &info) && info.dli_fname)
        printf("resolved %s %s %s\n", label, strstr(info.dli_fname, "vramtrace_preload") ? "preload" : "driver",
               info.dli_sname ? info.dli_sname : "?");
    return p;
}

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 12; }
    /* The documented idiom: clear dlerror, look up, then dlerror says whether it failed. Our
     * own lookups (many names this driver lacks) must not leave an error behind. */
    dlerror();
    gpa_t gpa0 = (gpa_t)dlsym(h, "cuGetProcAddress_v2");
    const char *err = dlerror();
    printf("dlerror %s\n", err ? "dirty" : "clean");
    gpa_t gpa = look(gpa0, "cuGetProcAddress", 0, "self");
    CUresult (*init)(unsigned) = look(gpa, "cuInit", 0, "cuInit");
    CUresult (*get)(CUdevice *, int) = look(gpa, "cuDeviceGet", 0, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) = look(gpa, "cuDevicePrimaryCtxRetain", 0, "retain");
    CUresult (*set)(CUcontext) = look(gpa, "cuCtxSetCurrent", 0, "set");
    CUresult (*alloc)(CUdeviceptr *, size_t) = look(gpa, "cuMemAlloc", 0, "cuMemAlloc");
    CUresult (*aasync)(CUdeviceptr *, size_t, CUstream) =
        look(gpa, "cuMemAllocAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAllocAsync/ptsz");
    CUresult (*fasync)(CUdeviceptr, CUstream) =
        look(gpa, "cuMemFreeAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemFreeAsync/ptsz");
    look(gpa, "cuMemAllocHost", 0, "cuMemAllocHost");
    USE_DEVICE(init, get, retain, set, 0);
    CUdeviceptr a, b;
    CHECK(alloc(&a, 1234));
    printf("cuMemAlloc_v2 %llu 1234\n", a);
    CHECK(aasync(&b, 5678, NULL));
    printf("cuMemAllocAsync_ptsz %llu 5678\n", b);
    CHECK(fasync(b, NULL));
    void (*counts)(int *) = (void (*)(int *))dlsym(h, "odd_driver_counts");
    int c[4];
    counts(c);
    printf("ran exported_alloc=%d internal_alloc=%d internal_async=%d internal_free_async=%d\n", c[0], c[1], c[2], c[3]);
    return 0;
}
