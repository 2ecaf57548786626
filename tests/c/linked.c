/* Reaches the driver through symbols resolved at link time (-lcuda), as llama.cpp's VMM pool and
 * vLLM's cumem allocator do. Allocates a known pattern from several threads, then asks for more
 * than the device has. Prints nothing on stdout but "done". */
#include <pthread.h>
#include "cuda_decls.h" /* probes/preload/tests/c: hand-written declarations of the driver ABI */

static CUcontext ctx;

static void *worker(void *arg) {
    size_t n = (size_t)arg;
    CHECK(cuCtxSetCurrent(ctx));
    for (int i = 0; i < 4; i++) {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, n));
        CHECK(cuMemFree_v2(p));
    }
    return NULL;
}

int main(void) {
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUdeviceptr a, b;
    CHECK(cuMemAlloc_v2(&a, 10u << 20));
    CHECK(cuMemAlloc_v2(&b, 20u << 20));
    CHECK(cuMemFree_v2(a));
    void *host;
    CHECK(cuMemHostAlloc(&host, 1u << 20, 0));
    CHECK(cuMemFreeHost(host));
    pthread_t t[3];
    for (int i = 0; i < 3; i++) pthread_create(&t[i], NULL, worker, (void *)(size_t)((i + 1) << 20));
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    CUdeviceptr big;
    CUresult r = cuMemAlloc_v2(&big, (size_t)1 << 40);
    if (r != 2) { fprintf(stderr, "expected OOM (2), got %d\n", r); return 11; }
    CHECK(cuMemFree_v2(b));
    printf("done\n");
    return 0;
}
