/*
 * vramtrace annotation ABI: name the GPU memory your program allocates and mark the phases it
 * runs, so that vramtrace's traces say which tensor each allocation was and what the program was
 * doing when it was made.
 *
 * The functions are exported by the vramtrace preload (libvramtrace_preload.so). A program does
 * not link against it: it finds them at run time with dlsym(RTLD_DEFAULT, ...), so the same
 * binary runs unchanged without vramtrace. The vramtrace_try_* helpers below do exactly that and
 * are no-ops when the preload is not loaded (or records nothing).
 *
 *   #include "vramtrace.h"
 *
 *   vramtrace_try_range_push("prefill/layer.3");
 *   cuMemAlloc_v2(&p, bytes);               // recorded with the label "prefill/layer.3"
 *   int64_t shape[] = {4128, 48, 128};
 *   vramtrace_try_annotate(p, "v_new", "bf16", shape, 3);
 *   vramtrace_try_range_pop();
 *
 * Semantics
 * - Ranges are per thread and nest. Every allocation a thread makes while ranges are open carries
 *   the open ranges' names joined by "/" as its label. Up to 64 levels and 1024 bytes of path are
 *   named; deeper pushes are counted so that pops stay balanced. NVTX ranges (nvtxRangePushA,
 *   nvtxDomainRangePushEx, ...) feed the same stack when vramtrace is NVTX's injection
 *   (`vramtrace run` sets NVTX_INJECTION64_PATH).
 * - vramtrace_annotate names the allocation that is live at `ptr` (a device pointer, a host
 *   pointer, or a cuMemCreate handle) with a name, an optional dtype ("bf16", "f32"; NULL for
 *   none) and an optional shape (`rank` values, outermost first; up to 16 are kept). Call it after
 *   the allocation; the reader attaches it to the allocation live at that pointer at that time.
 * - vramtrace_annotate_op (ABI 2) says the allocation at `ptr` is an output of operator `op`
 *   with that dtype and shape. It is a description, not a name: vramtrace still matches such an
 *   allocation to a model's tensor by its size and uses the shape as evidence. PyTorch's probe
 *   calls it for every operator output under `vramtrace run --torch-shapes`.
 * - Strings are copied before the call returns. Every function is thread-safe, never fails
 *   visibly and never blocks on the GPU.
 *
 * ABI version 2. vramtrace_abi_version() returns it; later versions only add functions.
 */
#ifndef VRAMTRACE_H
#define VRAMTRACE_H

#include <stdint.h>

#define VRAMTRACE_ABI_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

/* The functions the preload exports. Declared for reference and for programs that choose to
 * link against the preload; most callers use the vramtrace_try_* helpers instead. */
uint32_t vramtrace_abi_version(void);
void vramtrace_annotate(uint64_t ptr, const char *name, const char *dtype, const int64_t *shape,
                        uint32_t rank);
void vramtrace_annotate_op(uint64_t ptr, const char *op, const char *dtype, const int64_t *shape,
                           uint32_t rank);
void vramtrace_range_push(const char *name);
void vramtrace_range_pop(void);
void vramtrace_mark(const char *text);

#ifndef VRAMTRACE_NO_HELPERS
#include <dlfcn.h>

/* Looks an exported function up once per call site; NULL when the preload is not loaded. */
#define VRAMTRACE_LOOKUP_(type, name)                                                       \
    static type fn_;                                                                        \
    static int looked_;                                                                     \
    type f_;                                                                                \
    if (__atomic_load_n(&looked_, __ATOMIC_ACQUIRE)) {                                      \
        f_ = __atomic_load_n(&fn_, __ATOMIC_RELAXED);                                       \
    } else {                                                                                \
        f_ = (type)dlsym(RTLD_DEFAULT, name);                                               \
        __atomic_store_n(&fn_, f_, __ATOMIC_RELAXED);                                       \
        __atomic_store_n(&looked_, 1, __ATOMIC_RELEASE);                                    \
    }

static inline void vramtrace_try_annotate(uint64_t ptr, const char *name, const char *dtype,
                                          const int64_t *shape, uint32_t rank) {
    typedef void (*annotate_t)(uint64_t, const char *, const char *, const int64_t *, uint32_t);
    VRAMTRACE_LOOKUP_(annotate_t, "vramtrace_annotate")
    if (f_) f_(ptr, name, dtype, shape, rank);
}

static inline void vramtrace_try_range_push(const char *name) {
    typedef void (*push_t)(const char *);
    VRAMTRACE_LOOKUP_(push_t, "vramtrace_range_push")
    if (f_) f_(name);
}

static inline void vramtrace_try_range_pop(void) {
    typedef void (*pop_t)(void);
    VRAMTRACE_LOOKUP_(pop_t, "vramtrace_range_pop")
    if (f_) f_();
}

static inline void vramtrace_try_mark(const char *text) {
    typedef void (*mark_t)(const char *);
    VRAMTRACE_LOOKUP_(mark_t, "vramtrace_mark")
    if (f_) f_(text);
}
#endif /* VRAMTRACE_NO_HELPERS */

#ifdef __cplusplus
}
#endif

#endif /* VRAMTRACE_H */
