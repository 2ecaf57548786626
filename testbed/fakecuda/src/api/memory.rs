//! Device memory, pinned host memory and pointer queries.
//!
//! Device allocations are fake addresses charged against the device's
//! capacity; pinned host memory is real memory, tracked apart.

use std::ffi::{c_uint, c_void};

use super::{handle, require, store, stream_key};
use crate::abi::{CUdeviceptr, Handle};
use crate::driver::PointerValue;
use crate::result::*;
use crate::state::with_driver;

/// `cuMemAlloc_v2`: `CUDA_ERROR_OUT_OF_MEMORY` once the device's capacity would be exceeded.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    with_driver("cuMemAlloc_v2", |d, stack| {
        require(dptr)?;
        let ptr = d.mem_alloc(stack, bytesize as u64)?;
        // Safety: `dptr` is non-null and writable per the API contract.
        unsafe { store(dptr, ptr) }
    })
}

/// `cuMemAllocPitch_v2`: rows padded to 512 bytes; pitch × height bytes are charged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width_bytes: usize,
    height: usize,
    element_bytes: c_uint,
) -> CUresult {
    with_driver("cuMemAllocPitch_v2", |d, stack| {
        require(dptr)?;
        require(pitch)?;
        let (ptr, row) =
            d.mem_alloc_pitch(stack, width_bytes as u64, height as u64, element_bytes)?;
        // Safety: both pointers are non-null and writable per the API contract.
        unsafe {
            store(dptr, ptr)?;
            store(pitch, row as usize)
        }
    })
}

/// `cuMemAllocManaged`: counted against the current context's device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    with_driver("cuMemAllocManaged", |d, stack| {
        require(dptr)?;
        let ptr = d.mem_alloc_managed(stack, bytesize as u64, flags)?;
        // Safety: `dptr` is non-null and writable per the API contract.
        unsafe { store(dptr, ptr) }
    })
}

/// Shared body of `cuMemAllocAsync` and its `_ptsz` twin.
fn alloc_async(
    api: &'static str,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: u64,
) -> CUresult {
    with_driver(api, |d, stack| {
        require(dptr)?;
        let ptr = d.mem_alloc_async(stack, bytesize as u64, stream)?;
        // Safety: `dptr` is non-null and writable per the API contract.
        unsafe { store(dptr, ptr) }
    })
}

/// `cuMemAllocAsync`: from the device's current memory pool, available at once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: Handle,
) -> CUresult {
    alloc_async("cuMemAllocAsync", dptr, bytesize, stream_key(stream, false))
}

/// `cuMemAllocAsync_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: Handle,
) -> CUresult {
    alloc_async(
        "cuMemAllocAsync_ptsz",
        dptr,
        bytesize,
        stream_key(stream, true),
    )
}

/// Shared body of `cuMemAllocFromPoolAsync` and its `_ptsz` twin.
fn alloc_from_pool(
    api: &'static str,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: Handle,
    stream: u64,
) -> CUresult {
    with_driver(api, |d, stack| {
        require(dptr)?;
        let ptr = d.mem_alloc_from_pool(stack, bytesize as u64, super::key(pool), stream)?;
        // Safety: `dptr` is non-null and writable per the API contract.
        unsafe { store(dptr, ptr) }
    })
}

/// `cuMemAllocFromPoolAsync`: from `pool`, on the pool's device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: Handle,
    stream: Handle,
) -> CUresult {
    alloc_from_pool(
        "cuMemAllocFromPoolAsync",
        dptr,
        bytesize,
        pool,
        stream_key(stream, false),
    )
}

/// `cuMemAllocFromPoolAsync_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: Handle,
    stream: Handle,
) -> CUresult {
    alloc_from_pool(
        "cuMemAllocFromPoolAsync_ptsz",
        dptr,
        bytesize,
        pool,
        stream_key(stream, true),
    )
}

/// `cuMemFree_v2`: any linear allocation by its base address; unknown
/// addresses and double frees give `CUDA_ERROR_INVALID_VALUE`; 0 is a no-op.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    with_driver("cuMemFree_v2", |d, _| d.mem_free(dptr))
}

/// `cuMemFreeAsync`: frees at once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: Handle) -> CUresult {
    with_driver("cuMemFreeAsync", |d, _| {
        d.mem_free_async(dptr, stream_key(stream, false))
    })
}

/// `cuMemFreeAsync_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: Handle) -> CUresult {
    with_driver("cuMemFreeAsync_ptsz", |d, _| {
        d.mem_free_async(dptr, stream_key(stream, true))
    })
}

/// `cuMemGetInfo_v2`: free = capacity − physical bytes in use on the current context's device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    with_driver("cuMemGetInfo_v2", |d, stack| {
        let (free_bytes, total_bytes) = d.mem_get_info(stack)?;
        require(free)?;
        // Safety: both pointers are null-checked by `store` and writable per the API contract.
        unsafe {
            store(free, free_bytes as usize)?;
            store(total, total_bytes as usize)
        }
    })
}

/// `cuMemGetAddressRange_v2`: base and size of the allocation or mapping containing `dptr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    with_driver("cuMemGetAddressRange_v2", |d, _| {
        let (start, bytes) = d.address_range(dptr)?;
        // Safety: each pointer is null (skipped, as the API allows) or writable.
        unsafe {
            if !base.is_null() {
                store(base, start)?;
            }
            if !size.is_null() {
                store(size, bytes as usize)?;
            }
        }
        Ok(())
    })
}

/// Shared body of the pinned host allocators.
fn host_alloc(api: &'static str, pp: *mut *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    with_driver(api, |d, stack| {
        require(pp)?;
        let ptr = d.host_alloc(stack, bytesize as u64, flags)?;
        // Safety: `pp` is non-null and writable per the API contract.
        unsafe { store(pp, handle(ptr)) }
    })
}

/// `cuMemAllocHost_v2`: real, page-aligned host memory; not device memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CUresult {
    host_alloc("cuMemAllocHost_v2", pp, bytesize, 0)
}

/// `cuMemHostAlloc`: flags `PORTABLE`, `DEVICEMAP`, `WRITECOMBINED` accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    host_alloc("cuMemHostAlloc", pp, bytesize, flags)
}

/// `cuMemFreeHost`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    with_driver("cuMemFreeHost", |d, _| d.host_free(p as u64))
}

/// `cuMemHostGetDevicePointer_v2`: with unified addressing, the host address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    pdptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    with_driver("cuMemHostGetDevicePointer_v2", |d, _| {
        let ptr = d.host_device_pointer(p as u64, flags)?;
        // Safety: `pdptr` is null or writable per the API contract.
        unsafe { store(pdptr, ptr) }
    })
}

/// `cuPointerGetAttribute`: context, memory type, device/host pointer, buffer
/// id, managed, device ordinal, range start and size, mapped, memory pool.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_uint,
    ptr: CUdeviceptr,
) -> CUresult {
    with_driver("cuPointerGetAttribute", |d, _| {
        let value = d.pointer_attribute(ptr, attribute)?;
        // Safety: `data` is null or points to the attribute's C type per the API contract.
        unsafe {
            match value {
                PointerValue::Address(v) => store(data.cast::<u64>(), v),
                PointerValue::U32(v) => store(data.cast::<u32>(), v),
                PointerValue::I32(v) => store(data.cast::<i32>(), v),
                PointerValue::U64(v) => store(data.cast::<u64>(), v),
                PointerValue::Bool(v) => store(data.cast::<bool>(), v),
            }
        }
    })
}
