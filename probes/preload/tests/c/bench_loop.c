/* Linked with -lcuda: times cuMemAlloc_v2 + cuMemFree_v2 pairs of 1 MiB. Prints the best of
 * several rounds in ns per pair (the best round is the least disturbed by the machine).
 * Arguments: pairs per round, rounds, and how many extra frames to call from (stack depth). */
#include <time.h>
#include "cuda_decls.h"

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static double measure(long pairs, int rounds);

/* Recurses `depth` times before measuring, so every allocation has that many more frames. */
__attribute__((noinline)) static double deep(int depth, long pairs, int rounds) {
    double r = depth > 0 ? deep(depth - 1, pairs, rounds) : measure(pairs, rounds);
    __asm__ volatile("" ::: "memory");
    return r;
}

int main(int argc, char **argv) {
    long pairs = argc > 1 ? atol(argv[1]) : 20000;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    int depth = argc > 3 ? atoi(argv[3]) : 0;
    USE_DEVICE(cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, 0);
    printf("%.1f\n", deep(depth, pairs, rounds));
    return 0;
}

static double measure(long pairs, int rounds) {
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
    return best;
}
