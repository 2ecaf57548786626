/* Linked with -lcuda: T threads each make N cuMemAlloc_v2 + cuMemFree_v2 pairs as fast as they
 * can, all starting together. Prints the wall time from the common start to the last thread's
 * end in ns. Sizes vary per pair (4 KiB to 256 KiB) so that the sizes in the trace can be
 * checked. Arguments: threads, pairs per thread. */
#include <pthread.h>
#include <time.h>
#include "cuda_decls.h"

static long pairs;
static pthread_barrier_t start;

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void *work(void *arg) {
    (void)arg;
    USE_DEVICE(cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, 0);
    pthread_barrier_wait(&start);
    for (long i = 0; i < pairs; i++) {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, (size_t)4096 * (1 + i % 64)));
        CHECK(cuMemFree_v2(p));
    }
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    pairs = argc > 2 ? atol(argv[2]) : 100000;
    pthread_t th[256];
    if (threads < 1 || threads > 256) return 2;
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) pthread_create(&th[t], NULL, work, NULL);
    pthread_barrier_wait(&start);
    double t0 = now_ns();
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    printf("%.0f\n", now_ns() - t0);
    return 0;
}
