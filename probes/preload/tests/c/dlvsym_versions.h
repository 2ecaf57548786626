/* Symbol versions for the dlvsym tests: dlsym's current default version and the first version
 * of the architecture (puts, malloc). */
#ifndef VRAMTRACE_PRELOAD_TEST_DLVSYM_VERSIONS_H
#define VRAMTRACE_PRELOAD_TEST_DLVSYM_VERSIONS_H
#include <features.h>

#if defined(__x86_64__)
#define BASE_VERSION "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define BASE_VERSION "GLIBC_2.17"
#else
#error "x86-64 and aarch64 only"
#endif

#if __GLIBC_PREREQ(2, 34)
#define DLSYM_VERSION "GLIBC_2.34"
#else
#define DLSYM_VERSION BASE_VERSION
#endif

typedef void *(*dlsym_fn)(void *, const char *);
#endif
