//! CUDA arrays: charged as width × max(height, 1) × max(depth, 1) × element
//! size × channels bytes.

use super::{handle, key, load, require, store};
use crate::abi::{CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR, Handle};
use crate::result::*;
use crate::state::with_driver;

/// `cuArrayCreate_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    array: *mut Handle,
    descriptor: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    with_driver("cuArrayCreate_v2", |d, stack| {
        require(array)?;
        // Safety: `descriptor` is null or readable per the API contract.
        let desc = unsafe { load(descriptor) }?;
        let extent = [desc.Width as u64, desc.Height as u64, 0];
        let created = d.array_create(stack, extent, desc.Format, desc.NumChannels)?;
        // Safety: `array` is non-null and writable per the API contract.
        unsafe { store(array, handle(created)) }
    })
}

/// `cuArray3DCreate_v2`: layered and cubemap arrays count `Depth` layers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    array: *mut Handle,
    descriptor: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    with_driver("cuArray3DCreate_v2", |d, stack| {
        require(array)?;
        // Safety: `descriptor` is null or readable per the API contract.
        let desc = unsafe { load(descriptor) }?;
        let extent = [desc.Width as u64, desc.Height as u64, desc.Depth as u64];
        let created = d.array_create(stack, extent, desc.Format, desc.NumChannels)?;
        // Safety: `array` is non-null and writable per the API contract.
        unsafe { store(array, handle(created)) }
    })
}

/// `cuArrayDestroy`: unknown handles give `CUDA_ERROR_INVALID_HANDLE`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(array: Handle) -> CUresult {
    with_driver("cuArrayDestroy", |d, _| d.array_destroy(key(array)))
}
