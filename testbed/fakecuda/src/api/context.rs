//! Primary contexts and contexts: `cuDevicePrimaryCtx*`, `cuCtx*`.
//! The context stack is per thread; `cuCtxGetCurrent` and `cuCtxGetDevice` read it
//! without the process-wide lock (`state::current_context`, `state::current_device`).

use std::ffi::{c_int, c_uint};

use super::{handle, key, load, require, store};
use crate::abi::{CUctxCreateParams, CUdevice, Handle};
use crate::result::*;
use crate::state::{self, with_driver};

/// `cuDevicePrimaryCtxRetain`: the device's primary context, one reference more.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(
    context: *mut Handle,
    device: CUdevice,
) -> CUresult {
    with_driver("cuDevicePrimaryCtxRetain", |d, _| {
        require(context)?;
        let primary = d.primary_retain(device)?;
        // Safety: `context` is non-null and writable per the API contract.
        unsafe { store(context, handle(primary)) }
    })
}

/// `cuDevicePrimaryCtxRelease` (CUDA 7.0 name; same behaviour as `_v2`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(device: CUdevice) -> CUresult {
    with_driver("cuDevicePrimaryCtxRelease", |d, _| {
        d.primary_release(device)
    })
}

/// `cuDevicePrimaryCtxRelease_v2`: the last release destroys the context's
/// streams, events and allocations.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(device: CUdevice) -> CUresult {
    with_driver("cuDevicePrimaryCtxRelease_v2", |d, _| {
        d.primary_release(device)
    })
}

/// `cuDevicePrimaryCtxGetState`: flags and whether the primary context is active.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    device: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    with_driver("cuDevicePrimaryCtxGetState", |d, _| {
        let (current_flags, is_active) = d.primary_state(device)?;
        require(active)?;
        // Safety: both pointers are null or writable per the API contract.
        unsafe {
            store(flags, current_flags)?;
            store(active, c_int::from(is_active))
        }
    })
}

/// `cuDevicePrimaryCtxSetFlags` (CUDA 7.0 name).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags(device: CUdevice, flags: c_uint) -> CUresult {
    with_driver("cuDevicePrimaryCtxSetFlags", |d, _| {
        d.primary_set_flags(device, flags)
    })
}

/// `cuDevicePrimaryCtxSetFlags_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags_v2(
    device: CUdevice,
    flags: c_uint,
) -> CUresult {
    with_driver("cuDevicePrimaryCtxSetFlags_v2", |d, _| {
        d.primary_set_flags(device, flags)
    })
}

/// `cuDevicePrimaryCtxReset` (CUDA 7.0 name).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(device: CUdevice) -> CUresult {
    with_driver("cuDevicePrimaryCtxReset", |d, _| d.primary_reset(device))
}

/// `cuDevicePrimaryCtxReset_v2`: destroys everything made in the primary context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(device: CUdevice) -> CUresult {
    with_driver("cuDevicePrimaryCtxReset_v2", |d, _| d.primary_reset(device))
}

/// `cuCtxCreate_v2`: a new context, made current.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    context: *mut Handle,
    flags: c_uint,
    device: CUdevice,
) -> CUresult {
    with_driver("cuCtxCreate_v2", |d, stack| {
        require(context)?;
        let created = d.context_create(stack, flags, device)?;
        // Safety: `context` is non-null and writable per the API contract.
        unsafe { store(context, handle(created)) }
    })
}

/// `cuCtxCreate_v3`: as `_v2`; execution-affinity parameters are accepted and ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    context: *mut Handle,
    _params: Handle,
    params_count: c_int,
    flags: c_uint,
    device: CUdevice,
) -> CUresult {
    with_driver("cuCtxCreate_v3", |d, stack| {
        require(context)?;
        if params_count < 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let created = d.context_create(stack, flags, device)?;
        // Safety: `context` is non-null and writable per the API contract.
        unsafe { store(context, handle(created)) }
    })
}

/// `cuCtxCreate_v4`: as `_v2`; CUDA-in-graphics parameters are not supported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    context: *mut Handle,
    params: *const CUctxCreateParams,
    flags: c_uint,
    device: CUdevice,
) -> CUresult {
    with_driver("cuCtxCreate_v4", |d, stack| {
        require(context)?;
        if !params.is_null() {
            // Safety: non-null and readable per the API contract.
            let params = unsafe { load(params) }?;
            if !params.cigParams.is_null() {
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
        }
        let created = d.context_create(stack, flags, device)?;
        // Safety: `context` is non-null and writable per the API contract.
        unsafe { store(context, handle(created)) }
    })
}

/// `cuCtxDestroy` (CUDA 2.0 name).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy(context: Handle) -> CUresult {
    with_driver("cuCtxDestroy", |d, stack| {
        d.context_destroy(stack, key(context))
    })
}

/// `cuCtxDestroy_v2`: destroys a non-primary context and everything made in it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(context: Handle) -> CUresult {
    with_driver("cuCtxDestroy_v2", |d, stack| {
        d.context_destroy(stack, key(context))
    })
}

/// `cuCtxSetCurrent`: replaces the top of this thread's stack; null pops it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetCurrent(context: Handle) -> CUresult {
    with_driver("cuCtxSetCurrent", |d, stack| {
        d.set_current(stack, key(context))
    })
}

/// `cuCtxGetCurrent`: the top of this thread's stack, or null.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(context: *mut Handle) -> CUresult {
    if !context.is_null()
        && let Some(top) = state::current_context()
    {
        // Safety: `context` is non-null and writable per the API contract.
        unsafe { context.write(handle(top)) };
        return CUDA_SUCCESS;
    }
    with_driver("cuCtxGetCurrent", |_, stack| {
        let top = stack.last().copied().unwrap_or(0);
        // Safety: `context` is null or writable per the API contract.
        unsafe { store(context, handle(top)) }
    })
}

/// `cuCtxGetDevice`: the current context's device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    if !device.is_null()
        && let Some(ordinal) = state::current_device()
    {
        // Safety: `device` is non-null and writable per the API contract.
        unsafe { device.write(ordinal as CUdevice) };
        return CUDA_SUCCESS;
    }
    with_driver("cuCtxGetDevice", |d, stack| {
        let (_, ordinal) = state::checked_current(d, stack)?;
        // Safety: `device` is null or writable per the API contract.
        unsafe { store(device, ordinal as CUdevice) }
    })
}

/// `cuCtxGetDevice_v2` (CUDA 13.0): the device of `context`, or of the current one when null.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice_v2(device: *mut CUdevice, context: Handle) -> CUresult {
    with_driver("cuCtxGetDevice_v2", |d, stack| {
        let ordinal = match key(context) {
            0 => d.current(stack)?.1,
            context => d.context_device(context)?,
        };
        // Safety: `device` is null or writable per the API contract.
        unsafe { store(device, ordinal as CUdevice) }
    })
}

/// `cuCtxPushCurrent` (CUDA 2.0 name).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPushCurrent(context: Handle) -> CUresult {
    with_driver("cuCtxPushCurrent", |d, stack| {
        d.push_current(stack, key(context))
    })
}

/// `cuCtxPushCurrent_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(context: Handle) -> CUresult {
    with_driver("cuCtxPushCurrent_v2", |d, stack| {
        d.push_current(stack, key(context))
    })
}

/// Shared body of the two `cuCtxPopCurrent`s; `context` may be null.
fn pop_current(api: &'static str, context: *mut Handle) -> CUresult {
    with_driver(api, |d, stack| {
        let popped = d.pop_current(stack)?;
        if !context.is_null() {
            // Safety: non-null and writable per the API contract.
            unsafe { store(context, handle(popped)) }?;
        }
        Ok(())
    })
}

/// `cuCtxPopCurrent` (CUDA 2.0 name).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent(context: *mut Handle) -> CUresult {
    pop_current("cuCtxPopCurrent", context)
}

/// `cuCtxPopCurrent_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(context: *mut Handle) -> CUresult {
    pop_current("cuCtxPopCurrent_v2", context)
}

/// `cuCtxSynchronize`: nothing is ever pending; checks the current context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    with_driver("cuCtxSynchronize", |d, stack| d.synchronize(stack, 0))
}

/// `cuCtxSynchronize_v2` (CUDA 13.0): `context`, or the current one when null.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize_v2(context: Handle) -> CUresult {
    with_driver("cuCtxSynchronize_v2", |d, stack| {
        d.synchronize(stack, key(context))
    })
}

/// `cuCtxGetFlags`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    with_driver("cuCtxGetFlags", |d, stack| {
        let current = d.context_flags(stack)?;
        // Safety: `flags` is null or writable per the API contract.
        unsafe { store(flags, current) }
    })
}

/// `cuCtxSetFlags`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetFlags(flags: c_uint) -> CUresult {
    with_driver("cuCtxSetFlags", |d, stack| {
        d.set_context_flags(stack, flags)
    })
}

/// `cuCtxGetLimit`: stored per context; limits 0–6 exist.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, limit: c_uint) -> CUresult {
    with_driver("cuCtxGetLimit", |d, stack| {
        let current = d.limit(stack, limit)?;
        // Safety: `value` is null or writable per the API contract.
        unsafe { store(value, current as usize) }
    })
}

/// `cuCtxSetLimit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetLimit(limit: c_uint, value: usize) -> CUresult {
    with_driver("cuCtxSetLimit", |d, stack| {
        d.set_limit(stack, limit, value as u64)
    })
}

/// `cuCtxGetStreamPriorityRange`: least 0, greatest -5; either pointer may be null.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    with_driver("cuCtxGetStreamPriorityRange", |d, stack| {
        let (l, g) = d.stream_priority_range(stack)?;
        // Safety: each pointer is null (skipped) or writable per the API contract.
        unsafe {
            if !least.is_null() {
                store(least, l)?;
            }
            if !greatest.is_null() {
                store(greatest, g)?;
            }
        }
        Ok(())
    })
}
