//! Memset and memcpy. No device bytes exist, so these only validate: the
//! device range must lie inside one live allocation (or mapped VMM memory).
//! Copies to the host fill the host buffer with zeros, which is what freshly
//! zeroed device memory would give back.

use std::ffi::{c_uchar, c_uint, c_void};

use super::{key, stream_key};
use crate::abi::{CUdeviceptr, Handle};
use crate::driver::{ContextStack, Driver};
use crate::result::*;
use crate::state::with_driver;

/// A synchronous call needs a current context; an `Async` one a live stream.
fn check_queue(d: &Driver, stack: &ContextStack, stream: Option<u64>) -> Res<()> {
    match stream {
        Some(stream) => d.check_stream(stack, stream),
        None => d.current(stack).map(drop),
    }
}

/// Shared body of the memsets: `count` units of `unit` bytes at `dst`.
fn memset(
    api: &'static str,
    dst: CUdeviceptr,
    count: usize,
    unit: u64,
    stream: Option<u64>,
) -> CUresult {
    with_driver(api, |d, stack| {
        check_queue(d, stack, stream)?;
        if !dst.is_multiple_of(unit) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = (count as u64)
            .checked_mul(unit)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        d.check_device_range(dst, bytes)
    })
}

/// Shared body of the host-to-device copies.
fn htod(
    api: &'static str,
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: Option<u64>,
) -> CUresult {
    with_driver(api, |d, stack| {
        check_queue(d, stack, stream)?;
        if bytes > 0 && src.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        d.check_device_range(dst, bytes as u64)
    })
}

/// Shared body of the device-to-host copies: the host buffer is zeroed.
fn dtoh(
    api: &'static str,
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: Option<u64>,
) -> CUresult {
    with_driver(api, |d, stack| {
        check_queue(d, stack, stream)?;
        if bytes == 0 {
            return Ok(());
        }
        if dst.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        d.check_device_range(src, bytes as u64)?;
        // Safety: `dst` is non-null and writable for `bytes` bytes per the API contract.
        unsafe { std::ptr::write_bytes(dst.cast::<u8>(), 0, bytes) };
        Ok(())
    })
}

/// Shared body of the device-to-device copies.
fn dtod(
    api: &'static str,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: Option<u64>,
) -> CUresult {
    with_driver(api, |d, stack| {
        check_queue(d, stack, stream)?;
        d.check_device_range(dst, bytes as u64)?;
        d.check_device_range(src, bytes as u64)
    })
}

/// `cuMemsetD8_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD8_v2(
    dst: CUdeviceptr,
    _value: c_uchar,
    count: usize,
) -> CUresult {
    memset("cuMemsetD8_v2", dst, count, 1, None)
}

/// `cuMemsetD8_v2_ptds`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD8_v2_ptds(
    dst: CUdeviceptr,
    _value: c_uchar,
    count: usize,
) -> CUresult {
    memset("cuMemsetD8_v2_ptds", dst, count, 1, None)
}

/// `cuMemsetD32_v2`: `dst` must be 4-byte aligned.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD32_v2(
    dst: CUdeviceptr,
    _value: c_uint,
    count: usize,
) -> CUresult {
    memset("cuMemsetD32_v2", dst, count, 4, None)
}

/// `cuMemsetD32_v2_ptds`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD32_v2_ptds(
    dst: CUdeviceptr,
    _value: c_uint,
    count: usize,
) -> CUresult {
    memset("cuMemsetD32_v2_ptds", dst, count, 4, None)
}

/// `cuMemsetD8Async` (what cudarc's `alloc_zeros` calls).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD8Async(
    dst: CUdeviceptr,
    _value: c_uchar,
    count: usize,
    stream: Handle,
) -> CUresult {
    memset(
        "cuMemsetD8Async",
        dst,
        count,
        1,
        Some(stream_key(stream, false)),
    )
}

/// `cuMemsetD8Async_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD8Async_ptsz(
    dst: CUdeviceptr,
    _value: c_uchar,
    count: usize,
    stream: Handle,
) -> CUresult {
    memset(
        "cuMemsetD8Async_ptsz",
        dst,
        count,
        1,
        Some(stream_key(stream, true)),
    )
}

/// `cuMemsetD32Async`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD32Async(
    dst: CUdeviceptr,
    _value: c_uint,
    count: usize,
    stream: Handle,
) -> CUresult {
    memset(
        "cuMemsetD32Async",
        dst,
        count,
        4,
        Some(stream_key(stream, false)),
    )
}

/// `cuMemsetD32Async_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD32Async_ptsz(
    dst: CUdeviceptr,
    _value: c_uint,
    count: usize,
    stream: Handle,
) -> CUresult {
    memset(
        "cuMemsetD32Async_ptsz",
        dst,
        count,
        4,
        Some(stream_key(stream, true)),
    )
}

/// `cuMemcpyHtoD_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
) -> CUresult {
    htod("cuMemcpyHtoD_v2", dst, src, bytes, None)
}

/// `cuMemcpyHtoD_v2_ptds`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2_ptds(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
) -> CUresult {
    htod("cuMemcpyHtoD_v2_ptds", dst, src, bytes, None)
}

/// `cuMemcpyHtoDAsync_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    htod(
        "cuMemcpyHtoDAsync_v2",
        dst,
        src,
        bytes,
        Some(stream_key(stream, false)),
    )
}

/// `cuMemcpyHtoDAsync_v2_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2_ptsz(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    htod(
        "cuMemcpyHtoDAsync_v2_ptsz",
        dst,
        src,
        bytes,
        Some(stream_key(stream, true)),
    )
}

/// `cuMemcpyDtoH_v2`: fills `dst` with zeros.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    dtoh("cuMemcpyDtoH_v2", dst, src, bytes, None)
}

/// `cuMemcpyDtoH_v2_ptds`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2_ptds(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    dtoh("cuMemcpyDtoH_v2_ptds", dst, src, bytes, None)
}

/// `cuMemcpyDtoHAsync_v2`: fills `dst` with zeros before returning.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    dtoh(
        "cuMemcpyDtoHAsync_v2",
        dst,
        src,
        bytes,
        Some(stream_key(stream, false)),
    )
}

/// `cuMemcpyDtoHAsync_v2_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2_ptsz(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    dtoh(
        "cuMemcpyDtoHAsync_v2_ptsz",
        dst,
        src,
        bytes,
        Some(stream_key(stream, true)),
    )
}

/// `cuMemcpyDtoD_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    dtod("cuMemcpyDtoD_v2", dst, src, bytes, None)
}

/// `cuMemcpyDtoD_v2_ptds`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoD_v2_ptds(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    dtod("cuMemcpyDtoD_v2_ptds", dst, src, bytes, None)
}

/// `cuMemcpyDtoDAsync_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    dtod(
        "cuMemcpyDtoDAsync_v2",
        dst,
        src,
        bytes,
        Some(stream_key(stream, false)),
    )
}

/// `cuMemcpyDtoDAsync_v2_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2_ptsz(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    dtod(
        "cuMemcpyDtoDAsync_v2_ptsz",
        dst,
        src,
        bytes,
        Some(stream_key(stream, true)),
    )
}

/// Shared body of the peer copies: both contexts must be alive.
fn peer(
    api: &'static str,
    dst: CUdeviceptr,
    dst_ctx: Handle,
    src: CUdeviceptr,
    src_ctx: Handle,
    bytes: usize,
    stream: u64,
) -> CUresult {
    with_driver(api, |d, stack| {
        d.context_device(key(dst_ctx))?;
        d.context_device(key(src_ctx))?;
        d.check_stream(stack, stream)?;
        d.check_device_range(dst, bytes as u64)?;
        d.check_device_range(src, bytes as u64)
    })
}

/// `cuMemcpyPeerAsync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    dst_ctx: Handle,
    src: CUdeviceptr,
    src_ctx: Handle,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    peer(
        "cuMemcpyPeerAsync",
        dst,
        dst_ctx,
        src,
        src_ctx,
        bytes,
        stream_key(stream, false),
    )
}

/// `cuMemcpyPeerAsync_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyPeerAsync_ptsz(
    dst: CUdeviceptr,
    dst_ctx: Handle,
    src: CUdeviceptr,
    src_ctx: Handle,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    peer(
        "cuMemcpyPeerAsync_ptsz",
        dst,
        dst_ctx,
        src,
        src_ctx,
        bytes,
        stream_key(stream, true),
    )
}
