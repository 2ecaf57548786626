//! `cuGetProcAddress`: the one table of entry points by base name.
//!
//! Callers ask for a base name (`cuMemAlloc`), the CUDA version they were
//! built for and flags. Each base name lists its implementations with the
//! CUDA version that introduced them, newest first; the newest one not newer
//! than the request wins. A second list, where present, serves
//! `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` with the `_ptsz`/`_ptds`
//! twins. Versions are those of the real driver's table; implementations the
//! stand-in does not export (the 32-bit-size v1 functions of CUDA 2.x) are
//! left out, so older requests get `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.

use crate::state;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use crate::api::array::*;
use crate::api::context::*;
use crate::api::copy::*;
use crate::api::device::*;
use crate::api::init::*;
use crate::api::memory::*;
use crate::api::module::*;
use crate::api::pool::*;
use crate::api::stream::*;
use crate::api::vmm::*;
use crate::result::*;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub(crate) const PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CUdriverProcAddressQueryResult` values.
pub(crate) const SUCCESS: u32 = 0;
/// The name is not in the table.
pub(crate) const SYMBOL_NOT_FOUND: u32 = 1;
/// The name is known, but only in versions newer than the request.
pub(crate) const VERSION_NOT_SUFFICIENT: u32 = 2;

/// The address of one of our exported functions.
#[derive(Clone, Copy)]
pub(crate) struct Address(*const c_void);

// Safety: the addresses of functions never change and are never written through.
unsafe impl Sync for Address {}

/// One implementation of a base name.
pub(crate) struct Implementation {
    /// First CUDA version (`1000 * major + 10 * minor`) that returns it.
    pub since: c_int,
    /// The exported symbol.
    pub symbol: &'static str,
    address: Address,
}

/// A base name and its implementations, newest first.
pub(crate) struct Entry {
    /// The name callers ask for.
    pub name: &'static str,
    /// Implementations for the legacy default stream (flags 0 and 1).
    pub legacy: &'static [Implementation],
    /// Implementations under flag 2; empty when the function takes no stream.
    pub per_thread: &'static [Implementation],
}

macro_rules! versions {
    ($($since:literal => $function:ident),+) => {
        &[$(Implementation {
            since: $since,
            symbol: stringify!($function),
            address: Address($function as *const c_void),
        }),+]
    };
}

macro_rules! entry {
    ($name:literal: $($since:literal => $function:ident),+) => {
        Entry { name: $name, legacy: versions!($($since => $function),+), per_thread: &[] }
    };
    ($name:literal: $($since:literal => $function:ident),+ ; per_thread $($psince:literal => $pfunction:ident),+) => {
        Entry {
            name: $name,
            legacy: versions!($($since => $function),+),
            per_thread: versions!($($psince => $pfunction),+),
        }
    };
}

/// Every entry point the stand-in serves through `cuGetProcAddress`.
pub(crate) static TABLE: &[Entry] = &[
    // Initialisation, errors, the table itself.
    entry!("cuInit": 2000 => cuInit),
    entry!("cuDriverGetVersion": 2020 => cuDriverGetVersion),
    entry!("cuGetErrorString": 6000 => cuGetErrorString),
    entry!("cuGetErrorName": 6000 => cuGetErrorName),
    entry!("cuGetProcAddress": 12000 => cuGetProcAddress_v2, 11030 => cuGetProcAddress),
    // Devices.
    entry!("cuDeviceGet": 2000 => cuDeviceGet),
    entry!("cuDeviceGetCount": 2000 => cuDeviceGetCount),
    entry!("cuDeviceGetName": 2000 => cuDeviceGetName),
    entry!("cuDeviceTotalMem": 3020 => cuDeviceTotalMem_v2),
    entry!("cuDeviceGetAttribute": 2000 => cuDeviceGetAttribute),
    entry!("cuDeviceGetUuid": 11040 => cuDeviceGetUuid_v2, 9020 => cuDeviceGetUuid),
    entry!("cuDeviceGetDefaultMemPool": 11020 => cuDeviceGetDefaultMemPool),
    entry!("cuDeviceGetMemPool": 11020 => cuDeviceGetMemPool),
    entry!("cuDeviceSetMemPool": 11020 => cuDeviceSetMemPool),
    // Contexts.
    entry!("cuDevicePrimaryCtxRetain": 7000 => cuDevicePrimaryCtxRetain),
    entry!("cuDevicePrimaryCtxRelease": 11000 => cuDevicePrimaryCtxRelease_v2, 7000 => cuDevicePrimaryCtxRelease),
    entry!("cuDevicePrimaryCtxGetState": 7000 => cuDevicePrimaryCtxGetState),
    entry!("cuDevicePrimaryCtxSetFlags": 11000 => cuDevicePrimaryCtxSetFlags_v2, 7000 => cuDevicePrimaryCtxSetFlags),
    entry!("cuDevicePrimaryCtxReset": 11000 => cuDevicePrimaryCtxReset_v2, 7000 => cuDevicePrimaryCtxReset),
    entry!("cuCtxCreate": 12050 => cuCtxCreate_v4, 11040 => cuCtxCreate_v3, 3020 => cuCtxCreate_v2),
    entry!("cuCtxDestroy": 4000 => cuCtxDestroy_v2, 2000 => cuCtxDestroy),
    entry!("cuCtxSetCurrent": 4000 => cuCtxSetCurrent),
    entry!("cuCtxGetCurrent": 4000 => cuCtxGetCurrent),
    entry!("cuCtxGetDevice": 13000 => cuCtxGetDevice_v2, 2000 => cuCtxGetDevice),
    entry!("cuCtxPushCurrent": 4000 => cuCtxPushCurrent_v2, 2000 => cuCtxPushCurrent),
    entry!("cuCtxPopCurrent": 4000 => cuCtxPopCurrent_v2, 2000 => cuCtxPopCurrent),
    entry!("cuCtxSynchronize": 13000 => cuCtxSynchronize_v2, 2000 => cuCtxSynchronize),
    entry!("cuCtxGetFlags": 7000 => cuCtxGetFlags),
    entry!("cuCtxSetFlags": 12010 => cuCtxSetFlags),
    entry!("cuCtxGetLimit": 3010 => cuCtxGetLimit),
    entry!("cuCtxSetLimit": 3010 => cuCtxSetLimit),
    entry!("cuCtxGetStreamPriorityRange": 5050 => cuCtxGetStreamPriorityRange),
    // Streams and events.
    entry!("cuStreamCreate": 2000 => cuStreamCreate),
    entry!("cuStreamCreateWithPriority": 5050 => cuStreamCreateWithPriority),
    entry!("cuStreamDestroy": 4000 => cuStreamDestroy_v2, 2000 => cuStreamDestroy),
    entry!("cuStreamSynchronize": 2000 => cuStreamSynchronize; per_thread 7000 => cuStreamSynchronize_ptsz),
    entry!("cuStreamQuery": 2000 => cuStreamQuery; per_thread 7000 => cuStreamQuery_ptsz),
    entry!("cuStreamWaitEvent": 3020 => cuStreamWaitEvent; per_thread 7000 => cuStreamWaitEvent_ptsz),
    entry!("cuEventCreate": 2000 => cuEventCreate),
    entry!("cuEventRecord": 2000 => cuEventRecord; per_thread 7000 => cuEventRecord_ptsz),
    entry!("cuEventQuery": 2000 => cuEventQuery),
    entry!("cuEventSynchronize": 2000 => cuEventSynchronize),
    entry!("cuEventDestroy": 4000 => cuEventDestroy_v2, 2000 => cuEventDestroy),
    entry!("cuEventElapsedTime": 12080 => cuEventElapsedTime_v2, 2000 => cuEventElapsedTime),
    // Linear device memory and pinned host memory.
    entry!("cuMemAlloc": 3020 => cuMemAlloc_v2),
    entry!("cuMemAllocPitch": 3020 => cuMemAllocPitch_v2),
    entry!("cuMemAllocManaged": 6000 => cuMemAllocManaged),
    entry!("cuMemAllocAsync": 11020 => cuMemAllocAsync; per_thread 11020 => cuMemAllocAsync_ptsz),
    entry!("cuMemAllocFromPoolAsync": 11020 => cuMemAllocFromPoolAsync; per_thread 11020 => cuMemAllocFromPoolAsync_ptsz),
    entry!("cuMemFree": 3020 => cuMemFree_v2),
    entry!("cuMemFreeAsync": 11020 => cuMemFreeAsync; per_thread 11020 => cuMemFreeAsync_ptsz),
    entry!("cuMemGetInfo": 3020 => cuMemGetInfo_v2),
    entry!("cuMemGetAddressRange": 3020 => cuMemGetAddressRange_v2),
    entry!("cuMemAllocHost": 3020 => cuMemAllocHost_v2),
    entry!("cuMemHostAlloc": 2020 => cuMemHostAlloc),
    entry!("cuMemFreeHost": 2000 => cuMemFreeHost),
    entry!("cuMemHostGetDevicePointer": 3020 => cuMemHostGetDevicePointer_v2),
    entry!("cuPointerGetAttribute": 4000 => cuPointerGetAttribute),
    // Memset and memcpy.
    entry!("cuMemsetD8": 3020 => cuMemsetD8_v2; per_thread 7000 => cuMemsetD8_v2_ptds),
    entry!("cuMemsetD32": 3020 => cuMemsetD32_v2; per_thread 7000 => cuMemsetD32_v2_ptds),
    entry!("cuMemsetD8Async": 3020 => cuMemsetD8Async; per_thread 7000 => cuMemsetD8Async_ptsz),
    entry!("cuMemsetD32Async": 3020 => cuMemsetD32Async; per_thread 7000 => cuMemsetD32Async_ptsz),
    entry!("cuMemcpyHtoD": 3020 => cuMemcpyHtoD_v2; per_thread 7000 => cuMemcpyHtoD_v2_ptds),
    entry!("cuMemcpyDtoH": 3020 => cuMemcpyDtoH_v2; per_thread 7000 => cuMemcpyDtoH_v2_ptds),
    entry!("cuMemcpyDtoD": 3020 => cuMemcpyDtoD_v2; per_thread 7000 => cuMemcpyDtoD_v2_ptds),
    entry!("cuMemcpyHtoDAsync": 3020 => cuMemcpyHtoDAsync_v2; per_thread 7000 => cuMemcpyHtoDAsync_v2_ptsz),
    entry!("cuMemcpyDtoHAsync": 3020 => cuMemcpyDtoHAsync_v2; per_thread 7000 => cuMemcpyDtoHAsync_v2_ptsz),
    entry!("cuMemcpyDtoDAsync": 3020 => cuMemcpyDtoDAsync_v2; per_thread 7000 => cuMemcpyDtoDAsync_v2_ptsz),
    entry!("cuMemcpyPeerAsync": 4000 => cuMemcpyPeerAsync; per_thread 7000 => cuMemcpyPeerAsync_ptsz),
    // Virtual memory management.
    entry!("cuMemGetAllocationGranularity": 10020 => cuMemGetAllocationGranularity),
    entry!("cuMemCreate": 10020 => cuMemCreate),
    entry!("cuMemRelease": 10020 => cuMemRelease),
    entry!("cuMemAddressReserve": 10020 => cuMemAddressReserve),
    entry!("cuMemAddressFree": 10020 => cuMemAddressFree),
    entry!("cuMemMap": 10020 => cuMemMap),
    entry!("cuMemUnmap": 10020 => cuMemUnmap),
    entry!("cuMemSetAccess": 10020 => cuMemSetAccess),
    entry!("cuMemExportToShareableHandle": 10020 => cuMemExportToShareableHandle),
    entry!("cuMemImportFromShareableHandle": 10020 => cuMemImportFromShareableHandle),
    entry!("cuMemRetainAllocationHandle": 11000 => cuMemRetainAllocationHandle),
    // Arrays.
    entry!("cuArrayCreate": 3020 => cuArrayCreate_v2),
    entry!("cuArray3DCreate": 3020 => cuArray3DCreate_v2),
    entry!("cuArrayDestroy": 2000 => cuArrayDestroy),
    // Memory pools.
    entry!("cuMemPoolCreate": 11020 => cuMemPoolCreate),
    entry!("cuMemPoolDestroy": 11020 => cuMemPoolDestroy),
    entry!("cuMemPoolTrimTo": 11020 => cuMemPoolTrimTo),
    entry!("cuMemPoolGetAttribute": 11020 => cuMemPoolGetAttribute),
    entry!("cuMemPoolSetAttribute": 11020 => cuMemPoolSetAttribute),
    // Modules and launches: present so that callers get an error, not a missing symbol.
    entry!("cuModuleLoadData": 2000 => cuModuleLoadData),
    entry!("cuModuleUnload": 2000 => cuModuleUnload),
    entry!("cuModuleGetFunction": 2000 => cuModuleGetFunction),
    entry!("cuLaunchKernel": 4000 => cuLaunchKernel; per_thread 7000 => cuLaunchKernel_ptsz),
];

/// What a lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// The implementation to return, by symbol name and address.
    Found(&'static str, *mut c_void),
    /// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.
    NotFound,
    /// `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.
    VersionNotSufficient,
}

/// Resolves a base name for a CUDA version and flags.
pub(crate) fn lookup(name: &[u8], version: c_int, flags: u64) -> Lookup {
    let Some(entry) = TABLE.iter().find(|e| e.name.as_bytes() == name) else {
        return Lookup::NotFound;
    };
    let list = if flags & PER_THREAD_DEFAULT_STREAM != 0 && !entry.per_thread.is_empty() {
        entry.per_thread
    } else {
        entry.legacy
    };
    match list.iter().find(|i| i.since <= version) {
        Some(found) => Lookup::Found(found.symbol, found.address.0 as *mut c_void),
        None => Lookup::VersionNotSufficient,
    }
}

/// The body of `cuGetProcAddress` and `cuGetProcAddress_v2`: `status` may be null.
///
/// # Safety
/// `symbol` must be null or a NUL-terminated string; `pfn` and `status` must
/// be null or valid for writes.
pub(crate) unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut u32,
) -> CUresult {
    if symbol.is_null() || pfn.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // Safety: non-null and NUL-terminated per the API contract.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let (address, query, result) = match lookup(name, version, flags) {
        Lookup::Found(_, address) => (address, SUCCESS, CUDA_SUCCESS),
        Lookup::NotFound => (std::ptr::null_mut(), SYMBOL_NOT_FOUND, CUDA_ERROR_NOT_FOUND),
        Lookup::VersionNotSufficient => (
            std::ptr::null_mut(),
            VERSION_NOT_SUFFICIENT,
            CUDA_ERROR_NOT_FOUND,
        ),
    };
    // Safety: `pfn` is non-null and valid for writes per the API contract.
    unsafe { pfn.write(address) };
    if !status.is_null() {
        // Safety: non-null and valid for writes per the API contract.
        unsafe { status.write(query) };
    }
    result
}

/// `cuGetProcAddress` (CUDA 11.3 signature): base name, version, flags.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    state::count("cuGetProcAddress");
    // Safety: forwarded API contract; no status pointer.
    unsafe { get_proc_address(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) }
}

/// `cuGetProcAddress_v2` (CUDA 12.0): as `cuGetProcAddress`, plus a
/// `CUdriverProcAddressQueryResult` (0 found, 1 unknown name, 2 version too low).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_uint,
) -> CUresult {
    state::count("cuGetProcAddress_v2");
    // Safety: forwarded API contract.
    unsafe { get_proc_address(symbol, pfn, cuda_version, flags, status) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(name: &str, version: c_int, flags: u64) -> &'static str {
        match lookup(name.as_bytes(), version, flags) {
            Lookup::Found(symbol, _) => symbol,
            other => panic!("{name}@{version}/{flags}: {other:?}"),
        }
    }

    #[test]
    fn base_names_resolve_to_the_versioned_implementation() {
        assert_eq!(found("cuMemAlloc", 3020, 0), "cuMemAlloc_v2");
        assert_eq!(found("cuMemAlloc", 13000, 0), "cuMemAlloc_v2");
        assert_eq!(found("cuCtxCreate", 11040, 0), "cuCtxCreate_v3");
        assert_eq!(found("cuCtxCreate", 12080, 0), "cuCtxCreate_v4");
        assert_eq!(found("cuCtxSynchronize", 12090, 0), "cuCtxSynchronize");
        assert_eq!(found("cuCtxSynchronize", 13000, 0), "cuCtxSynchronize_v2");
        assert_eq!(found("cuStreamDestroy", 3000, 0), "cuStreamDestroy");
        assert_eq!(
            found("cuEventElapsedTime", 13000, 0),
            "cuEventElapsedTime_v2"
        );
        assert_eq!(lookup(b"cuMemAlloc", 3010, 0), Lookup::VersionNotSufficient);
        assert_eq!(
            lookup(b"cuMemAllocAsync", 11010, 0),
            Lookup::VersionNotSufficient
        );
        assert_eq!(lookup(b"cuMemAlloc_v2", 13000, 0), Lookup::NotFound);
        assert_eq!(lookup(b"cuNoSuchThing", 13000, 0), Lookup::NotFound);
    }

    #[test]
    fn flag_two_selects_the_per_thread_twin() {
        assert_eq!(
            found("cuMemAllocAsync", 13000, PER_THREAD_DEFAULT_STREAM),
            "cuMemAllocAsync_ptsz"
        );
        assert_eq!(found("cuMemAllocAsync", 13000, 1), "cuMemAllocAsync");
        assert_eq!(
            found("cuMemcpyHtoDAsync", 13000, 2),
            "cuMemcpyHtoDAsync_v2_ptsz"
        );
        assert_eq!(found("cuMemsetD8", 13000, 2), "cuMemsetD8_v2_ptds");
        // Functions without a stream have no twin: flag 2 changes nothing.
        assert_eq!(found("cuMemAlloc", 13000, 2), "cuMemAlloc_v2");
        assert_eq!(
            lookup(b"cuStreamSynchronize", 6050, 2),
            Lookup::VersionNotSufficient
        );
    }

    #[test]
    fn the_self_lookup_depends_on_the_version() {
        assert_eq!(found("cuGetProcAddress", 12000, 0), "cuGetProcAddress_v2");
        assert_eq!(found("cuGetProcAddress", 11080, 0), "cuGetProcAddress");
        assert_eq!(
            lookup(b"cuGetProcAddress", 11020, 0),
            Lookup::VersionNotSufficient
        );
    }

    #[test]
    fn the_table_is_well_formed() {
        for (i, entry) in TABLE.iter().enumerate() {
            assert!(
                TABLE[i + 1..].iter().all(|e| e.name != entry.name),
                "{} twice",
                entry.name
            );
            for list in [entry.legacy, entry.per_thread] {
                assert!(
                    list.windows(2).all(|w| w[0].since > w[1].since),
                    "{} not newest first",
                    entry.name
                );
                assert!(
                    list.iter().all(|i| i.symbol.starts_with(entry.name)),
                    "{}",
                    entry.name
                );
            }
            assert!(
                entry
                    .per_thread
                    .iter()
                    .all(|i| i.symbol.ends_with("_ptsz") || i.symbol.ends_with("_ptds"))
            );
        }
    }
}
