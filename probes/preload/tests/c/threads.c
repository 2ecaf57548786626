/* Linked with -lcuda: eight threads, each 50 alloc/free pairs of sizes unique to the thread. */
#include <pthread.h>
#include "cuda_decls.h"

#define THREADS 8
#define ROUNDS 50

static void *work(void *arg) {
    int t = (int)(intptr_t)arg;
    USE_DEVICE(cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, 0);
    for (int i = 0; i < ROUNDS; i++) {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, (size_t)(t + 1) * (1 << 20) + (size_t)i * 4096));
        CHECK(cuMemFree_v2(p));
    }
    return NULL;
}

int main(void) {
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, work, (void *)(intptr_t)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    printf("done\n");
    return 0;
}
