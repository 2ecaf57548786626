/* A program vramtrace attaches to while it runs: it reaches the driver the way cudart 13 does
 * (cuGetProcAddress, before any attach), then allocates and frees in a loop, printing each
 * allocation ("T<thread> <i> <ptr> <size>") so a test can compare the trace with it exactly.
 * argv[1]: iterations; argv[2]: milliseconds between them; argv[3]: 1 for a second thread
 * allocating too, 2 for a child forked at iteration 40 that allocates as thread 9 ("T9 ...") for
 * the same number of iterations and exits 0 (the parent prints "child <status>"), 3 for ggml's
 * VMM pool as well (ggml-cuda.cu's ggml_cuda_pool_vmm): from iteration 40 thread 0 reserves 32 GiB
 * of addresses once, then grows the pool by 1 to 3 granules an iteration (cuMemCreate, cuMemMap
 * at the pool's end, cuMemRelease; "V <i> <va> <offset> <size>"), and at the end unmaps the whole
 * range with one cuMemUnmap and frees the addresses ("V end <va> <mapped>").
 * Prints "ready <pid>" once the entry points are resolved, "done" at the end. */
#define _GNU_SOURCE
#define VRAMTRACE_NO_PROTOTYPES
#include <dlfcn.h>
#include <pthread.h>
#include <sys/wait.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "cuda_decls.h"

typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long, int *);
static CUresult (*alloc)(CUdeviceptr *, size_t);
static CUresult (*mfree)(CUdeviceptr);
static CUresult (*set)(CUcontext);
static CUcontext ctx;
static pthread_mutex_t out = PTHREAD_MUTEX_INITIALIZER;
static int iterations, gap_ms, fork_at = -1, vmm;
static CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
static CUresult (*addr_free)(CUdeviceptr, size_t);
static CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                          unsigned long long);
static CUresult (*release)(CUmemGenericAllocationHandle);
static CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long);
static CUresult (*unmap)(CUdeviceptr, size_t);
static CUresult (*granularity)(size_t *, const CUmemAllocationProp *, int);
static CUdeviceptr pool_va;
static size_t pool_size;
#define POOL_MAX ((size_t)32 << 30)

/* One growth of ggml's pool by n granules, as ggml_cuda_pool_vmm::alloc does it. */
static void grow(int i, int n) {
    CUmemAllocationProp prop = {0};
    prop.type = 1;
    prop.location.type = 1;
    prop.location.id = 0;
    size_t gran;
    CHECK(granularity(&gran, &prop, 0));
    if (!pool_va) CHECK(reserve(&pool_va, POOL_MAX, 0, 0, 0));
    size_t size = (size_t)n * gran;
    CUmemGenericAllocationHandle h;
    CHECK(create(&h, size, &prop, 0));
    CHECK(map(pool_va + pool_size, size, 0, h, 0));
    CHECK(release(h));
    pthread_mutex_lock(&out);
    printf("V %d %llu %zu %zu\n", i, pool_va, pool_size, size);
    fflush(stdout);
    pthread_mutex_unlock(&out);
    pool_size += size;
}
static pid_t child = -1;

static void *look(gpa_t gpa, const char *name, int version) {
    void *p = NULL;
    int status = -1;
    CHECK(gpa(name, &p, version, 0, &status));
    return p;
}

static void *loop(void *arg) {
    int t = (int)(long)arg;
    CHECK(set(ctx));
    for (int i = 0; i < iterations; i++) {
        if (t == 0 && i == fork_at) {
            fflush(stdout);
            child = fork();
            if (child == 0) {
                fork_at = -1;
                loop((void *)9L);
                fflush(stdout);
                _exit(0);
            }
        }
        size_t size = (size_t)(t + 1) * 1000000 + (size_t)i * 512;
        CUdeviceptr p;
        CHECK(alloc(&p, size));
        pthread_mutex_lock(&out);
        printf("T%d %d %llu %zu\n", t, i, p, size);
        fflush(stdout);
        pthread_mutex_unlock(&out);
        CHECK(mfree(p));
        if (vmm && t == 0 && i >= 40) grow(i, 1 + i % 3);
        struct timespec ts = {gap_ms / 1000, (long)(gap_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int main(int argc, char **argv) {
    iterations = argc > 1 ? atoi(argv[1]) : 100;
    gap_ms = argc > 2 ? atoi(argv[2]) : 10;
    int two = argc > 3 && atoi(argv[3]) == 1;
    if (argc > 3 && atoi(argv[3]) == 2) fork_at = 40;
    vmm = argc > 3 && atoi(argv[3]) == 3;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 12; }
    gpa_t gpa0 = (gpa_t)dlsym(h, "cuGetProcAddress_v2");
    gpa_t gpa = look(gpa0, "cuGetProcAddress", 13000);
    CUresult (*init)(unsigned) = look(gpa, "cuInit", 2000);
    CUresult (*get)(CUdevice *, int) = look(gpa, "cuDeviceGet", 2000);
    CUresult (*retain)(CUcontext *, CUdevice) = look(gpa, "cuDevicePrimaryCtxRetain", 7000);
    set = look(gpa, "cuCtxSetCurrent", 4000);
    alloc = look(gpa, "cuMemAlloc", 13000);
    mfree = look(gpa, "cuMemFree", 13000);
    if (vmm) {
        reserve = look(gpa, "cuMemAddressReserve", 10020);
        addr_free = look(gpa, "cuMemAddressFree", 10020);
        create = look(gpa, "cuMemCreate", 10020);
        release = look(gpa, "cuMemRelease", 10020);
        map = look(gpa, "cuMemMap", 10020);
        unmap = look(gpa, "cuMemUnmap", 10020);
        granularity = look(gpa, "cuMemGetAllocationGranularity", 10020);
    }
    CUdevice dev;
    CHECK(init(0));
    CHECK(get(&dev, 0));
    CHECK(retain(&ctx, dev));
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    pthread_t other;
    if (two) pthread_create(&other, NULL, loop, (void *)1L);
    loop((void *)0L);
    if (two) pthread_join(other, NULL);
    if (vmm && pool_va) {
        /* ggml_cuda_pool_vmm's destructor: the whole mapped range in one call. */
        CHECK(unmap(pool_va, pool_size));
        CHECK(addr_free(pool_va, POOL_MAX));
        printf("V end %llu %zu\n", pool_va, pool_size);
    }
    if (child > 0) {
        int status = -1;
        waitpid(child, &status, 0);
        printf("child %d\n", status);
    }
    printf("done\n");
    return 0;
}
