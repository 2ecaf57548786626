/* dlsym(RTLD_NEXT, ...) from the program itself: the next object after the program in the
 * global scope is the preload, so a name only the preload exports must be found, and found in
 * the preload. A dlsym hook that changed the caller glibc sees (x30 on aarch64, the return
 * address on x86-64) would make glibc search after the preload instead, and find nothing.
 * RTLD_DEFAULT finds it too; a real handle finds libm's cos. Prints "next <where>". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static const char *where(void *p) {
    Dl_info info;
    if (!p) return "null";
    if (!dladdr(p, &info) || !info.dli_fname) return "unknown";
    return strstr(info.dli_fname, "vramtrace_preload") ? "preload" : info.dli_fname;
}

int main(void) {
    void *next = dlsym(RTLD_NEXT, "vramtrace_range_push");
    void *dflt = dlsym(RTLD_DEFAULT, "vramtrace_range_push");
    void *m = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
    double (*cosine)(double) = m ? (double (*)(double))dlsym(m, "cos") : 0;
    printf("next %s\n", where(next));
    printf("default %s\n", where(dflt));
    printf("cos(0)=%.1f\n", cosine ? cosine(0.0) : -1.0);
    return 0;
}
