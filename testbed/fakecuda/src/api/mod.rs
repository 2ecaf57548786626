//! The exported C functions, grouped as the CUDA driver API reference groups
//! them. Each one is a thin shim: check and convert the C arguments, then run
//! one `Driver` method under the lock (see `state::with_driver`).
//!
//! Twins (`_v2` and v1, `_ptsz` and legacy) are separate functions whose
//! bodies differ at least in the name they count calls under, so the
//! compiler never merges them into one address: `cuGetProcAddress` callers
//! and interposers tell entry points apart by address.

pub(crate) mod array;
pub(crate) mod context;
pub(crate) mod copy;
pub(crate) mod device;
pub(crate) mod init;
pub(crate) mod memory;
pub(crate) mod module;
pub(crate) mod pool;
pub(crate) mod stream;
pub(crate) mod vmm;

use std::ffi::c_void;

use crate::abi::{CU_STREAM_PER_THREAD, Handle};
use crate::result::*;

/// Writes `value` through an output argument; null is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `out` must be null or valid for writes of `T`.
pub(crate) unsafe fn store<T>(out: *mut T, value: T) -> Res<()> {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // Safety: non-null, and valid for writes per this function's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// Reads an input structure; null is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `input` must be null or valid for reads of `T`.
pub(crate) unsafe fn load<T: Copy>(input: *const T) -> Res<T> {
    if input.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // Safety: non-null, and valid for reads per this function's contract.
    Ok(unsafe { input.read_unaligned() })
}

/// Fails with `CUDA_ERROR_INVALID_VALUE` when an output argument is null,
/// before anything is allocated that could not be handed back.
pub(crate) fn require<T>(out: *mut T) -> Res<()> {
    if out.is_null() {
        Err(CUDA_ERROR_INVALID_VALUE)
    } else {
        Ok(())
    }
}

/// An opaque handle as the driver's bookkeeping key.
pub(crate) fn key(handle: Handle) -> u64 {
    handle as u64
}

/// A bookkeeping key as an opaque handle.
pub(crate) fn handle(key: u64) -> Handle {
    key as *mut c_void
}

/// A stream argument as a key. In a per-thread-default-stream entry point
/// (`_ptsz`, `_ptds`) the null stream means the calling thread's stream.
pub(crate) fn stream_key(stream: Handle, per_thread: bool) -> u64 {
    if stream.is_null() && per_thread {
        CU_STREAM_PER_THREAD
    } else {
        key(stream)
    }
}
