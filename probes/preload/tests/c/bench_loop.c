/* Linked with -lcuda: times cuMemAlloc_v2 + cuMemFree_v2 pairs of 1 MiB. Prints the best of
 * several rounds in ns per pair (the best round is the least disturbed by the machine). */
#include <time.h>
#include "cuda_decls.h"

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    long pairs = argc > 1 ? atol(argv[1]) : 20000;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    USE_DEVICE(cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, 0);
    CUdeviceptr p;
    for (long i = 0; i < pairs / 4; i++) { /* warm up: file created, caches hot */
        CHECK(cuMemAlloc_v2(&p, 1 << 20));
        CHECK(cuMemFree_v2(p));
    }
    double best = 1e300;
    for (int r = 0; r < rounds; r++) {
        double t0 = now_ns();
        for (long i = 0; i < pairs; i++) {
            CHECK(cuMemAlloc_v2(&p, 1 << 20));
            CHECK(cuMemFree_v2(p));
        }
        double per = (now_ns() - t0) / pairs;
        if (per < best) best = per;
    }
    printf("%.1f\n", best);
    return 0;
}
