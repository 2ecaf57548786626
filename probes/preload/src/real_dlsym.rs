//! glibc's own `dlsym`, for the preload's lookups and for the exported override
//! ([`crate::dlsym()`]) to jump to.
//!
//! Nothing in this library ever calls the exported `dlsym`: the real one lives in
//! [`REAL_DLSYM`], found with `dlvsym`, which is not overridden here.

use core::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's own `dlsym`; null until first needed. Read by the naked `dlsym`'s fast path.
pub(crate) static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// Finds glibc's `dlsym` (`GLIBC_2.34` since libdl merged into libc, `GLIBC_2.2.5` before on
/// x86-64, `GLIBC_2.17` on aarch64).
/// Returns null only if neither exists, in which case `dlsym` answers null. Called by the naked
/// `dlsym` on its first use, with the C ABI.
pub(crate) extern "C" fn vramtrace_init_real_dlsym() -> *mut c_void {
    let p = REAL_DLSYM.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    // The version before 2.34 is the architecture's first: 2.2.5 on x86-64, 2.17 on aarch64.
    #[cfg(target_arch = "x86_64")]
    let versions = [c"GLIBC_2.34", c"GLIBC_2.2.5"];
    #[cfg(target_arch = "aarch64")]
    let versions = [c"GLIBC_2.34", c"GLIBC_2.17"];
    for version in versions {
        // Safety: dlvsym with valid C strings. RTLD_NEXT from this object finds the next
        // definition after the preload: glibc's. dlvsym is not overridden here.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !p.is_null() {
            REAL_DLSYM.store(p, Ordering::Release);
            return p;
        }
    }
    core::ptr::null_mut()
}

/// Calls glibc's `dlsym`. From here the caller glibc sees is the preload, which is what we
/// want for our own lookups (`RTLD_NEXT` then means "after the preload").
pub(crate) fn real_dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let p = vramtrace_init_real_dlsym();
    if p.is_null() {
        return core::ptr::null_mut();
    }
    // Safety: `p` is glibc's dlsym, whose signature is DlsymFn; arguments are passed through.
    unsafe { core::mem::transmute::<*mut c_void, DlsymFn>(p)(handle, symbol) }
}

/// [`real_dlsym`] for the preload's own lookups: a failed one leaves no error for the program's
/// next `dlerror()` (glibc keeps one pending error per thread, which the program's own
/// successful `dlsym` would have cleared).
pub(crate) fn real_dlsym_quiet(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let p = real_dlsym(handle, symbol);
    if p.is_null() {
        // Safety: dlerror has no preconditions; it returns and clears the pending error.
        unsafe { libc::dlerror() };
    }
    p
}
