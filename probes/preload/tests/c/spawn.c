/* Linked with -lcuda: the parent allocates, then starts itself again twice, once with
 * posix_spawn and once with fork + exec. Each child inherits LD_PRELOAD and VRAMTRACE_DIR and
 * allocates the size given on its command line. */
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cuda_decls.h"

extern char **environ;

static void alloc(size_t size) {
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, size));
    CHECK(cuMemFree_v2(p));
}

int main(int argc, char **argv) {
    USE_DEVICE(cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, 0);
    if (argc > 1) {
        alloc((size_t)atol(argv[1]));
        return 0;
    }
    alloc(1000);
    fflush(stdout);
    pid_t spawned, execed;
    char *spawn_args[] = {argv[0], "7777", NULL};
    if (posix_spawn(&spawned, "/proc/self/exe", NULL, NULL, spawn_args, environ) != 0) return 15;
    int status;
    waitpid(spawned, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 16;
    execed = fork();
    if (execed == 0) {
        char *exec_args[] = {argv[0], "8888", NULL};
        execv("/proc/self/exe", exec_args);
        _exit(127);
    }
    waitpid(execed, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 17;
    printf("parent %d spawned %d execed %d\n", (int)getpid(), (int)spawned, (int)execed);
    return 0;
}
