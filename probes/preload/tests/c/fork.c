/* Linked with -lcuda: the parent records, forks; the child records its own allocation into its
 * own file; the parent goes on recording into its file. */
#include <sys/wait.h>
#include <unistd.h>
#include "cuda_decls.h"

int main(void) {
    USE_DEVICE(cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, 0);
    CUdeviceptr a, b, c;
    CHECK(cuMemAlloc_v2(&a, 1111));
    pid_t child = fork();
    if (child == 0) {
        CHECK(cuMemAlloc_v2(&b, 2222));
        CHECK(cuMemFree_v2(b));
        _exit(0);
    }
    int status;
    waitpid(child, &status, 0);
    CHECK(cuMemAlloc_v2(&c, 3333));
    printf("parent %d child %d\n", (int)getpid(), (int)child);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 14;
}
