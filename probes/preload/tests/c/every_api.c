/* Linked with -lcuda: calls every allocation entry point the preload wraps, with sizes the
 * test knows, and prints what the driver handed back ("name ptr size aux") for the test to
 * compare with the trace. Runs with two devices: device 1 is used for the VMM calls. */
#include "cuda_decls.h"

int main(void) {
    USE_DEVICE(cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, 0);
    CUstream s;
    CHECK(cuStreamCreate(&s, 0));
    printf("stream %llu\n", (unsigned long long)(uintptr_t)s);

    CUdeviceptr a, p, m, as, fp;
    size_t pitch;
    CHECK(cuMemAlloc_v2(&a, 1000003));
    printf("cuMemAlloc_v2 %llu 1000003 0\n", a);
    CHECK(cuMemAllocPitch_v2(&p, &pitch, 1000, 30, 4));
    printf("cuMemAllocPitch_v2 %llu %llu %llu\n", p, (unsigned long long)(pitch * 30), (unsigned long long)pitch);
    CHECK(cuMemAllocManaged(&m, 12288, CU_MEM_ATTACH_GLOBAL));
    printf("cuMemAllocManaged %llu 12288 1\n", m);
    CHECK(cuMemAllocAsync(&as, 5 << 20, s));
    printf("cuMemAllocAsync %llu %d 0\n", as, 5 << 20);
    CUmemoryPool pool;
    CHECK(cuDeviceGetDefaultMemPool(&pool, 0));
    CHECK(cuMemAllocFromPoolAsync(&fp, 3 << 20, pool, s));
    printf("cuMemAllocFromPoolAsync %llu %d %llu\n", fp, 3 << 20, (unsigned long long)(uintptr_t)pool);
    CHECK(cuMemFreeAsync(as, s));
    CHECK(cuMemFreeAsync(fp, s));
    CHECK(cuStreamSynchronize(s));

    /* Virtual memory management on device 1, while device 0 stays current. */
    CUmemAllocationProp prop = {0};
    prop.type = 1;
    prop.location.type = 1;
    prop.location.id = 1;
    size_t gran;
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, 0));
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    CHECK(cuMemAddressReserve(&va, 4 * gran, 0, 0, 0));
    printf("cuMemAddressReserve %llu %llu 0\n", va, (unsigned long long)(4 * gran));
    CHECK(cuMemCreate(&h, 2 * gran, &prop, 0));
    printf("cuMemCreate %llu %llu 0\n", h, (unsigned long long)(2 * gran));
    CHECK(cuMemMap(va, 2 * gran, 0, h, 0));
    printf("cuMemMap %llu %llu %llu\n", va, (unsigned long long)(2 * gran), h);
    CHECK(cuMemUnmap(va, 2 * gran));
    CHECK(cuMemRelease(h));
    CHECK(cuMemAddressFree(va, 4 * gran));

    void *hp, *hp2;
    CHECK(cuMemAllocHost_v2(&hp, 12345));
    printf("cuMemAllocHost_v2 %llu 12345 0\n", (unsigned long long)(uintptr_t)hp);
    CHECK(cuMemHostAlloc(&hp2, 54321, CU_MEMHOSTALLOC_PORTABLE));
    printf("cuMemHostAlloc %llu 54321 1\n", (unsigned long long)(uintptr_t)hp2);
    CHECK(cuMemFreeHost(hp));
    CHECK(cuMemFreeHost(hp2));

    CUarray arr, arr3;
    CUDA_ARRAY_DESCRIPTOR d2 = {64, 32, CU_AD_FORMAT_FLOAT, 4};
    CHECK(cuArrayCreate_v2(&arr, &d2));
    printf("cuArrayCreate_v2 %llu 32768 0\n", (unsigned long long)(uintptr_t)arr);
    CUDA_ARRAY3D_DESCRIPTOR d3 = {16, 8, 4, CU_AD_FORMAT_HALF, 2, 0};
    CHECK(cuArray3DCreate_v2(&arr3, &d3));
    printf("cuArray3DCreate_v2 %llu 2048 0\n", (unsigned long long)(uintptr_t)arr3);
    CHECK(cuArrayDestroy(arr));
    CHECK(cuArrayDestroy(arr3));

    CHECK(cuMemFree_v2(p));
    CHECK(cuMemFree_v2(m));
    CHECK(cuMemFree_v2(a));

    /* One byte more than is free: the driver must refuse, and the trace must say how much
     * was free at that moment. */
    size_t free_b, total_b;
    CHECK(cuMemGetInfo_v2(&free_b, &total_b));
    CUdeviceptr c;
    CUresult r = cuMemAlloc_v2(&c, free_b + 1);
    printf("failed %d %llu %llu %llu\n", r, (unsigned long long)(free_b + 1), (unsigned long long)free_b,
           (unsigned long long)total_b);
    return r == 2 ? 0 : 11;
}
