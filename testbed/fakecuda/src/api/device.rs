//! Device management: `cuDevice*`.

use std::ffi::{c_char, c_int, c_uint};

use super::store;
use crate::abi::{CUdevice, CUuuid};
use crate::result::*;
use crate::state::with_driver;

/// `cuDeviceGet`: the handle of device `ordinal` (the ordinal itself).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    with_driver("cuDeviceGet", |d, _| {
        let found = d.device_get(ordinal)?;
        // Safety: `device` is null or writable per the API contract.
        unsafe { store(device, found) }
    })
}

/// `cuDeviceGetCount`: `VRAMTRACE_FAKE_DEVICES`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    with_driver("cuDeviceGetCount", |d, _| {
        // Safety: `count` is null or writable per the API contract.
        unsafe { store(count, d.device_count() as c_int) }
    })
}

/// `cuDeviceGetName`: `VRAMTRACE_FAKE_NAME`, cut to `len - 1` bytes and NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(
    name: *mut c_char,
    len: c_int,
    device: CUdevice,
) -> CUresult {
    with_driver("cuDeviceGetName", |d, _| {
        let text = d.device_name(device)?.as_bytes();
        if name.is_null() || len <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let n = text.len().min(len as usize - 1);
        // Safety: `name` is non-null and writable for `len` bytes per the API
        // contract; we write `n + 1 <= len` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), n);
            name.add(n).write(0);
        }
        Ok(())
    })
}

/// `cuDeviceTotalMem_v2`: `VRAMTRACE_FAKE_CAPACITY` for the device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CUdevice) -> CUresult {
    with_driver("cuDeviceTotalMem_v2", |d, _| {
        let total = d.device_total_mem(device)? as usize;
        // Safety: `bytes` is null or writable per the API contract.
        unsafe { store(bytes, total) }
    })
}

/// `cuDeviceGetAttribute`: a Hopper-class GPU (compute capability 9.0, 132
/// SMs, memory pools and virtual memory management supported).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attribute: c_uint,
    device: CUdevice,
) -> CUresult {
    with_driver("cuDeviceGetAttribute", |d, _| {
        let found = d.device_attribute(attribute, device)?;
        // Safety: `value` is null or writable per the API contract.
        unsafe { store(value, found) }
    })
}

/// `cuDeviceGetUuid`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, device: CUdevice) -> CUresult {
    with_driver("cuDeviceGetUuid", |d, _| {
        let bytes = d.device_uuid(device)?;
        // Safety: `uuid` is null or writable per the API contract.
        unsafe { store(uuid, CUuuid { bytes }) }
    })
}

/// `cuDeviceGetUuid_v2` (MIG-aware in the real driver; the same here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, device: CUdevice) -> CUresult {
    with_driver("cuDeviceGetUuid_v2", |d, _| {
        let bytes = d.device_uuid(device)?;
        // Safety: `uuid` is null or writable per the API contract.
        unsafe { store(uuid, CUuuid { bytes }) }
    })
}
