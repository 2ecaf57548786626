//! The preload's annotation ABI, found at run time.
//!
//! `libvramtrace_preload.so` exports (probes/preload/include/vramtrace.h, ABI 1)
//! `void vramtrace_annotate(uint64_t ptr, const char *name, const char *dtype, const int64_t *shape, uint32_t rank)`,
//! `void vramtrace_range_push(const char *name)` and `void vramtrace_range_pop(void)`.
//! They are looked up once with `dlsym(RTLD_DEFAULT, ...)`; without the preload
//! the lookups fail and every call here is a no-op.

use std::ffi::{CString, c_char};
use std::sync::OnceLock;

type AnnotateFn = unsafe extern "C" fn(u64, *const c_char, *const c_char, *const i64, u32);
type RangePushFn = unsafe extern "C" fn(*const c_char);
type RangePopFn = unsafe extern "C" fn();

struct Exports {
    annotate: Option<AnnotateFn>,
    range_push: Option<RangePushFn>,
    range_pop: Option<RangePopFn>,
}

fn lookup(name: &str) -> *mut libc::c_void {
    let Ok(c_name) = CString::new(name) else {
        return std::ptr::null_mut();
    };
    // Safety: RTLD_DEFAULT searches the global scope, where an LD_PRELOADed
    // library lives; `c_name` is a valid NUL-terminated string for the call.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, c_name.as_ptr()) }
}

fn exports() -> &'static Exports {
    static EXPORTS: OnceLock<Exports> = OnceLock::new();
    EXPORTS.get_or_init(|| {
        let annotate = lookup("vramtrace_annotate");
        let push = lookup("vramtrace_range_push");
        let pop = lookup("vramtrace_range_pop");
        Exports {
            // Safety: a non-null result is the preload's export, whose C
            // signature is the one declared by the type (probes/preload/include/vramtrace.h).
            annotate: (!annotate.is_null())
                .then(|| unsafe { std::mem::transmute::<*mut libc::c_void, AnnotateFn>(annotate) }),
            // Safety: as above, for `void vramtrace_range_push(const char *)`.
            range_push: (!push.is_null())
                .then(|| unsafe { std::mem::transmute::<*mut libc::c_void, RangePushFn>(push) }),
            // Safety: as above, for `int vramtrace_range_pop(void)`.
            range_pop: (!pop.is_null())
                .then(|| unsafe { std::mem::transmute::<*mut libc::c_void, RangePopFn>(pop) }),
        }
    })
}

/// Whether the preload's annotation ABI was found in this process.
pub fn available() -> bool {
    exports().annotate.is_some()
}

/// Name a live allocation with its dtype and shape.
pub fn annotate(ptr: u64, name: &str, dtype: &str, shape: &[i64]) {
    let Some(f) = exports().annotate else {
        return;
    };
    let (Ok(name), Ok(dtype)) = (CString::new(name), CString::new(dtype)) else {
        return;
    };
    // Safety: both strings are NUL-terminated and outlive the call; `shape`
    // points at `shape.len()` valid i64s (a dangling-but-aligned pointer when
    // empty, which the callee does not read for rank 0).
    unsafe {
        f(
            ptr,
            name.as_ptr(),
            dtype.as_ptr(),
            shape.as_ptr(),
            shape.len() as u32,
        );
    }
}

/// Open a named range; allocations until the matching [`range_pop`] carry it.
pub fn range_push(name: &str) {
    let Some(f) = exports().range_push else {
        return;
    };
    let Ok(name) = CString::new(name) else {
        return;
    };
    // Safety: `name` is NUL-terminated and outlives the call.
    unsafe {
        f(name.as_ptr());
    }
}

/// Close the innermost range opened by [`range_push`].
pub fn range_pop() {
    if let Some(f) = exports().range_pop {
        // Safety: the function takes no arguments.
        unsafe {
            f();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn absent_preload_is_a_no_op() {
        // Test binaries are not run under the preload.
        assert!(!super::available());
        super::annotate(0x1000, "q", "bf16", &[4, 2, 8]);
        super::range_push("stage");
        super::range_pop();
    }
}
