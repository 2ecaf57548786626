//! Routing: which function a lookup hands out. A pointer the real driver handed out, through
//! `dlsym` on a driver handle ([`route_dlsym`], for [`crate::dlsym()`]) or through
//! `cuGetProcAddress` ([`route_proc`], for the two wrappers of it defined here), becomes the
//! wrapper of the entry point with that real address.
//!
//! A pointer is a function, so the wrapper's ABI matches whatever version or `_ptsz` twin the
//! driver chose. This assumes what the driver API promises and the stand-in does:
//! `cuGetProcAddress` hands out the same addresses as the library's exports. Only a pointer we
//! do not know falls back to the name: (base name, version, flags) → the versioned name the
//! CUDA headers would pick, unless the pointer is the export of a version we do not wrap (a
//! future `_v3`), which keeps the driver's pointer. Every routing by name is written to the
//! trace as a NOTE, so a run on a real driver shows which rule applied.
//!
//! This module sits above both halves it joins: the real addresses ([`crate::driver`]) and
//! the wrappers ([`crate::hooks`], which read the real functions from the table and know
//! nothing of routing). Its own wrappers, of `cuGetProcAddress` and `cuGetProcAddress_v2`,
//! are the two that route rather than record.

#![allow(non_snake_case)]

use core::ffi::{CStr, c_char, c_int, c_void};

use crate::driver::{
    ENTRIES, adopt_handle, driver_handle, known, publish, real_or_return, resolve_all, row_named,
};
use crate::ffi::{
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, CUDA_SUCCESS, CuResult, FnGetProcAddress,
    FnGetProcAddressV2,
};
use crate::hooks;
use crate::real_dlsym::real_dlsym_quiet;

/// One of our wrappers and the row of the entry point it stands for.
struct Wrapper {
    /// The row in [`ENTRIES`].
    row: usize,
    /// The wrapper's address.
    f: *const c_void,
}

// Safety: the table is immutable; the raw pointers are code addresses, shared freely.
unsafe impl Sync for Wrapper {}

/// The wrapper `$m::$f` of the entry point exported as `$f`: the row follows from the name at
/// compile time, so a wrapper cannot stand for another function.
macro_rules! wrapper {
    ($m:ident :: $f:ident) => {
        Wrapper {
            row: row_named(stringify!($f)),
            f: $m::$f as *const c_void,
        }
    };
}

/// Every wrapper we hand out, in [`crate::driver::Entry`] order (the functions the recorder
/// only calls have none).
static WRAPPERS: [Wrapper; 26] = [
    wrapper!(hooks::cuMemAlloc_v2),
    wrapper!(hooks::cuMemAllocPitch_v2),
    wrapper!(hooks::cuMemAllocManaged),
    wrapper!(hooks::cuMemAllocAsync),
    wrapper!(hooks::cuMemAllocAsync_ptsz),
    wrapper!(hooks::cuMemAllocFromPoolAsync),
    wrapper!(hooks::cuMemAllocFromPoolAsync_ptsz),
    wrapper!(hooks::cuMemFree_v2),
    wrapper!(hooks::cuMemFreeAsync),
    wrapper!(hooks::cuMemFreeAsync_ptsz),
    wrapper!(hooks::cuMemCreate),
    wrapper!(hooks::cuMemRelease),
    wrapper!(hooks::cuMemMap),
    wrapper!(hooks::cuMemUnmap),
    wrapper!(hooks::cuMemAddressReserve),
    wrapper!(hooks::cuMemAddressFree),
    wrapper!(hooks::cuMemAllocHost_v2),
    wrapper!(hooks::cuMemHostAlloc),
    wrapper!(hooks::cuMemFreeHost),
    wrapper!(hooks::cuArrayCreate_v2),
    wrapper!(hooks::cuArray3DCreate_v2),
    wrapper!(hooks::cuArrayDestroy),
    wrapper!(hooks::cuMemImportFromShareableHandle),
    wrapper!(hooks::cuMemRetainAllocationHandle),
    wrapper!(self::cuGetProcAddress),
    wrapper!(self::cuGetProcAddress_v2),
];

/// Is `p` one of our wrappers?
fn is_wrapper(p: *const c_void) -> bool {
    !p.is_null() && WRAPPERS.iter().any(|w| w.f == p)
}

/// The wrapper whose real address is `p`.
fn wrapper_for_real(p: *mut c_void) -> Option<*mut c_void> {
    WRAPPERS
        .iter()
        .find(|w| known(w.row) == p)
        .map(|w| w.f as *mut c_void)
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
        Some(w) => {
            publish(w.row, p);
            let mut msg = [0u8; 256];
            let mut out = &mut msg[..];
            use std::io::Write;
            let _ = write!(
                out,
                "cuGetProcAddress({}, {version}, {flags}) returned an address no export shows; \
                 routed by name to {}",
                String::from_utf8_lossy(&symbol[..symbol.len().min(64)]),
                ENTRIES[w.row].name.to_string_lossy()
            );
            let len = 256 - out.len();
            crate::recorder::note(&msg[..len]);
            w.f as *mut c_void
        }
        None => p,
    }
}

/// Is `p` the export of another version of `base` (`base`, `base_vN`, with `_ptsz`/`_ptds`),
/// one that we do not wrap?
fn is_other_export(base: &[u8], p: *mut c_void) -> bool {
    let handle = driver_handle();
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

/// The wrapper that (base name, version, flags) selects: the highest `since` not above
/// `version`, the `_ptsz` twin when flag 2 is set and the family has one.
fn versioned_by_name(base: &[u8], version: c_int, flags: u64) -> Option<&'static Wrapper> {
    let want_ptsz = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let family = || {
        WRAPPERS
            .iter()
            .map(|w| (w, &ENTRIES[w.row]))
            .filter(move |(_, e)| e.base == base && e.since <= version)
    };
    let best_since = family().map(|(_, e)| e.since).max()?;
    let at_best = || family().filter(move |(_, e)| e.since == best_since);
    at_best()
        .find(|(_, e)| e.ptsz == want_ptsz)
        .or_else(|| at_best().find(|(_, e)| !e.ptsz))
        .map(|(w, _)| w)
}

/// Reads a C string symbol name.
///
/// # Safety
/// `symbol` must be a valid NUL-terminated string.
pub(crate) unsafe fn name_bytes<'a>(symbol: *const c_char) -> &'a [u8] {
    // Safety: guaranteed by the caller.
    unsafe { CStr::from_ptr(symbol) }.to_bytes()
}

// ---- the cuGetProcAddress wrappers ------------------------------------------------------

/// Replaces the pointer the real `cuGetProcAddress` wrote with our wrapper where we have one.
///
/// # Safety
/// `symbol` is a valid C string and `pfn` a valid out-pointer the driver just filled.
unsafe fn substitute(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
    if symbol.is_null() || pfn.is_null() || !crate::config::enabled() {
        return;
    }
    // Safety: the driver filled *pfn (the call succeeded).
    let p = unsafe { pfn.read() };
    if p.is_null() {
        return;
    }
    let routed = std::panic::catch_unwind(|| {
        // Safety: guaranteed by the caller.
        route_proc(unsafe { name_bytes(symbol) }, version, flags, p)
    })
    .unwrap_or_else(|_| {
        crate::sink::disable("internal error while routing cuGetProcAddress");
        p
    });
    // Safety: valid out-pointer (caller's contract).
    unsafe { pfn.write(routed) };
}

/// `cuGetProcAddress` (CUDA 11.3–11.8 ABI): the real lookup, then routing.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CuResult {
    let real = real_or_return!(GetProcAddress as FnGetProcAddress);
    // Safety: arguments passed through unchanged.
    let r = unsafe { real(symbol, pfn, cuda_version, flags) };
    if r == CUDA_SUCCESS {
        // Safety: the driver succeeded, so symbol and pfn are valid.
        unsafe { substitute(symbol, pfn, cuda_version, flags) };
    }
    r
}

/// `cuGetProcAddress_v2` (CUDA 12+): the real lookup, then routing. Asked for
/// `"cuGetProcAddress"` itself (cudart's self-lookup) the driver returns its own
/// `cuGetProcAddress_v2`, which routes back here.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CuResult {
    let real = real_or_return!(GetProcAddressV2 as FnGetProcAddressV2);
    // Safety: arguments passed through unchanged.
    let r = unsafe { real(symbol, pfn, cuda_version, flags, symbol_status) };
    if r == CUDA_SUCCESS {
        // Safety: the driver succeeded, so symbol and pfn are valid.
        unsafe { substitute(symbol, pfn, cuda_version, flags) };
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Entry;

    #[test]
    fn names_resolve_like_the_headers() {
        let name =
            |b: &str, v, f| versioned_by_name(b.as_bytes(), v, f).map(|w| ENTRIES[w.row].name);
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
    fn every_wrapped_row_has_one_wrapper_in_entry_order() {
        let rows: Vec<usize> = WRAPPERS.iter().map(|w| w.row).collect();
        let wrapped: Vec<usize> = (0..=Entry::GetProcAddressV2 as usize).collect();
        assert_eq!(rows, wrapped);
    }
}
