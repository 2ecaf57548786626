//! The exported wrappers: thin shims that call the real driver function first, pass its result
//! through unchanged, and hand the operands to one recorder function per family
//! ([`Call::alloc`], [`Call::free`], [`Call::map`], [`Call::unmap`]).
//!
//! The same functions are what `dlsym` and `cuGetProcAddress` hand out (see
//! [`crate::routing`], which sits above this module), and the plain exports serve programs
//! linked to libcuda directly. Each reads its real function from [`crate::driver`].

#![allow(non_snake_case)]

use core::ffi::{c_uint, c_ulonglong, c_void};

use vramtrace_format::MemKind;

use crate::driver::{ENTRIES, Entry, real_or_return};
use crate::ffi::*;
use crate::recorder::{Call, Dev, Op};

fn op(entry: Entry, mem: MemKind) -> Op {
    Op::new(ENTRIES[entry as usize].api, mem)
}

/// Reads an out-parameter the driver filled; 0 when the call failed or the pointer is null.
///
/// # Safety
/// When `result` is success, `p` is null or points at a value the driver wrote.
unsafe fn out<T: Copy>(result: CuResult, p: *const T, to_u64: impl Fn(T) -> u64) -> u64 {
    if result != CUDA_SUCCESS || p.is_null() {
        0
    } else {
        // Safety: guaranteed by the caller.
        to_u64(unsafe { p.read() })
    }
}

fn id(v: u64) -> u64 {
    v
}

fn addr<T>(p: *mut T) -> u64 {
    p as usize as u64
}

// ---- device memory ----------------------------------------------------------------------

/// `cuMemAlloc_v2`: device memory.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CuDevicePtr, bytesize: usize) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(MemAllocV2 as FnMemAlloc);
    // Safety: arguments passed through unchanged to the function with this signature.
    let r = unsafe { real(dptr, bytesize) };
    if let Some(c) = call {
        // Safety: on success the driver wrote *dptr.
        let ptr = unsafe { out(r, dptr, id) };
        let size = bytesize as u64;
        c.alloc(
            r,
            Op {
                ptr,
                size,
                ..op(Entry::MemAllocV2, MemKind::Device)
            },
        );
    }
    r
}

/// `cuMemAllocPitch_v2`: size recorded as pitch × height (the bytes obtained), pitch in `aux`;
/// on failure, width × height.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CuDevicePtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(MemAllocPitchV2 as FnMemAllocPitch);
    // Safety: arguments passed through unchanged.
    let r = unsafe { real(dptr, pitch, width, height, element_size) };
    if let Some(c) = call {
        // Safety: on success the driver wrote *dptr and *pitch.
        let (ptr, p) = unsafe { (out(r, dptr, id), out(r, pitch, |v| v as u64)) };
        let rows = height as u64;
        let size = if r == CUDA_SUCCESS {
            p * rows
        } else {
            width as u64 * rows
        };
        c.alloc(
            r,
            Op {
                ptr,
                size,
                aux: p,
                ..op(Entry::MemAllocPitchV2, MemKind::Device)
            },
        );
    }
    r
}

/// `cuMemAllocManaged`: unified memory, flags in `aux`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    flags: c_uint,
) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(MemAllocManaged as FnMemAllocManaged);
    // Safety: arguments passed through unchanged.
    let r = unsafe { real(dptr, bytesize, flags) };
    if let Some(c) = call {
        // Safety: on success the driver wrote *dptr.
        let ptr = unsafe { out(r, dptr, id) };
        let (size, aux) = (bytesize as u64, flags as u64);
        c.alloc(
            r,
            Op {
                ptr,
                size,
                aux,
                ..op(Entry::MemAllocManaged, MemKind::Managed)
            },
        );
    }
    r
}

fn alloc_async(
    entry: Entry,
    real: FnMemAllocAsync,
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    stream: CuHandle,
) -> CuResult {
    let call = Call::begin();
    // Safety: arguments passed through unchanged to the entry's real function.
    let r = unsafe { real(dptr, bytesize, stream) };
    if let Some(c) = call {
        // Safety: on success the driver wrote *dptr.
        let ptr = unsafe { out(r, dptr, id) };
        let (size, stream) = (bytesize as u64, addr(stream));
        c.alloc(
            r,
            Op {
                ptr,
                size,
                stream,
                ..op(entry, MemKind::Device)
            },
        );
    }
    r
}

/// `cuMemAllocAsync`: stream-ordered device memory.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    stream: CuHandle,
) -> CuResult {
    let real = real_or_return!(MemAllocAsync as FnMemAllocAsync);
    alloc_async(Entry::MemAllocAsync, real, dptr, bytesize, stream)
}

/// `cuMemAllocAsync_ptsz`: the per-thread-default-stream twin.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    stream: CuHandle,
) -> CuResult {
    let real = real_or_return!(MemAllocAsyncPtsz as FnMemAllocAsync);
    alloc_async(Entry::MemAllocAsyncPtsz, real, dptr, bytesize, stream)
}

fn alloc_from_pool(
    entry: Entry,
    real: FnMemAllocFromPoolAsync,
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    pool: CuHandle,
    stream: CuHandle,
) -> CuResult {
    let call = Call::begin();
    // Safety: arguments passed through unchanged to the entry's real function.
    let r = unsafe { real(dptr, bytesize, pool, stream) };
    if let Some(c) = call {
        // Safety: on success the driver wrote *dptr.
        let ptr = unsafe { out(r, dptr, id) };
        let (size, stream, aux) = (bytesize as u64, addr(stream), addr(pool));
        c.alloc(
            r,
            Op {
                ptr,
                size,
                stream,
                aux,
                ..op(entry, MemKind::Device)
            },
        );
    }
    r
}

/// `cuMemAllocFromPoolAsync`: pool in `aux`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    pool: CuHandle,
    stream: CuHandle,
) -> CuResult {
    let real = real_or_return!(MemAllocFromPoolAsync as FnMemAllocFromPoolAsync);
    alloc_from_pool(
        Entry::MemAllocFromPoolAsync,
        real,
        dptr,
        bytesize,
        pool,
        stream,
    )
}

/// `cuMemAllocFromPoolAsync_ptsz`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CuDevicePtr,
    bytesize: usize,
    pool: CuHandle,
    stream: CuHandle,
) -> CuResult {
    let real = real_or_return!(MemAllocFromPoolAsyncPtsz as FnMemAllocFromPoolAsync);
    alloc_from_pool(
        Entry::MemAllocFromPoolAsyncPtsz,
        real,
        dptr,
        bytesize,
        pool,
        stream,
    )
}

/// `cuMemFree_v2`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CuDevicePtr) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(MemFreeV2 as FnMemFree);
    // Safety: argument passed through unchanged.
    let r = unsafe { real(dptr) };
    if let Some(c) = call {
        c.free(
            r,
            Op {
                ptr: dptr,
                ..op(Entry::MemFreeV2, MemKind::Device)
            },
        );
    }
    r
}

fn free_async(entry: Entry, real: FnMemFreeAsync, dptr: CuDevicePtr, stream: CuHandle) -> CuResult {
    let call = Call::begin();
    // Safety: arguments passed through unchanged to the entry's real function.
    let r = unsafe { real(dptr, stream) };
    if let Some(c) = call {
        c.free(
            r,
            Op {
                ptr: dptr,
                stream: addr(stream),
                ..op(entry, MemKind::Device)
            },
        );
    }
    r
}

/// `cuMemFreeAsync`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CuDevicePtr, stream: CuHandle) -> CuResult {
    let real = real_or_return!(MemFreeAsync as FnMemFreeAsync);
    free_async(Entry::MemFreeAsync, real, dptr, stream)
}

/// `cuMemFreeAsync_ptsz`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CuDevicePtr, stream: CuHandle) -> CuResult {
    let real = real_or_return!(MemFreeAsyncPtsz as FnMemFreeAsync);
    free_async(Entry::MemFreeAsyncPtsz, real, dptr, stream)
}

// ---- virtual memory management ----------------------------------------------------------

/// `cuMemCreate`: physical memory behind a handle; the device is the allocation's location
/// (host-located handles are host memory, device -1).
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CuMemHandle,
    size: usize,
    prop: *const CuMemAllocationPropPrefix,
    flags: c_ulonglong,
) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(MemCreate as FnMemCreate);
    // Safety: arguments passed through unchanged.
    let r = unsafe { real(handle, size, prop, flags) };
    if let Some(c) = call {
        // Safety: on success the driver wrote *handle.
        let ptr = unsafe { out(r, handle, id) };
        let (mem, device) = if prop.is_null() {
            (MemKind::Device, Dev::Current)
        } else {
            // Safety: `prop` is the caller's CUmemAllocationProp, which begins with these fields.
            let p = unsafe { &*prop };
            if p.location_type == CU_MEM_LOCATION_TYPE_DEVICE {
                (MemKind::Device, Dev::Known(p.location_id))
            } else {
                (MemKind::Host, Dev::Known(-1))
            }
        };
        c.alloc(
            r,
            Op {
                ptr,
                size: size as u64,
                device,
                ..op(Entry::MemCreate, mem)
            },
        );
    }
    r
}

/// `cuMemRelease`: the handle in `ptr`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: CuMemHandle) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(MemRelease as FnMemRelease);
    // Safety: argument passed through unchanged.
    let r = unsafe { real(handle) };
    if let Some(c) = call {
        c.free(
            r,
            Op {
                ptr: handle,
                ..op(Entry::MemRelease, MemKind::Device)
            },
        );
    }
    r
}

/// `cuMemImportFromShareableHandle`: a handle to physical memory another process (or this one)
/// exported. It is an acquisition in the handle namespace, so the `cuMemRelease` of the
/// imported handle pairs with it, but the memory is not this process's allocation: kind
/// [`MemKind::Imported`], size 0 (the call does not say; the reader takes what the handle is
/// mapped as), the shareable handle (a file descriptor's number, or the address of an opaque
/// one) in `aux`, the handle type in `stream`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut CuMemHandle,
    os_handle: *mut c_void,
    handle_type: c_uint,
) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(MemImportFromShareableHandle as FnMemImportFromShareableHandle);
    // Safety: arguments passed through unchanged.
    let r = unsafe { real(handle, os_handle, handle_type) };
    if let Some(c) = call {
        // Safety: on success the driver wrote *handle.
        let ptr = unsafe { out(r, handle, id) };
        c.alloc(
            r,
            Op {
                ptr,
                aux: addr(os_handle),
                stream: handle_type as u64,
                ..op(Entry::MemImportFromShareableHandle, MemKind::Imported)
            },
        );
    }
    r
}

/// `cuMemRetainAllocationHandle`: one more reference to the handle mapped at `addr` (in
/// `aux`), released by its own `cuMemRelease`. Recorded as an acquisition of kind
/// [`MemKind::Imported`] with size 0: the reader counts it as a reference to the handle it
/// already knows (no new bytes), or as a handle obtained elsewhere if it knows none.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CuMemHandle,
    addr_: *mut c_void,
) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(MemRetainAllocationHandle as FnMemRetainAllocationHandle);
    // Safety: arguments passed through unchanged.
    let r = unsafe { real(handle, addr_) };
    if let Some(c) = call {
        // Safety: on success the driver wrote *handle.
        let ptr = unsafe { out(r, handle, id) };
        c.alloc(
            r,
            Op {
                ptr,
                aux: addr(addr_),
                ..op(Entry::MemRetainAllocationHandle, MemKind::Imported)
            },
        );
    }
    r
}

/// `cuMemMap`: the mapped range, the physical handle in `aux`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: CuDevicePtr,
    size: usize,
    offset: usize,
    handle: CuMemHandle,
    flags: c_ulonglong,
) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(MemMap as FnMemMap);
    // Safety: arguments passed through unchanged.
    let r = unsafe { real(ptr, size, offset, handle, flags) };
    if let Some(c) = call {
        let (size, aux) = (size as u64, handle);
        c.map(
            r,
            Op {
                ptr,
                size,
                aux,
                ..op(Entry::MemMap, MemKind::Mapping)
            },
        );
    }
    r
}

/// `cuMemUnmap`: size 0 like every release, the range's size in `aux`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: CuDevicePtr, size: usize) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(MemUnmap as FnMemUnmap);
    // Safety: arguments passed through unchanged.
    let r = unsafe { real(ptr, size) };
    if let Some(c) = call {
        c.unmap(
            r,
            Op {
                ptr,
                aux: size as u64,
                ..op(Entry::MemUnmap, MemKind::Mapping)
            },
        );
    }
    r
}

/// `cuMemAddressReserve`: address space only, the alignment in `aux`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CuDevicePtr,
    size: usize,
    alignment: usize,
    addr_hint: CuDevicePtr,
    flags: c_ulonglong,
) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(MemAddressReserve as FnMemAddressReserve);
    // Safety: arguments passed through unchanged.
    let r = unsafe { real(ptr, size, alignment, addr_hint, flags) };
    if let Some(c) = call {
        // Safety: on success the driver wrote *ptr.
        let p = unsafe { out(r, ptr, id) };
        let (size, aux) = (size as u64, alignment as u64);
        c.alloc(
            r,
            Op {
                ptr: p,
                size,
                aux,
                ..op(Entry::MemAddressReserve, MemKind::Address)
            },
        );
    }
    r
}

/// `cuMemAddressFree`: the range's size in `aux`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CuDevicePtr, size: usize) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(MemAddressFree as FnMemAddressFree);
    // Safety: arguments passed through unchanged.
    let r = unsafe { real(ptr, size) };
    if let Some(c) = call {
        c.free(
            r,
            Op {
                ptr,
                aux: size as u64,
                ..op(Entry::MemAddressFree, MemKind::Address)
            },
        );
    }
    r
}

// ---- pinned host memory -----------------------------------------------------------------

/// `cuMemAllocHost_v2`: page-locked host memory, device -1.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(MemAllocHostV2 as FnMemAllocHost);
    // Safety: arguments passed through unchanged.
    let r = unsafe { real(pp, bytesize) };
    if let Some(c) = call {
        // Safety: on success the driver wrote *pp.
        let ptr = unsafe { out(r, pp, addr) };
        c.alloc(
            r,
            Op {
                ptr,
                size: bytesize as u64,
                ..op(Entry::MemAllocHostV2, MemKind::Host)
            },
        );
    }
    r
}

/// `cuMemHostAlloc`: page-locked host memory, its flags in `aux`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytesize: usize,
    flags: c_uint,
) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(MemHostAlloc as FnMemHostAlloc);
    // Safety: arguments passed through unchanged.
    let r = unsafe { real(pp, bytesize, flags) };
    if let Some(c) = call {
        // Safety: on success the driver wrote *pp.
        let ptr = unsafe { out(r, pp, addr) };
        let (size, aux) = (bytesize as u64, flags as u64);
        c.alloc(
            r,
            Op {
                ptr,
                size,
                aux,
                ..op(Entry::MemHostAlloc, MemKind::Host)
            },
        );
    }
    r
}

/// `cuMemFreeHost`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(MemFreeHost as FnMemFreeHost);
    // Safety: argument passed through unchanged.
    let r = unsafe { real(p) };
    if let Some(c) = call {
        c.free(
            r,
            Op {
                ptr: addr(p),
                ..op(Entry::MemFreeHost, MemKind::Host)
            },
        );
    }
    r
}

// ---- arrays -----------------------------------------------------------------------------

/// Records an array creation: the handle in `ptr`, the descriptor's estimated bytes in `size`.
fn array_created(call: Option<Call>, entry: Entry, r: CuResult, handle: *mut CuHandle, bytes: u64) {
    if let Some(c) = call {
        // Safety: on success the driver wrote *handle.
        let ptr = unsafe { out(r, handle, addr) };
        c.alloc(
            r,
            Op {
                ptr,
                size: bytes,
                ..op(entry, MemKind::Array)
            },
        );
    }
}

/// `cuArrayCreate_v2`: size estimated from the descriptor (`CuArrayDescriptor::bytes`).
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    handle: *mut CuHandle,
    desc: *const CuArrayDescriptor,
) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(ArrayCreateV2 as FnArrayCreate);
    // Safety: arguments passed through unchanged.
    let r = unsafe { real(handle, desc) };
    // Safety: the caller's descriptor (or null), valid for the call.
    let bytes = unsafe { desc.as_ref() }.map_or(0, CuArrayDescriptor::bytes);
    array_created(call, Entry::ArrayCreateV2, r, handle, bytes);
    r
}

/// `cuArray3DCreate_v2`: as [`cuArrayCreate_v2`], times depth (or layers).
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    handle: *mut CuHandle,
    desc: *const CuArray3dDescriptor,
) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(Array3dCreateV2 as FnArray3dCreate);
    // Safety: arguments passed through unchanged.
    let r = unsafe { real(handle, desc) };
    // Safety: the caller's descriptor (or null), valid for the call.
    let bytes = unsafe { desc.as_ref() }.map_or(0, CuArray3dDescriptor::bytes);
    array_created(call, Entry::Array3dCreateV2, r, handle, bytes);
    r
}

/// `cuArrayDestroy`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(handle: CuHandle) -> CuResult {
    let call = Call::begin();
    let real = real_or_return!(ArrayDestroy as FnArrayDestroy);
    // Safety: argument passed through unchanged.
    let r = unsafe { real(handle) };
    if let Some(c) = call {
        c.free(
            r,
            Op {
                ptr: addr(handle),
                ..op(Entry::ArrayDestroy, MemKind::Array)
            },
        );
    }
    r
}
