/* Someone else's NVTX injection library: exports InitializeInjectionNvtx2, records that it
 * was called by writing "other_nvtx init" to the file named by OTHER_NVTX_OUT, and accepts. */
#include <stdio.h>
#include <stdlib.h>

int InitializeInjectionNvtx2(void *get_export_table) {
    const char *path = getenv("OTHER_NVTX_OUT");
    if (path && *path) {
        FILE *f = fopen(path, "a");
        if (f) {
            fprintf(f, "other_nvtx init %d\n", get_export_table != NULL);
            fclose(f);
        }
    }
    return 1;
}
