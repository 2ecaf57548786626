/* Never touches CUDA, but exercises dlopen/dlsym on a real handle and the pseudo-handles. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    void *m = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
    if (!m) return 12;
    double (*cosine)(double) = (double (*)(double))dlsym(m, "cos");
    void *(*alloc)(size_t) = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    void *(*alloc2)(size_t) = (void *(*)(size_t))dlsym(RTLD_DEFAULT, "malloc");
    if (!cosine || !alloc || !alloc2 || dlsym(m, "no_such_symbol_anywhere")) return 13;
    void *p = alloc(64);
    printf("cos(0)=%.1f\n", cosine(0.0));
    free(p);
    return 0;
}
