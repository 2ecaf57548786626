/* Allocates 1 MiB blocks until killed (the SIGKILL test), announcing each on stdout. */
#include <stdio.h>
#include <stdlib.h>
#include "cuda_abi.h"

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    for (unsigned long i = 0;; i++) {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, 1u << 20));
        if (i == 1000) { printf("1000\n"); fflush(stdout); }
    }
}
