/* A library that defines a versioned symbol, vt_who@@VT_1 (the test links it with a version
 * script), and reports which definition comes after it in the search order, found with
 * dlvsym(RTLD_NEXT), with a dlsym that dlvsym(RTLD_NEXT, "dlsym", ...) handed it, and with
 * dlsym. Built twice, as "a" and "b" (-DWHO=a): RTLD_NEXT answers depend on which object
 * asks, so the preload's dlvsym must leave the caller as it is. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include "dlvsym_versions.h"

#define STR2(x) #x
#define STR(x) STR2(x)

const char *vt_who(void) { return STR(WHO); }

static const char *who_of(void *p) { return p ? ((const char *(*)(void))p)() : "none"; }

void vt_report(void) {
    const char *me = STR(WHO);
    printf("%s dlvsym-next %s\n", me, who_of(dlvsym(RTLD_NEXT, "vt_who", "VT_1")));
    dlsym_fn next_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", DLSYM_VERSION);
    printf("%s dlsym-via-dlvsym-next %s\n", me,
           next_dlsym ? who_of(next_dlsym(RTLD_NEXT, "vt_who")) : "no-dlsym");
    printf("%s dlsym-next %s\n", me, who_of(dlsym(RTLD_NEXT, "vt_who")));
    printf("%s dlvsym-default %s\n", me, who_of(dlvsym(RTLD_DEFAULT, "vt_who", "VT_1")));
    dlerror();
}
