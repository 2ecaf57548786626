/* A tiny libcuda.so.1 whose cuGetProcAddress_v2 hands out internal addresses that its exports
 * do not show (for cuMemAlloc) or that it does not export at all (the _ptsz async pair): the
 * preload must then fall back to routing by (name, version, flags). It counts which
 * implementation ran. It lacks most exports (cuDriverGetVersion too), so the preload's own
 * lookups fail, and must leave no dlerror behind. Single device and thread, bump allocation. */
#include <string.h>
#include <stdint.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

static CUdeviceptr next_ptr = 0x10000000;
static size_t used;
static const size_t capacity = 1 << 30;
static int ran_exported_alloc, ran_internal_alloc, ran_internal_async, ran_internal_free_async;

CUresult cuInit(unsigned f) { (void)f; return 0; }
CUresult cuDeviceGet(int *d, int o) { *d = o; return o == 0 ? 0 : 101; }
CUresult cuDeviceGetName(char *n, int len, int d) { (void)d; strncpy(n, "odd driver", len); return 0; }
CUresult cuDeviceTotalMem_v2(size_t *t, int d) { (void)d; *t = capacity; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; *c = (void *)1; return 0; }
CUresult cuCtxSetCurrent(void *c) { (void)c; return 0; }
CUresult cuCtxGetDevice(int *d) { *d = 0; return 0; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = capacity - used; *t = capacity; return 0; }

static CUresult bump(CUdeviceptr *p, size_t n) {
    if (used + n > capacity) return 2;
    *p = next_ptr;
    next_ptr += (n + 0xffff) & ~0xffffULL;
    used += n;
    return 0;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { ran_exported_alloc++; return bump(p, n); }
CUresult cuMemFree_v2(CUdeviceptr p) { (void)p; return 0; }
static CUresult alloc_internal(CUdeviceptr *p, size_t n) { ran_internal_alloc++; return bump(p, n); }
static CUresult alloc_async_ptsz_internal(CUdeviceptr *p, size_t n, void *s) {
    (void)s;
    ran_internal_async++;
    return bump(p, n);
}
static CUresult free_async_ptsz_internal(CUdeviceptr p, void *s) {
    (void)p; (void)s;
    ran_internal_free_async++;
    return 0;
}

/* A version the preload does not wrap (as a future driver might add): it must keep this. */
CUresult cuMemAllocHost_v3(void **p, size_t n, unsigned flags) {
    (void)flags;
    static char buf[4096];
    *p = buf;
    return n <= sizeof buf ? 0 : 2;
}

void odd_driver_counts(int out[4]) {
    out[0] = ran_exported_alloc;
    out[1] = ran_internal_alloc;
    out[2] = ran_internal_async;
    out[3] = ran_internal_free_async;
}

CUresult cuGetProcAddress_v2(const char *s, void **pfn, int v, unsigned long long flags, int *status) {
    int ptsz = (flags & 2) != 0;
    void *f = NULL;
    if (!strcmp(s, "cuGetProcAddress") && v >= 12000) f = (void *)cuGetProcAddress_v2;
    else if (!strcmp(s, "cuInit")) f = (void *)cuInit;
    else if (!strcmp(s, "cuDeviceGet")) f = (void *)cuDeviceGet;
    else if (!strcmp(s, "cuDevicePrimaryCtxRetain")) f = (void *)cuDevicePrimaryCtxRetain;
    else if (!strcmp(s, "cuCtxSetCurrent")) f = (void *)cuCtxSetCurrent;
    else if (!strcmp(s, "cuMemAlloc") && v >= 3020) f = (void *)alloc_internal;
    else if (!strcmp(s, "cuMemFree") && v >= 3020) f = (void *)cuMemFree_v2;
    else if (!strcmp(s, "cuMemAllocAsync") && ptsz) f = (void *)alloc_async_ptsz_internal;
    else if (!strcmp(s, "cuMemFreeAsync") && ptsz) f = (void *)free_async_ptsz_internal;
    else if (!strcmp(s, "cuMemAllocHost") && v >= 3020) f = (void *)cuMemAllocHost_v3;
    *pfn = f;
    if (status) *status = f ? 0 : 1;
    return f ? 0 : 500;
}
