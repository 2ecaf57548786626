//! The built `libcuda.so`, loaded with `dlopen` the way cudart and cudarc load
//! the real one: its exports, `cuGetProcAddress(_v2)` semantics, what happens
//! before `cuInit`, configuration errors, per-thread contexts, and that an
//! `LD_PRELOAD`ed interposer cannot capture the library's own lookups.

mod common;

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::ptr::null_mut;

use common::{Library, is_child, library, run_child, run_child_ok};

type CUresult = u32;
type GetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_uint) -> CUresult;
type GetProcAddress = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
type Init = unsafe extern "C" fn(c_uint) -> CUresult;
type DeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> CUresult;
type DeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CUresult;
type DeviceTotalMem = unsafe extern "C" fn(*mut usize, c_int) -> CUresult;
type DeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_uint, c_int) -> CUresult;
type PrimaryRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CUresult;
type SetCurrent = unsafe extern "C" fn(*mut c_void) -> CUresult;
type MemAlloc = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
type MemAllocAsync = unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> CUresult;
type MemFree = unsafe extern "C" fn(u64) -> CUresult;
type MemFreeAsync = unsafe extern "C" fn(u64, *mut c_void) -> CUresult;
type MemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
type DriverGetVersion = unsafe extern "C" fn(*mut c_int) -> CUresult;
type GetErrorString = unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult;
type CallCount = unsafe extern "C" fn(*const c_char) -> u64;

const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
const CUDA_ERROR_NO_DEVICE: CUresult = 100;
const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
const CUDA_ERROR_NOT_FOUND: CUresult = 500;
const PER_THREAD: u64 = 2;

/// Every function the stand-in exports, by the name a linker or `dlsym` uses.
const EXPORTS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorString",
    "cuGetErrorName",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetAttribute",
    "cuDeviceGetUuid",
    "cuDeviceGetUuid_v2",
    "cuDeviceGetDefaultMemPool",
    "cuDeviceGetMemPool",
    "cuDeviceSetMemPool",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxRelease_v2",
    "cuDevicePrimaryCtxGetState",
    "cuDevicePrimaryCtxSetFlags",
    "cuDevicePrimaryCtxSetFlags_v2",
    "cuDevicePrimaryCtxReset",
    "cuDevicePrimaryCtxReset_v2",
    "cuCtxCreate_v2",
    "cuCtxCreate_v3",
    "cuCtxCreate_v4",
    "cuCtxDestroy",
    "cuCtxDestroy_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuCtxGetDevice_v2",
    "cuCtxPushCurrent",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent",
    "cuCtxPopCurrent_v2",
    "cuCtxSynchronize",
    "cuCtxSynchronize_v2",
    "cuCtxGetFlags",
    "cuCtxSetFlags",
    "cuCtxGetLimit",
    "cuCtxSetLimit",
    "cuCtxGetStreamPriorityRange",
    "cuStreamCreate",
    "cuStreamCreateWithPriority",
    "cuStreamDestroy",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamSynchronize_ptsz",
    "cuStreamQuery",
    "cuStreamQuery_ptsz",
    "cuStreamWaitEvent",
    "cuStreamWaitEvent_ptsz",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventRecord_ptsz",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy",
    "cuEventDestroy_v2",
    "cuEventElapsedTime",
    "cuEventElapsedTime_v2",
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemFree_v2",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuMemGetInfo_v2",
    "cuMemGetAddressRange_v2",
    "cuMemAllocHost_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer_v2",
    "cuPointerGetAttribute",
    "cuMemsetD8_v2",
    "cuMemsetD8_v2_ptds",
    "cuMemsetD32_v2",
    "cuMemsetD32_v2_ptds",
    "cuMemsetD8Async",
    "cuMemsetD8Async_ptsz",
    "cuMemsetD32Async",
    "cuMemsetD32Async_ptsz",
    "cuMemcpyHtoD_v2",
    "cuMemcpyHtoD_v2_ptds",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoH_v2_ptds",
    "cuMemcpyDtoD_v2",
    "cuMemcpyDtoD_v2_ptds",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyHtoDAsync_v2_ptsz",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoHAsync_v2_ptsz",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyDtoDAsync_v2_ptsz",
    "cuMemcpyPeerAsync",
    "cuMemcpyPeerAsync_ptsz",
    "cuMemGetAllocationGranularity",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuArrayCreate_v2",
    "cuArray3DCreate_v2",
    "cuArrayDestroy",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolTrimTo",
    "cuMemPoolGetAttribute",
    "cuMemPoolSetAttribute",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuLaunchKernel",
    "cuLaunchKernel_ptsz",
    "vramtrace_fake_call_count",
];

fn cstring(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// `cuGetProcAddress_v2(name, version, flags)`: (result, pointer, status).
fn proc_address(
    lib: &Library,
    name: &str,
    version: c_int,
    flags: u64,
) -> (CUresult, *mut c_void, c_uint) {
    // Safety: the signature of cuGetProcAddress_v2.
    let gpa: GetProcAddressV2 = unsafe { lib.function("cuGetProcAddress_v2") };
    let mut pfn = std::ptr::dangling_mut::<c_void>(); // must be overwritten, also on failure
    let mut status = 99;
    // Safety: a NUL-terminated name and writable out-pointers.
    let rc = unsafe {
        gpa(
            cstring(name).as_ptr(),
            &mut pfn,
            version,
            flags,
            &mut status,
        )
    };
    (rc, pfn, status)
}

/// Asserts `name` at `version`/`flags` resolves to the export `symbol`, the
/// library's own definition.
fn assert_resolves(lib: &Library, name: &str, version: c_int, flags: u64, symbol: &str) {
    let (rc, pfn, status) = proc_address(lib, name, version, flags);
    assert_eq!((rc, status), (0, 0), "{name}@{version} flags {flags}");
    assert_eq!(
        pfn,
        lib.address(symbol),
        "{name}@{version} flags {flags} should be {symbol}"
    );
    assert!(!pfn.is_null());
}

#[test]
fn exports_the_driver_api_at_distinct_addresses() {
    let lib = Library::open(&library());
    let mut seen = std::collections::HashMap::new();
    for &name in EXPORTS {
        let address = lib.address(name);
        assert!(!address.is_null(), "{name} is not exported");
        if let Some(other) = seen.insert(address, name) {
            panic!("{name} and {other} share one address: callers could not tell them apart");
        }
    }
    // The CUDA 2.x entry points with 32-bit sizes are not exported.
    for name in [
        "cuMemAlloc",
        "cuMemFree",
        "cuMemGetInfo",
        "cuDeviceTotalMem",
        "cuCtxCreate",
    ] {
        assert!(lib.address(name).is_null(), "{name} should not be exported");
    }
}

#[test]
fn proc_address_gives_the_library_its_own_versioned_definition() {
    let lib = Library::open(&library());
    // The brief's case, exactly: the pointer is what dlsym gives for the `_v2` export.
    let (rc, pfn, _) = proc_address(&lib, "cuMemAlloc", 3020, 0);
    assert_eq!(rc, 0);
    assert_eq!(pfn, lib.address("cuMemAlloc_v2"));
    for (name, version, symbol) in [
        ("cuMemAlloc", 13000, "cuMemAlloc_v2"),
        ("cuMemFree", 3020, "cuMemFree_v2"),
        ("cuMemGetInfo", 3020, "cuMemGetInfo_v2"),
        ("cuDeviceTotalMem", 12000, "cuDeviceTotalMem_v2"),
        ("cuMemAllocPitch", 3020, "cuMemAllocPitch_v2"),
        ("cuMemAllocHost", 3020, "cuMemAllocHost_v2"),
        ("cuArrayCreate", 3020, "cuArrayCreate_v2"),
        ("cuArray3DCreate", 3020, "cuArray3DCreate_v2"),
        ("cuCtxCreate", 3020, "cuCtxCreate_v2"),
        ("cuCtxCreate", 11040, "cuCtxCreate_v3"),
        ("cuCtxCreate", 13000, "cuCtxCreate_v4"),
        ("cuCtxDestroy", 4000, "cuCtxDestroy_v2"),
        ("cuCtxDestroy", 3020, "cuCtxDestroy"),
        ("cuCtxSynchronize", 12090, "cuCtxSynchronize"),
        ("cuCtxSynchronize", 13000, "cuCtxSynchronize_v2"),
        (
            "cuDevicePrimaryCtxRelease",
            11000,
            "cuDevicePrimaryCtxRelease_v2",
        ),
        (
            "cuDevicePrimaryCtxRelease",
            10020,
            "cuDevicePrimaryCtxRelease",
        ),
        ("cuEventElapsedTime", 12080, "cuEventElapsedTime_v2"),
        ("cuMemAllocAsync", 11020, "cuMemAllocAsync"),
        ("cuMemCreate", 10020, "cuMemCreate"),
        ("cuMemMap", 13000, "cuMemMap"),
        ("cuMemHostAlloc", 13000, "cuMemHostAlloc"),
        ("cuMemcpyHtoDAsync", 13000, "cuMemcpyHtoDAsync_v2"),
        ("cuMemsetD8Async", 13000, "cuMemsetD8Async"),
        ("cuInit", 2000, "cuInit"),
    ] {
        assert_resolves(&lib, name, version, 0, symbol);
        // Flag 1 (legacy default stream) is the same as 0.
        assert_resolves(&lib, name, version, 1, symbol);
    }
}

#[test]
fn flag_two_gives_the_per_thread_stream_twins() {
    let lib = Library::open(&library());
    for (name, symbol) in [
        ("cuMemAllocAsync", "cuMemAllocAsync_ptsz"),
        ("cuMemFreeAsync", "cuMemFreeAsync_ptsz"),
        ("cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"),
        ("cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2_ptsz"),
        ("cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2_ptsz"),
        ("cuMemcpyDtoDAsync", "cuMemcpyDtoDAsync_v2_ptsz"),
        ("cuMemsetD8Async", "cuMemsetD8Async_ptsz"),
        ("cuMemsetD32Async", "cuMemsetD32Async_ptsz"),
        ("cuMemcpyHtoD", "cuMemcpyHtoD_v2_ptds"),
        ("cuMemsetD8", "cuMemsetD8_v2_ptds"),
        ("cuStreamSynchronize", "cuStreamSynchronize_ptsz"),
        ("cuStreamWaitEvent", "cuStreamWaitEvent_ptsz"),
        ("cuEventRecord", "cuEventRecord_ptsz"),
        ("cuLaunchKernel", "cuLaunchKernel_ptsz"),
        // No stream argument, no twin: flag 2 changes nothing.
        ("cuMemAlloc", "cuMemAlloc_v2"),
        ("cuMemFree", "cuMemFree_v2"),
        ("cuStreamCreate", "cuStreamCreate"),
    ] {
        assert_resolves(&lib, name, 13000, PER_THREAD, symbol);
    }
    assert_ne!(
        proc_address(&lib, "cuMemAllocAsync", 13000, 0).1,
        proc_address(&lib, "cuMemAllocAsync", 13000, PER_THREAD).1
    );
}

#[test]
fn the_self_lookup_returns_v2_from_cuda_12() {
    let lib = Library::open(&library());
    assert_resolves(&lib, "cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2");
    assert_resolves(
        &lib,
        "cuGetProcAddress",
        13000,
        PER_THREAD,
        "cuGetProcAddress_v2",
    );
    assert_resolves(&lib, "cuGetProcAddress", 11080, 0, "cuGetProcAddress");
    assert_resolves(&lib, "cuGetProcAddress", 11030, 0, "cuGetProcAddress");
    assert_eq!(
        proc_address(&lib, "cuGetProcAddress", 11020, 0),
        (CUDA_ERROR_NOT_FOUND, null_mut(), 2)
    );

    // The v1 entry point resolves through the same table.
    // Safety: the signature of cuGetProcAddress (CUDA 11.3).
    let gpa1: GetProcAddress = unsafe { lib.function("cuGetProcAddress") };
    let mut pfn = null_mut();
    // Safety: NUL-terminated names and a writable out-pointer.
    unsafe {
        assert_eq!(gpa1(c"cuMemAlloc".as_ptr(), &mut pfn, 12000, 0), 0);
        assert_eq!(pfn, lib.address("cuMemAlloc_v2"));
        assert_eq!(gpa1(c"cuGetProcAddress".as_ptr(), &mut pfn, 11040, 0), 0);
        assert_eq!(pfn, lib.address("cuGetProcAddress"));
        assert_eq!(
            gpa1(c"cuNotAFunction".as_ptr(), &mut pfn, 13000, 0),
            CUDA_ERROR_NOT_FOUND
        );
        assert!(pfn.is_null());
    }
}

#[test]
fn unknown_names_and_old_versions_are_not_found() {
    let lib = Library::open(&library());
    // Unknown name: CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND.
    assert_eq!(
        proc_address(&lib, "cuNotAFunction", 13000, 0),
        (CUDA_ERROR_NOT_FOUND, null_mut(), 1)
    );
    // Lookups take base names: the versioned export name is not one.
    assert_eq!(
        proc_address(&lib, "cuMemAlloc_v2", 13000, 0),
        (CUDA_ERROR_NOT_FOUND, null_mut(), 1)
    );
    assert_eq!(
        proc_address(&lib, "cuMemAllocAsync_ptsz", 13000, 0),
        (CUDA_ERROR_NOT_FOUND, null_mut(), 1)
    );
    // Known name, version too low: CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT.
    assert_eq!(
        proc_address(&lib, "cuMemAlloc", 3010, 0),
        (CUDA_ERROR_NOT_FOUND, null_mut(), 2)
    );
    assert_eq!(
        proc_address(&lib, "cuMemAllocAsync", 11010, 0),
        (CUDA_ERROR_NOT_FOUND, null_mut(), 2)
    );
    assert_eq!(
        proc_address(&lib, "cuStreamSynchronize", 6050, PER_THREAD),
        (CUDA_ERROR_NOT_FOUND, null_mut(), 2)
    );

    // Safety: the signature of cuGetProcAddress_v2.
    let gpa: GetProcAddressV2 = unsafe { lib.function("cuGetProcAddress_v2") };
    let mut pfn = null_mut();
    // Safety: null arguments are rejected; the status pointer is optional.
    unsafe {
        assert_eq!(
            gpa(null_mut(), &mut pfn, 13000, 0, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            gpa(c"cuInit".as_ptr(), null_mut(), 13000, 0, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(gpa(c"cuInit".as_ptr(), &mut pfn, 13000, 0, null_mut()), 0);
        assert_eq!(pfn, lib.address("cuInit"));
    }
}

#[test]
fn error_strings_and_version_work_before_init() {
    let lib = Library::open(&library());
    // Safety: the signatures of these exports.
    let (version, string, name): (DriverGetVersion, GetErrorString, GetErrorString) = unsafe {
        (
            lib.function("cuDriverGetVersion"),
            lib.function("cuGetErrorString"),
            lib.function("cuGetErrorName"),
        )
    };
    let mut v = 0;
    let mut text: *const c_char = std::ptr::null();
    // Safety: writable out-pointers; returned strings are static and NUL-terminated.
    unsafe {
        assert_eq!(version(&mut v), 0);
        assert_eq!(v, 13000);
        assert_eq!(string(CUDA_ERROR_OUT_OF_MEMORY, &mut text), 0);
        assert_eq!(CStr::from_ptr(text), c"out of memory");
        assert_eq!(name(CUDA_ERROR_OUT_OF_MEMORY, &mut text), 0);
        assert_eq!(CStr::from_ptr(text), c"CUDA_ERROR_OUT_OF_MEMORY");
        assert_eq!(name(CUDA_ERROR_INVALID_CONTEXT, &mut text), 0);
        assert_eq!(CStr::from_ptr(text), c"CUDA_ERROR_INVALID_CONTEXT");
        assert_eq!(string(123_456, &mut text), CUDA_ERROR_INVALID_VALUE);
        assert!(text.is_null());
    }
}

#[test]
fn calls_before_init_are_refused_and_memory_needs_a_context() {
    if !is_child() {
        run_child_ok(
            "calls_before_init_are_refused_and_memory_needs_a_context",
            &[],
        );
        return;
    }
    let lib = Library::open(&library());
    // Safety: the signatures of these exports.
    let (init, alloc, get): (Init, MemAlloc, DeviceGet) = unsafe {
        (
            lib.function("cuInit"),
            lib.function("cuMemAlloc_v2"),
            lib.function("cuDeviceGet"),
        )
    };
    let (mut ptr, mut dev) = (0u64, 0);
    // Safety: writable out-pointers.
    unsafe {
        assert_eq!(alloc(&mut ptr, 1), CUDA_ERROR_NOT_INITIALIZED);
        assert_eq!(get(&mut dev, 0), CUDA_ERROR_NOT_INITIALIZED);
        assert_eq!(init(1), CUDA_ERROR_INVALID_VALUE, "flags must be 0");
        assert_eq!(init(0), 0);
        assert_eq!(init(0), 0, "repeated cuInit is fine");
        assert_eq!(get(&mut dev, 1), CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(alloc(&mut ptr, 1), CUDA_ERROR_INVALID_CONTEXT);
    }
}

#[test]
fn bad_configuration_fails_cu_init_with_one_line_on_stderr() {
    if is_child() {
        let lib = Library::open(&library());
        // Safety: the signature of cuInit.
        let init: Init = unsafe { lib.function("cuInit") };
        // Safety: no preconditions.
        unsafe {
            assert_eq!(init(0), CUDA_ERROR_INVALID_VALUE);
            assert_eq!(init(0), CUDA_ERROR_INVALID_VALUE);
        }
        return;
    }
    let name = "bad_configuration_fails_cu_init_with_one_line_on_stderr";
    for (variable, value) in [
        ("VRAMTRACE_FAKE_CAPACITY", "lots"),
        ("VRAMTRACE_FAKE_CAPACITY", "24GiB,0"),
        ("VRAMTRACE_FAKE_DEVICES", "many"),
        ("VRAMTRACE_FAKE_DEVICES", "99"),
    ] {
        let output = run_child_ok(name, &[(variable, value)]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("vramtrace stand-in"))
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "one line even for two cuInit calls:\n{stderr}"
        );
        assert!(lines[0].contains(&format!("{variable}=")), "{}", lines[0]);
        assert!(!String::from_utf8_lossy(&output.stdout).contains("vramtrace stand-in"));
    }
}

#[test]
fn zero_devices_is_no_device() {
    if !is_child() {
        run_child_ok(
            "zero_devices_is_no_device",
            &[("VRAMTRACE_FAKE_DEVICES", "0")],
        );
        return;
    }
    let lib = Library::open(&library());
    // Safety: the signature of cuInit.
    let init: Init = unsafe { lib.function("cuInit") };
    // Safety: no preconditions.
    assert_eq!(unsafe { init(0) }, CUDA_ERROR_NO_DEVICE);
}

#[test]
fn devices_report_their_configuration() {
    if !is_child() {
        run_child_ok(
            "devices_report_their_configuration",
            &[
                ("VRAMTRACE_FAKE_CAPACITY", "80GB,141GB"),
                ("VRAMTRACE_FAKE_NAME", "NVIDIA H200"),
            ],
        );
        return;
    }
    let lib = Library::open(&library());
    // Safety: the signatures of these exports.
    let (init, name, total, attribute): (Init, DeviceGetName, DeviceTotalMem, DeviceGetAttribute) = unsafe {
        (
            lib.function("cuInit"),
            lib.function("cuDeviceGetName"),
            lib.function("cuDeviceTotalMem_v2"),
            lib.function("cuDeviceGetAttribute"),
        )
    };
    let mut buffer = [0x7f as c_char; 64];
    let (mut bytes, mut value) = (0usize, 0);
    // Safety: writable buffers of the sizes passed.
    unsafe {
        assert_eq!(init(0), 0);
        assert_eq!(name(buffer.as_mut_ptr(), 64, 1), 0);
        assert_eq!(CStr::from_ptr(buffer.as_ptr()), c"NVIDIA H200");
        assert_eq!(name(buffer.as_mut_ptr(), 7, 0), 0);
        assert_eq!(
            CStr::from_ptr(buffer.as_ptr()),
            c"NVIDIA",
            "cut to len - 1 bytes"
        );
        assert_eq!(total(&mut bytes, 0), 0);
        assert_eq!(bytes, 80_000_000_000);
        assert_eq!(total(&mut bytes, 1), 0);
        assert_eq!(bytes, 141_000_000_000);
        assert_eq!(total(&mut bytes, 2), CUDA_ERROR_INVALID_DEVICE);
        for (attr, expected) in [
            (75, 9),
            (76, 0),
            (115, 1),
            (10, 32),
            (1, 1024),
            (16, 132),
            (41, 1),
        ] {
            assert_eq!(attribute(&mut value, attr, 1), 0);
            assert_eq!(value, expected, "attribute {attr}");
        }
        assert_eq!(attribute(&mut value, 100_000, 0), CUDA_ERROR_INVALID_VALUE);
    }
}

#[test]
fn the_current_context_is_per_thread() {
    if !is_child() {
        run_child_ok(
            "the_current_context_is_per_thread",
            &[("VRAMTRACE_FAKE_CAPACITY", "1GiB")],
        );
        return;
    }
    let lib = Library::open(&library());
    // Safety: the signatures of these exports.
    let (init, retain, set, alloc, free, info): (
        Init,
        PrimaryRetain,
        SetCurrent,
        MemAlloc,
        MemFree,
        MemGetInfo,
    ) = unsafe {
        (
            lib.function("cuInit"),
            lib.function("cuDevicePrimaryCtxRetain"),
            lib.function("cuCtxSetCurrent"),
            lib.function("cuMemAlloc_v2"),
            lib.function("cuMemFree_v2"),
            lib.function("cuMemGetInfo_v2"),
        )
    };
    let mut ctx = null_mut();
    let mut ptr = 0u64;
    // Safety: writable out-pointers.
    unsafe {
        assert_eq!(init(0), 0);
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set(ctx), 0);
        assert_eq!(alloc(&mut ptr, 1000), 0);
    }
    let ctx_address = ctx as usize;
    std::thread::spawn(move || {
        let (mut other, mut free_bytes, mut total) = (0u64, 0usize, 0usize);
        // Safety: writable out-pointers; the context handle is valid.
        unsafe {
            assert_eq!(
                alloc(&mut other, 1000),
                CUDA_ERROR_INVALID_CONTEXT,
                "a new thread has no context"
            );
            assert_eq!(set(ctx_address as *mut c_void), 0);
            assert_eq!(alloc(&mut other, 1000), 0);
            assert_eq!(info(&mut free_bytes, &mut total), 0);
            assert_eq!((free_bytes, total), ((1 << 30) - 2000, 1 << 30));
            assert_eq!(free(other), 0);
        }
    })
    .join()
    .unwrap();
    // Safety: freeing what this thread allocated.
    unsafe {
        assert_eq!(free(ptr), 0);
        assert_eq!(free(ptr), CUDA_ERROR_INVALID_VALUE, "double free");
    }
}

#[test]
fn the_current_device_follows_the_thread_s_context_until_it_goes() {
    if !is_child() {
        run_child_ok(
            "the_current_device_follows_the_thread_s_context_until_it_goes",
            &[("VRAMTRACE_FAKE_DEVICES", "2")],
        );
        return;
    }
    type CtxCreate = unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> CUresult;
    type CtxDestroy = unsafe extern "C" fn(*mut c_void) -> CUresult;
    type CtxGetDevice = unsafe extern "C" fn(*mut c_int) -> CUresult;
    type CtxGetCurrent = unsafe extern "C" fn(*mut *mut c_void) -> CUresult;
    type PrimaryRelease = unsafe extern "C" fn(c_int) -> CUresult;
    type CallCount = unsafe extern "C" fn(*const c_char) -> u64;
    let lib = Library::open(&library());
    // Safety: the signatures of these exports.
    let (init, retain, release, set, create, destroy, device, current, count): (
        Init,
        PrimaryRetain,
        PrimaryRelease,
        SetCurrent,
        CtxCreate,
        CtxDestroy,
        CtxGetDevice,
        CtxGetCurrent,
        CallCount,
    ) = unsafe {
        (
            lib.function("cuInit"),
            lib.function("cuDevicePrimaryCtxRetain"),
            lib.function("cuDevicePrimaryCtxRelease_v2"),
            lib.function("cuCtxSetCurrent"),
            lib.function("cuCtxCreate_v2"),
            lib.function("cuCtxDestroy_v2"),
            lib.function("cuCtxGetDevice"),
            lib.function("cuCtxGetCurrent"),
            lib.function("vramtrace_fake_call_count"),
        )
    };
    let (mut primary, mut made, mut seen) = (null_mut(), null_mut(), null_mut());
    let mut dev = -1;
    // Safety: writable out-pointers, handles the driver gave out.
    unsafe {
        assert_eq!(init(0), 0);
        assert_eq!(
            device(&mut dev),
            CUDA_ERROR_INVALID_CONTEXT,
            "no context yet"
        );
        assert_eq!(current(&mut seen), 0);
        assert!(seen.is_null());
        assert_eq!(retain(&mut primary, 0), 0);
        assert_eq!(set(primary), 0);
        for _ in 0..3 {
            assert_eq!(device(&mut dev), 0);
            assert_eq!(dev, 0);
        }
        assert_eq!(device(null_mut()), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(create(&mut made, 0, 1), 0, "pushed: current now");
        assert_eq!(current(&mut seen), 0);
        assert_eq!(seen, made);
        for _ in 0..3 {
            assert_eq!(device(&mut dev), 0);
            assert_eq!(dev, 1);
        }
        // Destroyed by another thread: still this thread's current context, no longer valid.
        let made_address = made as usize;
        std::thread::spawn(move || assert_eq!(destroy(made_address as *mut c_void), 0))
            .join()
            .unwrap();
        assert_eq!(device(&mut dev), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(set(primary), 0);
        assert_eq!(device(&mut dev), 0);
        assert_eq!(dev, 0);
        // The primary context's last release makes it invalid too.
        assert_eq!(release(0), 0);
        assert_eq!(device(&mut dev), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(retain(&mut primary, 0), 0);
        assert_eq!(device(&mut dev), 0);
        // Every call counts, whichever path answered it.
        assert_eq!(count(c"cuCtxGetDevice".as_ptr()), 12);
        assert_eq!(count(c"cuCtxGetCurrent".as_ptr()), 2);
    }
}

#[test]
fn cuda_13_runtime_bootstrap_through_the_self_lookup() {
    if !is_child() {
        run_child_ok(
            "cuda_13_runtime_bootstrap_through_the_self_lookup",
            &[("VRAMTRACE_FAKE_CAPACITY", "64MiB")],
        );
        return;
    }
    let lib = Library::open(&library());
    // As cudart 13: dlsym cuGetProcAddress_v2 once, ask it for itself, resolve the rest through that.
    let (rc, own, status) = proc_address(&lib, "cuGetProcAddress", 13000, 0);
    assert_eq!((rc, status), (0, 0));
    // Safety: the self-lookup at 13000 is cuGetProcAddress_v2.
    let gpa: GetProcAddressV2 =
        unsafe { std::mem::transmute::<*mut c_void, GetProcAddressV2>(own) };
    let resolve = |name: &CStr, version: c_int, flags: u64| -> *mut c_void {
        let mut pfn = null_mut();
        let mut status = 9;
        // Safety: NUL-terminated name, writable out-pointers.
        assert_eq!(
            unsafe { gpa(name.as_ptr(), &mut pfn, version, flags, &mut status) },
            0,
            "{name:?}"
        );
        assert_eq!(status, 0);
        pfn
    };
    // Safety: each pointer is the implementation of the named function at that version.
    unsafe {
        let init: Init = std::mem::transmute(resolve(c"cuInit", 13000, 0));
        let get: DeviceGet = std::mem::transmute(resolve(c"cuDeviceGet", 13000, 0));
        let retain: PrimaryRetain =
            std::mem::transmute(resolve(c"cuDevicePrimaryCtxRetain", 13000, 0));
        let set: SetCurrent = std::mem::transmute(resolve(c"cuCtxSetCurrent", 13000, 0));
        let alloc: MemAlloc = std::mem::transmute(resolve(c"cuMemAlloc", 13000, 0));
        let free: MemFree = std::mem::transmute(resolve(c"cuMemFree", 13000, 0));
        let info: MemGetInfo = std::mem::transmute(resolve(c"cuMemGetInfo", 13000, 0));
        let alloc_pt: MemAllocAsync =
            std::mem::transmute(resolve(c"cuMemAllocAsync", 13000, PER_THREAD));
        let free_pt: MemFreeAsync =
            std::mem::transmute(resolve(c"cuMemFreeAsync", 13000, PER_THREAD));
        let count: CallCount = lib.function("vramtrace_fake_call_count");

        let (mut dev, mut ctx) = (0, null_mut());
        assert_eq!(init(0), 0);
        assert_eq!(get(&mut dev, 0), 0);
        assert_eq!(retain(&mut ctx, dev), 0);
        assert_eq!(set(ctx), 0);
        let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
        assert_eq!(alloc(&mut a, 7 << 20), 0);
        // The null stream of a per-thread entry point is the thread's own stream.
        assert_eq!(alloc_pt(&mut b, 9 << 20, null_mut()), 0);
        let (mut free_bytes, mut total) = (0usize, 0usize);
        assert_eq!(info(&mut free_bytes, &mut total), 0);
        assert_eq!((free_bytes, total), ((64 - 16) << 20, 64 << 20));
        assert_eq!(alloc(&mut c, free_bytes + 1), CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(alloc(&mut c, free_bytes), 0);
        assert_eq!(free(c), 0);
        assert_eq!(free_pt(b, null_mut()), 0);
        assert_eq!(free(a), 0);
        assert_eq!(info(&mut free_bytes, &mut total), 0);
        assert_eq!(free_bytes, 64 << 20);
        assert_eq!(count(c"cuMemAllocAsync_ptsz".as_ptr()), 1);
        assert_eq!(count(c"cuMemAllocAsync".as_ptr()), 0);
        assert_eq!(count(c"cuMemAlloc_v2".as_ptr()), 3);
    }
}

/// An interposer exporting `cuMemAlloc_v2` and `cuGetProcAddress_v2`, as the
/// vramtrace preload does, each answering with a marker value.
const INTERPOSER: &str = r#"
#include <stddef.h>
int cuMemAlloc_v2(unsigned long long *p, size_t n) { (void)n; *p = 0; return 4242; }
int cuGetProcAddress_v2(const char *s, void **f, int v, unsigned long long fl, int *st) {
    (void)s; (void)v; (void)fl; (void)st; *f = 0; return 4343;
}
"#;

#[test]
fn a_preloaded_interposer_cannot_capture_the_library_s_own_lookups() {
    if is_child() {
        let lib = Library::open(&library());
        // The interposer is what a global lookup finds ...
        let global = cstring("cuMemAlloc_v2");
        // Safety: a NUL-terminated name; RTLD_DEFAULT searches the global scope.
        let interposed = unsafe { libc::dlsym(libc::RTLD_DEFAULT, global.as_ptr()) };
        assert!(!interposed.is_null(), "the interposer is preloaded");
        assert_ne!(interposed, lib.address("cuMemAlloc_v2"));
        // ... but the stand-in hands out its own definitions, as the real driver does.
        let (rc, pfn, _) = proc_address(&lib, "cuMemAlloc", 3020, 0);
        assert_eq!(rc, 0);
        assert_eq!(pfn, lib.address("cuMemAlloc_v2"));
        assert_ne!(pfn, interposed);
        let (rc, own, _) = proc_address(&lib, "cuGetProcAddress", 13000, 0);
        assert_eq!(rc, 0);
        assert_eq!(own, lib.address("cuGetProcAddress_v2"));
        // And calling through the pointer reaches the stand-in, not the interposer.
        // Safety: the signatures of these exports.
        unsafe {
            let init: Init = lib.function("cuInit");
            let alloc: MemAlloc = std::mem::transmute::<*mut c_void, MemAlloc>(pfn);
            let mut ptr = 0;
            assert_eq!(init(0), 0);
            assert_eq!(
                alloc(&mut ptr, 1),
                CUDA_ERROR_INVALID_CONTEXT,
                "the stand-in's answer, not 4242"
            );
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("interposer.c");
    let object = dir.path().join("libinterposer.so");
    std::fs::write(&source, INTERPOSER).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&object)
        .arg(&source)
        .status()
        .unwrap_or_else(|e| panic!("{cc} (needed to build the test interposer): {e}"));
    assert!(status.success(), "compiling the interposer failed");
    let preload = object.to_str().unwrap();
    let output = run_child(
        "a_preloaded_interposer_cannot_capture_the_library_s_own_lookups",
        &[("LD_PRELOAD", preload)],
    );
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
