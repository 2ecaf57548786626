//! glibc's own `dlsym` and `dlvsym`, for the preload's lookups and for the exported overrides
//! ([`crate::dlsym()`], [`crate::dlvsym()`]) to jump to.
//!
//! Nothing in this library ever calls the exported `dlsym` or `dlvsym`, and it cannot ask
//! either for glibc's: both names bind to the preload's own exports. Instead
//! [`crate::elf_lookup`] reads them (their default versions) from the dynamic symbol table of
//! the object that defines `dlerror`, which is glibc's. They are cached in [`REAL_DLSYM`] and
//! [`REAL_DLVSYM`].

use core::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use crate::elf_lookup;

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// glibc's own `dlsym`; null until first needed. Read by the naked `dlsym`'s fast path.
pub(crate) static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
/// glibc's own `dlvsym`; null until first needed (or if it could not be found).
pub(crate) static REAL_DLVSYM: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
/// Set once the lookup has run (whether or not it found both).
static LOOKED_UP: AtomicBool = AtomicBool::new(false);

/// Finds glibc's `dlsym` and `dlvsym`, once: `dlsym@@GLIBC_2.34` since libdl merged into libc,
/// `@@GLIBC_2.2.5` (x86-64) or `@@GLIBC_2.17` (aarch64) in libdl before. Two threads may both
/// run it the first time; they store the same pointers.
fn look_up() {
    if LOOKED_UP.load(Ordering::Acquire) {
        return;
    }
    // The address of `dlerror` as this library's own reference resolved it: glibc's (the
    // preload does not export `dlerror`; this assumes no library loaded before it does).
    let anchor = libc::dlerror as *const () as usize;
    if let Some(t) = elf_lookup::object_containing(anchor) {
        // Safety: a table read from a loaded object.
        let (dlsym, dlvsym) =
            unsafe { (t.default_function(c"dlsym"), t.default_function(c"dlvsym")) };
        // dlsym first: whoever sees REAL_DLVSYM set (Acquire) then sees REAL_DLSYM too, which
        // the dlvsym answers compare against.
        if let Some(p) = dlsym {
            REAL_DLSYM.store(p as *mut c_void, Ordering::Release);
        }
        if let Some(p) = dlvsym {
            REAL_DLVSYM.store(p as *mut c_void, Ordering::Release);
        }
    }
    LOOKED_UP.store(true, Ordering::Release);
}

/// glibc's `dlsym`; null only if it could not be found, in which case `dlsym` answers null.
/// Called by the naked `dlsym` on its first use, with the C ABI.
pub(crate) extern "C" fn vramtrace_init_real_dlsym() -> *mut c_void {
    let p = REAL_DLSYM.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    look_up();
    REAL_DLSYM.load(Ordering::Acquire)
}

/// glibc's `dlvsym`; null only if it could not be found.
pub(crate) fn real_dlvsym_ptr() -> *mut c_void {
    let p = REAL_DLVSYM.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    look_up();
    REAL_DLVSYM.load(Ordering::Acquire)
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

/// Calls glibc's `dlvsym`, with the preload as the caller glibc sees (as [`real_dlsym`]).
pub(crate) fn real_dlvsym(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    let p = real_dlvsym_ptr();
    if p.is_null() {
        return core::ptr::null_mut();
    }
    // Safety: `p` is glibc's dlvsym, whose signature is DlvsymFn; arguments are passed through.
    unsafe { core::mem::transmute::<*mut c_void, DlvsymFn>(p)(handle, symbol, version) }
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
