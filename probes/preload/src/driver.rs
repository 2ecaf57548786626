//! The driver's real entry points and the routing from a real pointer to our wrapper.
//!
//! Every entry point the preload wraps or calls is a row of [`ENTRIES`], indexed by [`Entry`].
//! Its real address lives in [`REAL`], filled from the first place the driver shows itself:
//! - a `dlsym(handle, "cu…")` on a driver handle: every row is resolved on that handle with
//!   the real `dlsym` ([`adopt_handle`]);
//! - a call through a plain export (programs linked with `-lcuda`): the row is resolved with
//!   `RTLD_NEXT`, the handle already adopted, or `dlopen("libcuda.so.1", RTLD_NOLOAD)`;
//! - as a last resort, the pointer `cuGetProcAddress` returned for a name we wrap.
//!
//! Routing ([`route_dlsym`], [`route_proc`]) maps a pointer the real driver handed out to the
//! wrapper of the entry point with that real address. A pointer is a function, so the wrapper's
//! ABI matches whatever version or `_ptsz` twin the driver chose. This assumes what the driver
//! API promises and the stand-in does: `cuGetProcAddress` hands out the same addresses as the
//! library's exports. Only a pointer we do not know falls back to the name: (base name, version,
//! flags) → the versioned name the CUDA headers would pick, unless the pointer is the export of
//! a version we do not wrap (a future `_v3`), which keeps the driver's pointer. Every routing by
//! name is written to the trace as a NOTE, so a run on a real driver shows which rule applied.

use core::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use vramtrace_format::{API_NAMES, Api};

use crate::dlsym::real_dlsym_quiet;
use crate::hooks;

/// One wrapped or called driver entry point.
pub(crate) struct EntryInfo {
    /// The exact exported name (`cuMemAlloc_v2`).
    pub(crate) name: &'static CStr,
    /// The base name `cuGetProcAddress` is asked for (`cuMemAlloc`).
    base: &'static [u8],
    /// The lowest `cudaVersion` for which `cuGetProcAddress` returns this version.
    since: c_int,
    /// True for the per-thread-default-stream twin (flag 2).
    ptsz: bool,
    /// Our wrapper, or null for functions the recorder only calls.
    wrapper: *const c_void,
    /// Its id in the trace.
    pub(crate) api: Api,
}

// Safety: the table is immutable; the raw pointers are code addresses, shared freely.
unsafe impl Sync for EntryInfo {}

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
    let mut i = 0;
    while i < API_NAMES.len() {
        let a = API_NAMES[i].as_bytes();
        let b = name.as_bytes();
        if a.len() == b.len() {
            let mut j = 0;
            while j < a.len() && a[j] == b[j] {
                j += 1;
            }
            if j == a.len() {
                return Api(i as u16);
            }
        }
        i += 1;
    }
    panic!("driver function missing from vramtrace_format::API_NAMES")
}

/// A NUL-terminated name as a `CStr`, at compile time.
const fn c_name(with_nul: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(with_nul.as_bytes()) {
        Ok(name) => name,
        Err(_) => panic!("a driver entry name must not hold a NUL"),
    }
}

/// A row for the driver function `$f`, named once: its exported name, its wrapper in
/// [`hooks`] and its trace id all follow from the identifier.
macro_rules! row {
    ($f:ident, $base:literal, $since:literal, $ptsz:literal, $wrapper:expr, $api:expr) => {
        EntryInfo {
            name: c_name(concat!(stringify!($f), "\0")),
            base: $base.as_bytes(),
            since: $since,
            ptsz: $ptsz,
            wrapper: $wrapper,
            api: $api,
        }
    };
}

/// A wrapped function whose calls are recorded under its own name; `ptsz` marks the
/// per-thread-default-stream twin.
macro_rules! recorded {
    ($f:ident, $base:literal, $since:literal) => {
        row!(
            $f,
            $base,
            $since,
            false,
            hooks::$f as *const c_void,
            api(stringify!($f))
        )
    };
    ($f:ident, $base:literal, $since:literal, ptsz) => {
        row!(
            $f,
            $base,
            $since,
            true,
            hooks::$f as *const c_void,
            api(stringify!($f))
        )
    };
}

/// A wrapped function that records nothing itself (`cuGetProcAddress` routes lookups).
macro_rules! routed {
    ($f:ident, $base:literal, $since:literal) => {
        row!($f, $base, $since, false, hooks::$f as *const c_void, Api(0))
    };
}

/// A driver function the recorder calls, never wrapped.
macro_rules! called {
    ($f:ident, $base:literal, $since:literal) => {
        row!($f, $base, $since, false, core::ptr::null(), Api(0))
    };
}

/// The table, in [`Entry`] order: function, base name, `since` and, for a
/// `_ptsz` twin, `ptsz`. `since` follows the driver API's versioned-name macros: the `_v2`
/// allocation family since 3.2, async/pool since 11.2, VMM since 10.2, `cuGetProcAddress` since
/// 11.3 and its `_v2` since 12.0.
pub(crate) static ENTRIES: [EntryInfo; N] = [
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

/// Is `p` one of our wrappers?
pub(crate) fn is_wrapper(p: *const c_void) -> bool {
    !p.is_null() && ENTRIES.iter().any(|e| e.wrapper == p)
}

/// Stores `p` as the real address of `e` if none is known yet; returns the one in force.
fn publish(e: usize, p: *mut c_void) -> *mut c_void {
    if p.is_null() || is_wrapper(p) {
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

#[cold]
fn resolve(e: usize) -> *mut c_void {
    let name = ENTRIES[e].name.as_ptr();
    let mut p = core::ptr::null_mut();
    let handle = DRIVER_HANDLE.load(Ordering::Acquire);
    if !handle.is_null() {
        p = real_dlsym_quiet(handle, name);
    }
    if p.is_null() || is_wrapper(p) {
        p = real_dlsym_quiet(libc::RTLD_NEXT, name);
    }
    if p.is_null() || is_wrapper(p) {
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
fn resolve_all() {
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

/// The wrapper whose real address is `p`.
pub(crate) fn wrapper_for_real(p: *mut c_void) -> Option<*mut c_void> {
    ENTRIES
        .iter()
        .zip(REAL.iter())
        .find(|(e, r)| !e.wrapper.is_null() && r.load(Ordering::Acquire) == p)
        .map(|(e, _)| e.wrapper as *mut c_void)
}

/// What `dlsym(handle, symbol)` should return, given that the real one returned `p`
/// (non-null, `symbol` a `cu[A-Z]…` name).
pub(crate) fn route_dlsym(handle: *mut c_void, symbol: &[u8], p: *mut c_void) -> *mut c_void {
    if is_wrapper(p) {
        return p;
    }
    if ENTRIES.iter().any(|e| e.name.to_bytes() == symbol) {
        // The caller just found a driver entry point on `handle`: it is a driver handle.
        adopt_handle(handle);
    }
    wrapper_for_real(p).unwrap_or(p)
}

/// What `cuGetProcAddress(symbol, version, flags)` should hand out, given that the real one
/// handed out `p` (non-null).
pub(crate) fn route_proc(symbol: &[u8], version: c_int, flags: u64, p: *mut c_void) -> *mut c_void {
    if is_wrapper(p) {
        return p;
    }
    resolve_all();
    if let Some(w) = wrapper_for_real(p) {
        return w;
    }
    // A pointer we do not know (the driver handed out an address its exports do not show):
    // pick the versioned name the headers would, and adopt `p` as that row's real address if
    // the row has none. Each such decision is noted in the trace, so a real driver's run shows
    // whether routing by pointer held. But a version we do not wrap (a `_v3` a newer driver
    // exports, say) keeps the driver's pointer: our wrapper would have another ABI.
    match versioned_by_name(symbol, version, flags) {
        Some(_) if is_other_export(symbol, p) => p,
        Some(i) => {
            publish(i, p);
            let mut msg = [0u8; 256];
            let mut w = &mut msg[..];
            use std::io::Write;
            let _ = write!(
                w,
                "cuGetProcAddress({}, {version}, {flags}) returned an address no export shows; \
                 routed by name to {}",
                String::from_utf8_lossy(&symbol[..symbol.len().min(64)]),
                ENTRIES[i].name.to_string_lossy()
            );
            let len = 256 - w.len();
            crate::recorder::note(&msg[..len]);
            ENTRIES[i].wrapper as *mut c_void
        }
        None => p,
    }
}

/// Is `p` the export of another version of `base` (`base`, `base_vN`, with `_ptsz`/`_ptds`),
/// one that we do not wrap?
fn is_other_export(base: &[u8], p: *mut c_void) -> bool {
    let handle = DRIVER_HANDLE.load(Ordering::Acquire);
    let handle = if handle.is_null() {
        libc::RTLD_NEXT
    } else {
        handle
    };
    if base.len() > 96 {
        return false;
    }
    let mut name = [0u8; 112];
    for version in ["", "_v2", "_v3", "_v4", "_v5", "_v6", "_v7", "_v8", "_v9"] {
        for twin in ["", "_ptsz", "_ptds"] {
            let len = base.len() + version.len() + twin.len();
            name[..base.len()].copy_from_slice(base);
            name[base.len()..base.len() + version.len()].copy_from_slice(version.as_bytes());
            name[base.len() + version.len()..len].copy_from_slice(twin.as_bytes());
            name[len] = 0;
            if ENTRIES.iter().any(|e| e.name.to_bytes() == &name[..len]) {
                continue;
            }
            if real_dlsym_quiet(handle, name.as_ptr() as *const c_char) == p {
                return true;
            }
        }
    }
    false
}

/// The wrapped row that (base name, version, flags) selects: the highest `since` not above
/// `version`, the `_ptsz` twin when flag 2 is set and the family has one.
pub(crate) fn versioned_by_name(base: &[u8], version: c_int, flags: u64) -> Option<usize> {
    let want_ptsz = flags & crate::ffi::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let family = || {
        ENTRIES
            .iter()
            .enumerate()
            .filter(move |(_, e)| !e.wrapper.is_null() && e.base == base && e.since <= version)
    };
    let best_since = family().map(|(_, e)| e.since).max()?;
    let at_best = || family().filter(move |(_, e)| e.since == best_since);
    at_best()
        .find(|(_, e)| e.ptsz == want_ptsz)
        .or_else(|| at_best().find(|(_, e)| !e.ptsz))
        .map(|(i, _)| i)
}

/// Reads a C string symbol name.
///
/// # Safety
/// `symbol` must be a valid NUL-terminated string.
pub(crate) unsafe fn name_bytes<'a>(symbol: *const c_char) -> &'a [u8] {
    // Safety: guaranteed by the caller.
    unsafe { CStr::from_ptr(symbol) }.to_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_like_the_headers() {
        let name = |b: &str, v, f| versioned_by_name(b.as_bytes(), v, f).map(|i| ENTRIES[i].name);
        assert_eq!(name("cuMemAlloc", 13000, 0), Some(c"cuMemAlloc_v2"));
        assert_eq!(name("cuMemAlloc", 3000, 0), None);
        assert_eq!(name("cuMemAlloc", 13000, 2), Some(c"cuMemAlloc_v2"));
        assert_eq!(
            name("cuMemAllocAsync", 12000, 2),
            Some(c"cuMemAllocAsync_ptsz")
        );
        assert_eq!(name("cuMemAllocAsync", 12000, 0), Some(c"cuMemAllocAsync"));
        assert_eq!(
            name("cuMemFreeAsync", 11020, 2),
            Some(c"cuMemFreeAsync_ptsz")
        );
        assert_eq!(
            name("cuGetProcAddress", 13000, 0),
            Some(c"cuGetProcAddress_v2")
        );
        assert_eq!(
            name("cuGetProcAddress", 11080, 0),
            Some(c"cuGetProcAddress")
        );
        assert_eq!(name("cuCtxGetDevice", 13000, 0), None);
        assert_eq!(name("cuLaunchKernel", 13000, 0), None);
    }

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
}
