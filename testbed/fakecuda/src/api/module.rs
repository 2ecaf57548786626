//! Modules and kernel launches. The stand-in runs no code: these exist so
//! that a client that tries gets `CUDA_ERROR_NOT_SUPPORTED` instead of a
//! missing symbol (cudarc panics on a missing symbol).

use std::ffi::{c_char, c_uint, c_void};

use crate::abi::Handle;
use crate::result::*;
use crate::state::with_driver;

/// `cuModuleLoadData`: not supported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(_module: *mut Handle, _image: *const c_void) -> CUresult {
    with_driver("cuModuleLoadData", |_, _| Err(CUDA_ERROR_NOT_SUPPORTED))
}

/// `cuModuleUnload`: no module was ever loaded.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleUnload(_module: Handle) -> CUresult {
    with_driver("cuModuleUnload", |_, _| Err(CUDA_ERROR_INVALID_HANDLE))
}

/// `cuModuleGetFunction`: no module was ever loaded.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    _function: *mut Handle,
    _module: Handle,
    _name: *const c_char,
) -> CUresult {
    with_driver("cuModuleGetFunction", |_, _| Err(CUDA_ERROR_INVALID_HANDLE))
}

/// `cuLaunchKernel`: not supported.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    _function: Handle,
    _grid_x: c_uint,
    _grid_y: c_uint,
    _grid_z: c_uint,
    _block_x: c_uint,
    _block_y: c_uint,
    _block_z: c_uint,
    _shared_bytes: c_uint,
    _stream: Handle,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    with_driver("cuLaunchKernel", |_, _| Err(CUDA_ERROR_NOT_SUPPORTED))
}

/// `cuLaunchKernel_ptsz`: not supported.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    _function: Handle,
    _grid_x: c_uint,
    _grid_y: c_uint,
    _grid_z: c_uint,
    _block_x: c_uint,
    _block_y: c_uint,
    _block_z: c_uint,
    _shared_bytes: c_uint,
    _stream: Handle,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    with_driver("cuLaunchKernel_ptsz", |_, _| Err(CUDA_ERROR_NOT_SUPPORTED))
}
