/* Reaches the driver the way cudart 13 does: dlopen libcuda, dlsym cuGetProcAddress_v2 once,
 * ask it for "cuGetProcAddress" itself, then resolve base names with a version (flag 2 for
 * the per-thread-default-stream twins) through the pointer it got back. Prints, for each
 * lookup, whether the pointer is the preload's and under which name. */
#define _GNU_SOURCE
#define VRAMTRACE_NO_PROTOTYPES
#include <dlfcn.h>
#include <string.h>
#include "cuda_decls.h"

typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long, int *);

static void where(const char *what, void *p) {
    Dl_info info;
    if (dladdr(p, &info) && info.dli_fname)
        printf("resolved %s %s %s\n", what, strstr(info.dli_fname, "vramtrace_preload") ? "preload" : "driver",
               info.dli_sname ? info.dli_sname : "?");
}

static void *look(gpa_t gpa, const char *name, int version, unsigned long long flags, const char *label) {
    void *p = NULL;
    int status = -1;
    CHECK(gpa(name, &p, version, flags, &status));
    where(label, p);
    return p;
}

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 12; }
    gpa_t gpa0 = (gpa_t)dlsym(h, "cuGetProcAddress_v2");
    where("dlsym:cuGetProcAddress_v2", (void *)gpa0);
    gpa_t gpa = look(gpa0, "cuGetProcAddress", 13000, 0, "self:cuGetProcAddress@13000");
    CUresult (*init)(unsigned) = look(gpa, "cuInit", 2000, 0, "cuInit@2000");
    CUresult (*get)(CUdevice *, int) = look(gpa, "cuDeviceGet", 2000, 0, "cuDeviceGet@2000");
    CUresult (*retain)(CUcontext *, CUdevice) = look(gpa, "cuDevicePrimaryCtxRetain", 7000, 0, "retain");
    CUresult (*set)(CUcontext) = look(gpa, "cuCtxSetCurrent", 4000, 0, "cuCtxSetCurrent@4000");
    CUresult (*alloc)(CUdeviceptr *, size_t) = look(gpa, "cuMemAlloc", 13000, 0, "cuMemAlloc@13000");
    CUresult (*mfree)(CUdeviceptr) = look(gpa, "cuMemFree", 13000, 0, "cuMemFree@13000");
    CUresult (*aasync)(CUdeviceptr *, size_t, CUstream) = look(gpa, "cuMemAllocAsync", 13000, 0, "cuMemAllocAsync@13000");
    CUresult (*aasync_pt)(CUdeviceptr *, size_t, CUstream) =
        look(gpa, "cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAllocAsync@13000/ptsz");
    CUresult (*fasync)(CUdeviceptr, CUstream) = look(gpa, "cuMemFreeAsync", 13000, 0, "cuMemFreeAsync@13000");
    CUresult (*fasync_pt)(CUdeviceptr, CUstream) =
        look(gpa, "cuMemFreeAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemFreeAsync@13000/ptsz");
    CUresult (*info)(size_t *, size_t *) = look(gpa, "cuMemGetInfo", 13000, 0, "cuMemGetInfo@13000");
    /* The legacy lookup ABI, if the driver has it for old versions. */
    void *old = NULL;
    int st = 0;
    if (gpa0("cuGetProcAddress", &old, 11080, 0, &st) == 0 && old) where("self:cuGetProcAddress@11080", old);

    USE_DEVICE(init, get, retain, set, 0);
    CUdeviceptr a, b, c, d;
    CHECK(alloc(&a, 7u << 20));
    printf("cuMemAlloc_v2 %llu %u\n", a, 7u << 20);
    CHECK(aasync(&b, 1u << 20, NULL));
    printf("cuMemAllocAsync %llu %u\n", b, 1u << 20);
    CHECK(aasync_pt(&c, 9u << 20, NULL));
    printf("cuMemAllocAsync_ptsz %llu %u\n", c, 9u << 20);
    size_t free_b, total_b;
    CHECK(info(&free_b, &total_b));
    CUresult r = alloc(&d, free_b + 1);
    printf("failed %d %llu %llu %llu\n", r, (unsigned long long)(free_b + 1), (unsigned long long)free_b,
           (unsigned long long)total_b);
    CHECK(fasync_pt(c, NULL));
    CHECK(fasync(b, NULL));
    CHECK(mfree(a));
    return r == 2 ? 0 : 11;
}
