/* Never touches CUDA: writes to stdout and stderr, reads its environment, and exits with a
 * chosen non-zero code, so a run under the preload can be compared with a bare one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    unsigned long sum = 0;
    for (int i = 0; i < 1000; i++) {
        char *b = malloc(64 + i);
        memset(b, i & 0xff, 64 + i);
        sum += (unsigned char)b[i];
        free(b);
    }
    printf("argc=%d sum=%lu\n", argc, sum);
    for (int i = 1; i < argc; i++) printf("arg %s\n", argv[i]);
    fprintf(stderr, "to stderr\n");
    fflush(NULL);
    return 3;
}
