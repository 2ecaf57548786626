/* Linked with -lcuda: ranges, marks and annotations through include/vramtrace.h's helpers,
 * on two threads and across a fork. Prints "name ptr" for each allocation. Also runs without
 * the preload, where the helpers do nothing. */
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cuda_decls.h"
#include "vramtrace.h"

static void *worker(void *arg) {
    (void)arg;
    USE_DEVICE(cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, 0);
    vramtrace_try_range_push("worker");
    CUdeviceptr d;
    CHECK(cuMemAlloc_v2(&d, 4444));
    printf("D %llu\n", d);
    vramtrace_try_range_pop();
    return NULL;
}

int main(void) {
    USE_DEVICE(cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, 0);
    CUdeviceptr a, b, c, e;
    vramtrace_try_range_push("prefill");
    vramtrace_try_range_push("layer.0");
    CHECK(cuMemAlloc_v2(&a, 1111));
    printf("A %llu\n", a);
    int64_t shape[3] = {4128, 16, 128};
    vramtrace_try_annotate(a, "q", "bf16", shape, 3);
    vramtrace_try_range_pop();
    CHECK(cuMemAlloc_v2(&b, 2222));
    printf("B %llu\n", b);
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    pthread_join(t, NULL);
    vramtrace_try_range_pop();
    CHECK(cuMemAlloc_v2(&c, 3333));
    printf("C %llu\n", c);
    vramtrace_try_annotate(c, "scratch", NULL, NULL, 0);
    vramtrace_try_mark("done");

    vramtrace_try_range_push("forked");
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        CHECK(cuMemAlloc_v2(&e, 5555));
        printf("E %llu\n", e);
        fflush(stdout);
        _exit(0);
    }
    int status;
    waitpid(child, &status, 0);
    vramtrace_try_range_pop();
    printf("parent %d child %d\n", (int)getpid(), (int)child);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 14;
}
