/* Linked with -lcuda: allocates and frees 1 MiB blocks until killed; says "ready" once 1000
 * pairs are done, then keeps going. */
#include <unistd.h>
#include "cuda_decls.h"

int main(void) {
    USE_DEVICE(cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, 0);
    for (long i = 0;; i++) {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, 1 << 20));
        CHECK(cuMemFree_v2(p));
        if (i == 1000) {
            printf("ready\n");
            fflush(stdout);
        }
    }
}
