/* Handles obtained elsewhere, as NCCL uses them: a cuMemCreate exported as a POSIX file
 * descriptor, imported again in this process and in a forked child, handles retained from
 * mapped addresses, and every reference released. Linked with -lcuda. Prints one line per
 * driver call: "<call> <result> <handle or 0>", and "done" at the end of each process. */
#define _GNU_SOURCE
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cuda_decls.h"

#define MIB (1ULL << 20)
#define FD_TYPE 1 /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */

static CUmemAllocationProp prop(void) {
    CUmemAllocationProp p = {0};
    p.type = 1;
    p.requestedHandleTypes = FD_TYPE;
    p.location.type = 1;
    p.location.id = 0;
    return p;
}

/* Imports `fd`, maps it at a fresh reservation, retains it from the mapping, then releases
 * the retained reference, unmaps and releases the import: what a peer does with a buffer. */
static void peer(const char *who, int fd, size_t size) {
    CUmemGenericAllocationHandle h, r;
    CUdeviceptr va;
    CHECK(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, FD_TYPE));
    printf("%s import %llu\n", who, h);
    CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
    CHECK(cuMemMap(va, size, 0, h, 0));
    CHECK(cuMemRetainAllocationHandle(&r, (void *)(uintptr_t)(va + MIB)));
    printf("%s retain %llu same=%d\n", who, r, r == h);
    CHECK(cuMemRelease(r));
    CHECK(cuMemUnmap(va, size));
    CHECK(cuMemRelease(h));
    CHECK(cuMemAddressFree(va, size));
}

int main(void) {
    USE_DEVICE(cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, 0);
    CUmemAllocationProp p = prop();
    size_t size = 4 * MIB;
    CUmemGenericAllocationHandle h, r;
    CHECK(cuMemCreate(&h, size, &p, 0));
    printf("create %llu\n", h);
    int fd = -1;
    CHECK(cuMemExportToShareableHandle(&fd, h, FD_TYPE, 0));
    printf("export fd>=0=%d\n", fd >= 0);
    /* A failed import and a failed retain: results passed through, nothing live. */
    CUmemGenericAllocationHandle bad = 0;
    printf("import_bad %d\n", cuMemImportFromShareableHandle(&bad, (void *)(uintptr_t)9999, FD_TYPE));
    printf("retain_bad %d\n", cuMemRetainAllocationHandle(&bad, (void *)(uintptr_t)0x10));

    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        peer("child", fd, size);
        printf("child done\n");
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 20;

    /* This process: its own mapping, a retained reference, and an import of its own export. */
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
    CHECK(cuMemMap(va, size, 0, h, 0));
    CHECK(cuMemRetainAllocationHandle(&r, (void *)(uintptr_t)va));
    printf("retain %llu same=%d\n", r, r == h);
    peer("self", fd, size);
    /* NCCL's free: retain from the address, release the retained reference, unmap, release. */
    CHECK(cuMemRelease(r));
    CHECK(cuMemUnmap(va, size));
    CHECK(cuMemRelease(h));
    CHECK(cuMemAddressFree(va, size));
    close(fd);
    printf("done\n");
    return 0;
}
