/* dlvsym as programs and libraries use it, printing only what does not change from run to
 * run: which library a lookup found (libdlvsym_lib.so built as "a" and "b", preloaded in that
 * order) and whether a pointer equals the one the program was linked to. Each argument is the
 * path of a preloaded copy of libdlvsym_lib.so, whose vt_report is called in turn. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "dlvsym_versions.h"

static const char *who_of(void *p) { return p ? ((const char *(*)(void))p)() : "none"; }
static const char *same(void *a, void *b) { return a && a == b ? "same" : "different"; }

int main(int argc, char **argv) {
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (!libc) { fprintf(stderr, "dlopen libc: %s\n", dlerror()); return 12; }

    printf("main dlvsym-next %s\n", who_of(dlvsym(RTLD_NEXT, "vt_who", "VT_1")));
    printf("main dlvsym-next-puts %s\n", same(dlvsym(RTLD_NEXT, "puts", BASE_VERSION), (void *)puts));
    printf("main dlvsym-default-puts %s\n", same(dlvsym(RTLD_DEFAULT, "puts", BASE_VERSION), (void *)puts));
    printf("main dlvsym-handle-malloc %s\n", same(dlvsym(libc, "malloc", BASE_VERSION), (void *)malloc));
    printf("main dlvsym-bad-version %s\n", dlvsym(RTLD_NEXT, "dlsym", "NO_SUCH_1.0") ? "found" : "null");
    printf("main dlvsym-missing %s\n", dlvsym(libc, "no_such_symbol_anywhere", BASE_VERSION) ? "found" : "null");
    printf("main dlerror %s\n", dlerror() ? "set" : "clear");

    dlsym_fn next = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", DLSYM_VERSION);
    dlsym_fn dflt = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", DLSYM_VERSION);
    dlsym_fn on_libc = (dlsym_fn)dlvsym(libc, "dlsym", DLSYM_VERSION);
    if (!next || !dflt || !on_libc) { fprintf(stderr, "no dlsym: %s\n", dlerror()); return 13; }
    printf("main dlsym-via-dlvsym-next %s\n", who_of(next(RTLD_NEXT, "vt_who")));
    printf("main dlsym-via-dlvsym-next-malloc %s\n", same(next(libc, "malloc"), (void *)malloc));
    printf("main dlsym-via-dlvsym-default %s\n", who_of(dflt(RTLD_DEFAULT, "vt_who")));
    printf("main dlsym-via-dlvsym-on-handle-malloc %s\n", same(on_libc(libc, "malloc"), (void *)malloc));

    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW | RTLD_NOLOAD);
        void (*report)(void) = h ? (void (*)(void))dlsym(h, "vt_report") : NULL;
        if (!report) { fprintf(stderr, "%s: %s\n", argv[i], dlerror()); return 14; }
        report();
    }
    return 0;
}
