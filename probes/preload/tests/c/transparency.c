/* Transparency: a deterministic sequence of driver calls on the stand-in, printing every
 * CUresult, every returned pointer or handle and the free/total figures, so that a bare run
 * and runs under the preload (recording on and off) can be compared byte for byte.
 * Linked with -lcuda. Never exits early on a failed call: failures are part of the output. */
#include "cuda_decls.h"

#define MIB (1ULL << 20)

static void info(const char *when) {
    size_t f = 0, t = 0;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    printf("getinfo %s %d free=%zu total=%zu\n", when, r, f, t);
}

int main(void) {
    CUdevice dev = -1;
    CUcontext ctx = 0;
    printf("init %d\n", cuInit(0));
    CUresult r = cuDeviceGet(&dev, 0);
    printf("deviceget %d %d\n", r, dev);
    r = cuDevicePrimaryCtxRetain(&ctx, dev);
    printf("ctxretain %d %d\n", r, ctx != 0);
    printf("ctxset %d\n", cuCtxSetCurrent(ctx));
    info("start");

    static const size_t sizes[] = {1, 256, 4096, 1 * MIB + 3, 64 * MIB};
    CUdeviceptr p[5] = {0};
    for (int i = 0; i < 5; i++) {
        r = cuMemAlloc_v2(&p[i], sizes[i]);
        printf("alloc %zu %d 0x%llx\n", sizes[i], r, p[i]);
    }
    info("allocated");
    printf("free 1 %d\n", cuMemFree_v2(p[1]));
    printf("free 3 %d\n", cuMemFree_v2(p[3]));
    /* A pointer never allocated, and one freed twice. */
    printf("free bad %d\n", cuMemFree_v2(0xdead0000ULL));
    printf("free twice %d\n", cuMemFree_v2(p[1]));
    printf("free null %d\n", cuMemFree_v2(0));

    /* Larger than the card. */
    size_t f = 0, t = 0;
    cuMemGetInfo_v2(&f, &t);
    CUdeviceptr huge = 0x1234;
    r = cuMemAlloc_v2(&huge, t + MIB);
    printf("alloc huge %d 0x%llx\n", r, huge);
    info("after-huge");

    /* VMM: granularity, create, reserve, map, unmap, release, address free. */
    CUmemAllocationProp prop = {0};
    prop.type = 1;
    prop.location.type = 1;
    prop.location.id = 0;
    size_t g = 0;
    r = cuMemGetAllocationGranularity(&g, &prop, 0);
    printf("granularity %d %zu\n", r, g);
    size_t n = g ? 4 * g : 8 * MIB;
    CUmemGenericAllocationHandle h = 0;
    r = cuMemCreate(&h, n, &prop, 0);
    printf("create %d %llu\n", r, h);
    CUdeviceptr va = 0;
    r = cuMemAddressReserve(&va, n, 0, 0, 0);
    printf("reserve %d 0x%llx\n", r, va);
    printf("map %d\n", cuMemMap(va, n, 0, h, 0));
    info("mapped");
    printf("unmap %d\n", cuMemUnmap(va, n));
    printf("release %d\n", cuMemRelease(h));
    printf("release again %d\n", cuMemRelease(h));
    printf("addressfree %d\n", cuMemAddressFree(va, n));
    /* A create that must fail: size 0. */
    CUmemGenericAllocationHandle h0 = 77;
    r = cuMemCreate(&h0, 0, &prop, 0);
    printf("create zero %d %llu\n", r, h0);

    for (int i = 0; i < 5; i++)
        if (i != 1 && i != 3) printf("free %d %d\n", i, cuMemFree_v2(p[i]));
    info("end");
    return 0;
}
