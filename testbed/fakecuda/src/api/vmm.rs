//! Virtual memory management: `cuMemCreate` makes physical memory (counted),
//! `cuMemAddressReserve` address space (never counted), `cuMemMap` joins them.

use std::ffi::{c_int, c_uint, c_void};

use super::{load, require, store};
use crate::abi::{CUdeviceptr, CUmemAccessDesc, CUmemAllocationProp, CUmemGenericAllocationHandle};
use crate::result::*;
use crate::state::with_driver;

/// `cuMemGetAllocationGranularity`: 2 MiB, minimum and recommended.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: c_uint,
) -> CUresult {
    with_driver("cuMemGetAllocationGranularity", |d, _| {
        // Safety: `prop` is null or readable per the API contract.
        let prop = unsafe { load(prop) }?;
        let bytes = d.granularity(&prop, option)?;
        // Safety: `granularity` is null or writable per the API contract.
        unsafe { store(granularity, bytes as usize) }
    })
}

/// `cuMemCreate`: `size` must be a non-zero multiple of the granularity; the
/// bytes are charged to `prop.location.id` at once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    with_driver("cuMemCreate", |d, _| {
        require(handle)?;
        // Safety: `prop` is null or readable per the API contract.
        let prop = unsafe { load(prop) }?;
        let created = d.mem_create(size as u64, &prop, flags)?;
        // Safety: `handle` is non-null and writable per the API contract.
        unsafe { store(handle, created) }
    })
}

/// `cuMemRelease`: the memory is returned when its last mapping goes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    with_driver("cuMemRelease", |d, _| d.mem_release(handle))
}

/// `cuMemExportToShareableHandle`: `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` only; writes a
/// new descriptor into `*shareable_handle` (an `int`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable_handle: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handle_type: c_uint,
    flags: u64,
) -> CUresult {
    with_driver("cuMemExportToShareableHandle", |d, _| {
        require(shareable_handle)?;
        let fd = d.export_handle(handle, handle_type, flags)?;
        // Safety: non-null and, for a descriptor, an `int` per the API contract.
        unsafe { store(shareable_handle as *mut c_int, fd) }
    })
}

/// `cuMemImportFromShareableHandle`: `os_handle` is the descriptor itself, cast to a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    handle_type: c_uint,
) -> CUresult {
    with_driver("cuMemImportFromShareableHandle", |d, _| {
        require(handle)?;
        let imported = d.import_handle(os_handle as usize as c_int, handle_type)?;
        // Safety: `handle` is non-null and writable per the API contract.
        unsafe { store(handle, imported) }
    })
}

/// `cuMemRetainAllocationHandle`: the handle mapped at `addr`, one more reference.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    with_driver("cuMemRetainAllocationHandle", |d, _| {
        require(handle)?;
        let retained = d.retain_handle(addr as usize as u64)?;
        // Safety: `handle` is non-null and writable per the API contract.
        unsafe { store(handle, retained) }
    })
}

/// `cuMemAddressReserve`: address space only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    with_driver("cuMemAddressReserve", |d, stack| {
        require(ptr)?;
        let reserved = d.address_reserve(stack, size as u64, alignment as u64, addr, flags)?;
        // Safety: `ptr` is non-null and writable per the API contract.
        unsafe { store(ptr, reserved) }
    })
}

/// `cuMemAddressFree`: the size must be the one reserved, and nothing may be mapped.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    with_driver("cuMemAddressFree", |d, _| d.address_free(ptr, size as u64))
}

/// `cuMemMap`: inside one reservation, granularity-aligned, not overlapping
/// another mapping. Counts nothing: the memory was counted by `cuMemCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    with_driver("cuMemMap", |d, _| {
        d.mem_map(ptr, size as u64, offset as u64, handle, flags)
    })
}

/// `cuMemUnmap`: the range must consist of whole mappings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    with_driver("cuMemUnmap", |d, _| d.mem_unmap(ptr, size as u64))
}

/// `cuMemSetAccess`: validates the mapped range and the descriptors.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    with_driver("cuMemSetAccess", |d, _| {
        if desc.is_null() || count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Safety: `desc` is non-null and points to `count` descriptors per the API contract.
        let descriptors = unsafe { std::slice::from_raw_parts(desc, count) };
        d.set_access(ptr, size as u64, descriptors)
    })
}
