/* Another LD_PRELOAD library that interposes dlsym, as some profilers and shims do: it counts
 * the calls and forwards each to the next dlsym, found by version with dlvsym. At exit it
 * writes "other_dlsym calls N" to the file named by OTHER_DLSYM_OUT (if set). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn next_dlsym;
static unsigned long calls;

static dlsym_fn find_next(void) {
    dlsym_fn f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!f) f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return f;
}

void *dlsym(void *handle, const char *symbol) {
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    if (!next_dlsym) next_dlsym = find_next();
    if (!next_dlsym) return NULL;
    return next_dlsym(handle, symbol);
}

__attribute__((destructor)) static void report(void) {
    const char *path = getenv("OTHER_DLSYM_OUT");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "other_dlsym calls %lu\n", calls);
    fclose(f);
}
