/* The recorder's security promises, from the traced program's side. Linked with -lcuda.
 *   security            allocate and free 1 MiB, print the sockets this process holds
 *   security plant      first plant a symbolic link named like the trace file this process
 *                       would create (<VRAMTRACE_DIR>/<pid>.vtr -> <VRAMTRACE_DIR>/victim),
 *                       then do the same: the recorder must refuse it, the program run on. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cuda_decls.h"

static int sockets(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    char path[64], target[64];
    while ((e = readdir(d))) {
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, target, sizeof target - 1);
        if (len > 0) {
            target[len] = 0;
            if (!strncmp(target, "socket:", 7)) n++;
        }
    }
    closedir(d);
    return n;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "plant")) {
        const char *dir = getenv("VRAMTRACE_DIR");
        char link[4096], victim[4096];
        snprintf(link, sizeof link, "%s/%d.vtr", dir, (int)getpid());
        snprintf(victim, sizeof victim, "%s/victim", dir);
        if (symlink(victim, link)) { perror("symlink"); return 11; }
    }
    USE_DEVICE(cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, 0);
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 1 << 20));
    CHECK(cuMemFree_v2(p));
    printf("freed %llu sockets=%d\n", p != 0 ? 1ULL : 0ULL, sockets());
    return 0;
}
