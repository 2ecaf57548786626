//! The driver's real entry points: the table of every function the preload wraps or calls,
//! and where each one really is.
//!
//! Every entry point is a row of [`ENTRIES`], indexed by [`Entry`]. Its real address lives in
//! [`REAL`], filled from the first place the driver shows itself:
//! - a `dlsym(handle, "cu…")` on a driver handle: every row is resolved on that handle with
//!   the real `dlsym` ([`adopt_handle`], called by the routing in [`crate::routing`]);
//! - a call through a plain export (programs linked with `-lcuda`): the row is resolved with
//!   `RTLD_NEXT`, the handle already adopted, or `dlopen("libcuda.so.1", RTLD_NOLOAD)`;
//! - as a last resort, the pointer `cuGetProcAddress` returned for a name we wrap
//!   ([`publish`]).
//!
//! The wrappers are not in this table: they sit above it ([`crate::hooks`] reads the real
//! functions from here), and the routing that maps a real pointer to its wrapper sits above
//! both. A real address is never code of this library ([`is_ours`]): a lookup in a scope that
//! holds the preload finds our wrappers, and taking one for the real function would make it
//! call itself.

use core::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use vramtrace_format::{API_NAMES, Api};

use crate::ffi::FnDriverGetVersion;
use crate::real_dlsym::real_dlsym_quiet;

/// One wrapped or called driver entry point.
pub(crate) struct EntryInfo {
    /// The exact exported name (`cuMemAlloc_v2`).
    pub(crate) name: &'static CStr,
    /// The base name `cuGetProcAddress` is asked for (`cuMemAlloc`).
    pub(crate) base: &'static [u8],
    /// The lowest `cudaVersion` for which `cuGetProcAddress` returns this version.
    pub(crate) since: c_int,
    /// True for the per-thread-default-stream twin (flag 2).
    pub(crate) ptsz: bool,
    /// Its id in the trace (0 for functions that record nothing themselves).
    pub(crate) api: Api,
}

/// Index into [`ENTRIES`] and [`REAL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum Entry {
    MemAllocV2,
    MemAllocPitchV2,
    MemAllocManaged,
    MemAllocAsync,
    MemAllocAsyncPtsz,
    MemAllocFromPoolAsync,
    MemAllocFromPoolAsyncPtsz,
    MemFreeV2,
    MemFreeAsync,
    MemFreeAsyncPtsz,
    MemCreate,
    MemRelease,
    MemMap,
    MemUnmap,
    MemAddressReserve,
    MemAddressFree,
    MemAllocHostV2,
    MemHostAlloc,
    MemFreeHost,
    ArrayCreateV2,
    Array3dCreateV2,
    ArrayDestroy,
    MemImportFromShareableHandle,
    MemRetainAllocationHandle,
    GetProcAddress,
    GetProcAddressV2,
    // Called by the recorder, never wrapped.
    CtxGetDevice,
    MemGetInfoV2,
    DeviceGetName,
    DeviceTotalMemV2,
    DriverGetVersion,
}

const N: usize = Entry::DriverGetVersion as usize + 1;

/// The [`Api`] id of a name in the format's table, found at compile time.
const fn api(name: &str) -> Api {
    match row_of(API_NAMES, name) {
        Some(i) => Api(i as u16),
        None => panic!("driver function missing from vramtrace_format::API_NAMES"),
    }
}

/// The index of `name` in `names`, at compile time.
const fn row_of(names: &[&str], name: &str) -> Option<usize> {
    let mut i = 0;
    while i < names.len() {
        if same(names[i].as_bytes(), name.as_bytes()) {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// Byte-wise equality, at compile time.
const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut j = 0;
    while j < a.len() && a[j] == b[j] {
        j += 1;
    }
    j == a.len()
}

/// The row of the entry point exported as `name`, at compile time: a name that is no row
/// does not compile.
pub(crate) const fn row_named(name: &str) -> usize {
    let mut i = 0;
    while i < N {
        if same(TABLE[i].name.to_bytes(), name.as_bytes()) {
            return i;
        }
        i += 1;
    }
    panic!("no driver entry point of that name")
}

/// A NUL-terminated name as a `CStr`, at compile time.
const fn c_name(with_nul: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(with_nul.as_bytes()) {
        Ok(name) => name,
        Err(_) => panic!("a driver entry name must not hold a NUL"),
    }
}

/// A row for the driver function `$f`, named once: its exported name and, for a recorded
/// function, its trace id follow from the identifier.
macro_rules! row {
    ($f:ident, $base:literal, $since:literal, $ptsz:literal, $api:expr) => {
        EntryInfo {
            name: c_name(concat!(stringify!($f), "\0")),
            base: $base.as_bytes(),
            since: $since,
            ptsz: $ptsz,
            api: $api,
        }
    };
}

/// A wrapped function whose calls are recorded under its own name; `ptsz` marks the
/// per-thread-default-stream twin.
macro_rules! recorded {
    ($f:ident, $base:literal, $since:literal) => {
        row!($f, $base, $since, false, api(stringify!($f)))
    };
    ($f:ident, $base:literal, $since:literal, ptsz) => {
        row!($f, $base, $since, true, api(stringify!($f)))
    };
}

/// A wrapped function that records nothing itself (`cuGetProcAddress` routes lookups).
macro_rules! routed {
    ($f:ident, $base:literal, $since:literal) => {
        row!($f, $base, $since, false, Api(0))
    };
}

/// A driver function the recorder calls, never wrapped.
macro_rules! called {
    ($f:ident, $base:literal, $since:literal) => {
        row!($f, $base, $since, false, Api(0))
    };
}

/// The table, in [`Entry`] order.
pub(crate) static ENTRIES: [EntryInfo; N] = TABLE;

/// The rows, in [`Entry`] order (a constant, so that [`row_named`] can read it at compile
/// time): function, base name, `since` and, for a `_ptsz` twin, `ptsz`. `since` follows the
/// driver API's versioned-name macros: the `_v2` allocation family since 3.2, async/pool since
/// 11.2, VMM since 10.2, `cuGetProcAddress` since 11.3 and its `_v2` since 12.0.
const TABLE: [EntryInfo; N] = [
    recorded!(cuMemAlloc_v2, "cuMemAlloc", 3020),
    recorded!(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020),
    recorded!(cuMemAllocManaged, "cuMemAllocManaged", 6000),
    recorded!(cuMemAllocAsync, "cuMemAllocAsync", 11020),
    recorded!(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, ptsz),
    recorded!(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020),
    recorded!(
        cuMemAllocFromPoolAsync_ptsz,
        "cuMemAllocFromPoolAsync",
        11020,
        ptsz
    ),
    recorded!(cuMemFree_v2, "cuMemFree", 3020),
    recorded!(cuMemFreeAsync, "cuMemFreeAsync", 11020),
    recorded!(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, ptsz),
    recorded!(cuMemCreate, "cuMemCreate", 10020),
    recorded!(cuMemRelease, "cuMemRelease", 10020),
    recorded!(cuMemMap, "cuMemMap", 10020),
    recorded!(cuMemUnmap, "cuMemUnmap", 10020),
    recorded!(cuMemAddressReserve, "cuMemAddressReserve", 10020),
    recorded!(cuMemAddressFree, "cuMemAddressFree", 10020),
    recorded!(cuMemAllocHost_v2, "cuMemAllocHost", 3020),
    recorded!(cuMemHostAlloc, "cuMemHostAlloc", 2020),
    recorded!(cuMemFreeHost, "cuMemFreeHost", 2000),
    recorded!(cuArrayCreate_v2, "cuArrayCreate", 3020),
    recorded!(cuArray3DCreate_v2, "cuArray3DCreate", 3020),
    recorded!(cuArrayDestroy, "cuArrayDestroy", 2000),
    recorded!(
        cuMemImportFromShareableHandle,
        "cuMemImportFromShareableHandle",
        10020
    ),
    recorded!(
        cuMemRetainAllocationHandle,
        "cuMemRetainAllocationHandle",
        11000
    ),
    routed!(cuGetProcAddress, "cuGetProcAddress", 11030),
    routed!(cuGetProcAddress_v2, "cuGetProcAddress", 12000),
    called!(cuCtxGetDevice, "cuCtxGetDevice", 2000),
    called!(cuMemGetInfo_v2, "cuMemGetInfo", 3020),
    called!(cuDeviceGetName, "cuDeviceGetName", 2000),
    called!(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020),
    called!(cuDriverGetVersion, "cuDriverGetVersion", 2020),
];

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
/// Real addresses, by [`Entry`]. Written once each (null → pointer), read lock-free.
static REAL: [AtomicPtr<c_void>; N] = [EMPTY; N];
/// The first driver handle a caller used; resolving there finds functions in a library that
/// was `dlopen`ed `RTLD_LOCAL` (as cudart does), where `RTLD_NEXT` cannot.
static DRIVER_HANDLE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
/// The last handle every row was resolved on, so repeated lookups on it cost nothing.
static ADOPTED: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
/// Set once every row has been resolved through [`real`].
static ALL_RESOLVED: AtomicBool = AtomicBool::new(false);
/// The load address of this library, null until first needed.
static OWN_BASE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// The load address of the object that holds `p`, if any.
fn object_base(p: *const c_void) -> *mut c_void {
    // Safety: an all-zero Dl_info is valid (null pointers).
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // Safety: dladdr only reads the loader's tables for `p` and fills our struct.
    if unsafe { libc::dladdr(p, &mut info) } == 0 {
        core::ptr::null_mut()
    } else {
        info.dli_fbase
    }
}

/// Is `p` code of this library (one of our wrappers, in practice)? Never a real entry point.
pub(crate) fn is_ours(p: *mut c_void) -> bool {
    if p.is_null() {
        return false;
    }
    let mut own = OWN_BASE.load(Ordering::Acquire);
    if own.is_null() {
        own = object_base(is_ours as *const c_void);
        OWN_BASE.store(own, Ordering::Release);
    }
    !own.is_null() && object_base(p) == own
}

/// Stores `p` as the real address of row `e` if none is known yet; returns the one in force.
pub(crate) fn publish(e: usize, p: *mut c_void) -> *mut c_void {
    if p.is_null() || is_ours(p) {
        return REAL[e].load(Ordering::Acquire);
    }
    match REAL[e].compare_exchange(
        core::ptr::null_mut(),
        p,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => p,
        Err(existing) => existing,
    }
}

/// The real address of row `e` if it is known already (null if not); resolves nothing.
#[inline]
pub(crate) fn known(e: usize) -> *mut c_void {
    REAL[e].load(Ordering::Acquire)
}

/// The real address of `e`, resolving it on first use. Null if no driver can be found.
#[inline]
pub(crate) fn real(e: Entry) -> *mut c_void {
    let p = REAL[e as usize].load(Ordering::Acquire);
    if p.is_null() { resolve(e as usize) } else { p }
}

/// The real function of `e` as the function-pointer type `F`; `None` if no driver provides it.
///
/// # Safety
/// `F` must be the C signature of entry `e`.
#[inline]
pub(crate) unsafe fn real_fn<F: Copy>(e: Entry) -> Option<F> {
    const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
    let p = real(e);
    if p.is_null() {
        None
    } else {
        // Safety: a code address of the right signature (the caller's promise), same size.
        Some(unsafe { core::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}

/// In a wrapper: the real function of `$entry` as `$ty`, or an early
/// `CUDA_ERROR_NOT_INITIALIZED` when no driver can be found at all (nothing to pass the call
/// to).
macro_rules! real_or_return {
    ($entry:ident as $ty:ty) => {{
        // Safety: REAL[$entry] only ever holds the driver's (or a later interposer's) address
        // of the entry point of that exact name, whose C signature is `$ty`.
        match unsafe { $crate::driver::real_fn::<$ty>($crate::driver::Entry::$entry) } {
            Some(f) => f,
            None => return $crate::ffi::CUDA_ERROR_NOT_INITIALIZED,
        }
    }};
}
pub(crate) use real_or_return;

/// `cuDriverGetVersion`'s answer; `None` when no driver (or no such function) can be found, or
/// it fails.
pub(crate) fn driver_version() -> Option<c_int> {
    // Safety: FnDriverGetVersion is cuDriverGetVersion's signature.
    let version = unsafe { real_fn::<FnDriverGetVersion>(Entry::DriverGetVersion) }?;
    let mut v: c_int = 0;
    // Safety: the driver's cuDriverGetVersion with a valid out-pointer.
    (unsafe { version(&mut v) } == 0).then_some(v)
}

#[cold]
fn resolve(e: usize) -> *mut c_void {
    let name = ENTRIES[e].name.as_ptr();
    let mut p = core::ptr::null_mut();
    let handle = DRIVER_HANDLE.load(Ordering::Acquire);
    if !handle.is_null() {
        p = real_dlsym_quiet(handle, name);
    }
    if p.is_null() || is_ours(p) {
        p = real_dlsym_quiet(libc::RTLD_NEXT, name);
    }
    if p.is_null() || is_ours(p) {
        // Safety: dlopen with a valid name; RTLD_NOLOAD only finds an already loaded driver
        // (matched by soname), never loads one.
        let h = unsafe {
            libc::dlopen(
                c"libcuda.so.1".as_ptr(),
                libc::RTLD_LAZY | libc::RTLD_NOLOAD,
            )
        };
        if h.is_null() {
            // Safety: clears the error the failed dlopen left (see real_dlsym_quiet).
            unsafe { libc::dlerror() };
        } else {
            let _ = DRIVER_HANDLE.compare_exchange(
                core::ptr::null_mut(),
                h,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            p = real_dlsym_quiet(h, name);
        }
    }
    publish(e, p)
}

/// Resolves every row on `handle`, a library on which a caller just found a driver entry
/// point. Only empty rows are filled: the first driver seen stays the driver.
pub(crate) fn adopt_handle(handle: *mut c_void) {
    if ADOPTED.load(Ordering::Acquire) == handle {
        return;
    }
    let _ = DRIVER_HANDLE.compare_exchange(
        core::ptr::null_mut(),
        handle,
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    for (i, e) in ENTRIES.iter().enumerate() {
        if REAL[i].load(Ordering::Acquire).is_null() {
            publish(i, real_dlsym_quiet(handle, e.name.as_ptr()));
        }
    }
    ADOPTED.store(handle, Ordering::Release);
}

/// Resolves every row once, for `cuGetProcAddress` reached without a `dlsym` on a handle.
pub(crate) fn resolve_all() {
    if ALL_RESOLVED.load(Ordering::Acquire) {
        return;
    }
    for (i, slot) in REAL.iter().enumerate() {
        if slot.load(Ordering::Acquire).is_null() {
            resolve(i);
        }
    }
    ALL_RESOLVED.store(true, Ordering::Release);
}

/// The driver handle in use: the first one a caller used or we found, else `RTLD_NEXT`.
pub(crate) fn driver_handle() -> *mut c_void {
    let handle = DRIVER_HANDLE.load(Ordering::Acquire);
    if handle.is_null() {
        libc::RTLD_NEXT
    } else {
        handle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_in_entry_order() {
        assert_eq!(
            ENTRIES[Entry::MemFreeAsyncPtsz as usize].name,
            c"cuMemFreeAsync_ptsz"
        );
        assert_eq!(
            ENTRIES[Entry::GetProcAddressV2 as usize].name,
            c"cuGetProcAddress_v2"
        );
        assert_eq!(
            ENTRIES[Entry::DriverGetVersion as usize].name,
            c"cuDriverGetVersion"
        );
        assert_eq!(
            ENTRIES[Entry::ArrayDestroy as usize].api.name(),
            "cuArrayDestroy"
        );
    }

    #[test]
    fn own_code_is_never_a_real_entry_point() {
        assert!(is_ours(publish as *mut c_void));
        assert!(!is_ours(libc::malloc as *mut c_void));
        assert!(!is_ours(core::ptr::null_mut()));
    }
}
