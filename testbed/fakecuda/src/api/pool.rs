//! Stream-ordered memory pools. Freed memory goes straight back to the
//! device (nothing is cached), so a pool's reserved memory equals its used memory.

use std::ffi::{c_int, c_uint, c_void};

use super::{handle, key, load, require, store};
use crate::abi::{CUdevice, CUmemPoolProps, Handle};
use crate::driver::{PoolValue, pool_attribute_is_int};
use crate::result::*;
use crate::state::with_driver;

/// `cuDeviceGetDefaultMemPool`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: *mut Handle,
    device: CUdevice,
) -> CUresult {
    with_driver("cuDeviceGetDefaultMemPool", |d, _| {
        let found = d.default_pool(device)?;
        // Safety: `pool` is null or writable per the API contract.
        unsafe { store(pool, handle(found)) }
    })
}

/// `cuDeviceGetMemPool`: the pool `cuMemAllocAsync` draws from.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut Handle, device: CUdevice) -> CUresult {
    with_driver("cuDeviceGetMemPool", |d, _| {
        let found = d.current_pool(device)?;
        // Safety: `pool` is null or writable per the API contract.
        unsafe { store(pool, handle(found)) }
    })
}

/// `cuDeviceSetMemPool`: the pool must belong to the device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceSetMemPool(device: CUdevice, pool: Handle) -> CUresult {
    with_driver("cuDeviceSetMemPool", |d, _| {
        d.set_current_pool(device, key(pool))
    })
}

/// `cuMemPoolCreate`: pinned device memory on an existing device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut Handle,
    props: *const CUmemPoolProps,
) -> CUresult {
    with_driver("cuMemPoolCreate", |d, _| {
        require(pool)?;
        // Safety: `props` is null or readable per the API contract.
        let props = unsafe { load(props) }?;
        let created = d.pool_create(&props)?;
        // Safety: `pool` is non-null and writable per the API contract.
        unsafe { store(pool, handle(created)) }
    })
}

/// `cuMemPoolDestroy`: any pool but a device's default one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: Handle) -> CUresult {
    with_driver("cuMemPoolDestroy", |d, _| d.pool_destroy(key(pool)))
}

/// `cuMemPoolTrimTo`: nothing is cached, so nothing to trim.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: Handle, _min_bytes_to_keep: usize) -> CUresult {
    with_driver("cuMemPoolTrimTo", |d, _| d.pool_trim(key(pool)))
}

/// `cuMemPoolGetAttribute`: the reuse policies (`int`), release threshold and
/// reserved/used current/high (`cuuint64_t`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: Handle,
    attribute: c_uint,
    value: *mut c_void,
) -> CUresult {
    with_driver("cuMemPoolGetAttribute", |d, _| {
        // Safety: `value` is null or points to the attribute's C type per the API contract.
        match d.pool_attribute(key(pool), attribute)? {
            PoolValue::Int(v) => unsafe { store(value.cast::<c_int>(), v) },
            PoolValue::U64(v) => unsafe { store(value.cast::<u64>(), v) },
        }
    })
}

/// `cuMemPoolSetAttribute`: the high-water marks accept only 0 (a reset).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: Handle,
    attribute: c_uint,
    value: *mut c_void,
) -> CUresult {
    with_driver("cuMemPoolSetAttribute", |d, _| {
        // Safety: `value` is null or points to the attribute's C type per the API contract.
        let value = if pool_attribute_is_int(attribute) {
            PoolValue::Int(unsafe { load(value.cast::<c_int>()) }?)
        } else {
            PoolValue::U64(unsafe { load(value.cast::<u64>()) }?)
        };
        d.set_pool_attribute(key(pool), attribute, value)
    })
}
