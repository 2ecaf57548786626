/* A long-running native program for the growth analysis (docs/architecture.md, "Growth over
 * days"): steady allocate/free traffic (scratch_step), plus, by mode,
 *   leak:    leak_one() keeps one KEPT_BYTES allocation every LEAK_EVERY iterations;
 *   plateau: fill_cache() keeps one KEPT_BYTES allocation every LEAK_EVERY iterations for the
 *            first 30% of the iterations, then the cache is full;
 *   steady:  nothing more.
 * Usage: soak MODE ITERATIONS. Prints "start T" (CLOCK_MONOTONIC seconds at the top of main),
 * "kept T" for each kept allocation (its CLOCK_MONOTONIC seconds; each is KEPT_BYTES), and
 * "done": the rate it planted over any window, on its own clock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cuda_decls.h" /* probes/preload/tests/c: hand-written declarations of the driver ABI */

#define LEAK_EVERY 256
#define KEPT_BYTES (1u << 20)
#define SCRATCH 4

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static void scratch_step(CUdeviceptr *slots, unsigned long i) {
    /* One of SCRATCH slots freed and allocated again each iteration: steady traffic. */
    unsigned long k = i % SCRATCH;
    if (slots[k]) CHECK(cuMemFree_v2(slots[k]));
    CHECK(cuMemAlloc_v2(&slots[k], (size_t)(256 + (i * 7919) % 4096) << 10));
}

__attribute__((noinline)) static void leak_one(void) {
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, KEPT_BYTES));
}

__attribute__((noinline)) static void fill_cache(void) {
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, KEPT_BYTES));
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "leak") && strcmp(argv[1], "plateau") && strcmp(argv[1], "steady"))) {
        fprintf(stderr, "usage: soak leak|plateau|steady ITERATIONS\n");
        return 2;
    }
    printf("start %.9f\n", now_s());
    int mode = argv[1][0];
    unsigned long iterations = strtoul(argv[2], NULL, 10);
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUdeviceptr weights;
    CHECK(cuMemAlloc_v2(&weights, 64u << 20));
    CUdeviceptr slots[SCRATCH] = {0};
    for (unsigned long i = 0; i < iterations; i++) {
        scratch_step(slots, i);
        if (i % LEAK_EVERY == LEAK_EVERY - 1) {
            if (mode == 'l') {
                leak_one();
            } else if (mode == 'p' && i < iterations * 3 / 10) {
                fill_cache();
            } else {
                continue;
            }
            printf("kept %.9f\n", now_s());
        }
    }
    for (int k = 0; k < SCRATCH; k++) CHECK(cuMemFree_v2(slots[k]));
    printf("done\n");
    return 0;
}
