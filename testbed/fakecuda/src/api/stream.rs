//! Streams and events: `cuStream*`, `cuEvent*`. Work completes the moment it
//! is queued, so synchronisation always succeeds at once; what is checked is
//! that the handles are alive.

use std::ffi::{c_int, c_uint};

use super::{handle, key, require, store, stream_key};
use crate::abi::Handle;
use crate::result::*;
use crate::state::with_driver;

/// `cuStreamCreate`: flags 0 or `CU_STREAM_NON_BLOCKING`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut Handle, flags: c_uint) -> CUresult {
    with_driver("cuStreamCreate", |d, stack| {
        require(stream)?;
        let created = d.stream_create(stack, flags)?;
        // Safety: `stream` is non-null and writable per the API contract.
        unsafe { store(stream, handle(created)) }
    })
}

/// `cuStreamCreateWithPriority`: any priority is accepted (the real driver
/// clamps it to 0..-5); nothing is scheduled, so it has no effect.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    stream: *mut Handle,
    flags: c_uint,
    _priority: c_int,
) -> CUresult {
    with_driver("cuStreamCreateWithPriority", |d, stack| {
        require(stream)?;
        let created = d.stream_create(stack, flags)?;
        // Safety: `stream` is non-null and writable per the API contract.
        unsafe { store(stream, handle(created)) }
    })
}

/// `cuStreamDestroy` (CUDA 2.0 name).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy(stream: Handle) -> CUresult {
    with_driver("cuStreamDestroy", |d, _| d.stream_destroy(key(stream)))
}

/// `cuStreamDestroy_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: Handle) -> CUresult {
    with_driver("cuStreamDestroy_v2", |d, _| d.stream_destroy(key(stream)))
}

/// `cuStreamSynchronize`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize(stream: Handle) -> CUresult {
    with_driver("cuStreamSynchronize", |d, stack| {
        d.check_stream(stack, stream_key(stream, false))
    })
}

/// `cuStreamSynchronize_ptsz`: the null stream is the calling thread's stream.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(stream: Handle) -> CUresult {
    with_driver("cuStreamSynchronize_ptsz", |d, stack| {
        d.check_stream(stack, stream_key(stream, true))
    })
}

/// `cuStreamQuery`: always complete.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamQuery(stream: Handle) -> CUresult {
    with_driver("cuStreamQuery", |d, stack| {
        d.check_stream(stack, stream_key(stream, false))
    })
}

/// `cuStreamQuery_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamQuery_ptsz(stream: Handle) -> CUresult {
    with_driver("cuStreamQuery_ptsz", |d, stack| {
        d.check_stream(stack, stream_key(stream, true))
    })
}

/// `cuStreamWaitEvent`: waiting on an event never recorded is allowed, as in CUDA.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamWaitEvent(
    stream: Handle,
    event: Handle,
    flags: c_uint,
) -> CUresult {
    with_driver("cuStreamWaitEvent", |d, stack| {
        d.stream_wait_event(stack, stream_key(stream, false), key(event), flags)
    })
}

/// `cuStreamWaitEvent_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamWaitEvent_ptsz(
    stream: Handle,
    event: Handle,
    flags: c_uint,
) -> CUresult {
    with_driver("cuStreamWaitEvent_ptsz", |d, stack| {
        d.stream_wait_event(stack, stream_key(stream, true), key(event), flags)
    })
}

/// `cuEventCreate` in the current context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(event: *mut Handle, flags: c_uint) -> CUresult {
    with_driver("cuEventCreate", |d, stack| {
        require(event)?;
        let created = d.event_create(stack, flags)?;
        // Safety: `event` is non-null and writable per the API contract.
        unsafe { store(event, handle(created)) }
    })
}

/// `cuEventRecord`: notes the host time for `cuEventElapsedTime`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord(event: Handle, stream: Handle) -> CUresult {
    with_driver("cuEventRecord", |d, stack| {
        d.event_record(stack, key(event), stream_key(stream, false))
    })
}

/// `cuEventRecord_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord_ptsz(event: Handle, stream: Handle) -> CUresult {
    with_driver("cuEventRecord_ptsz", |d, stack| {
        d.event_record(stack, key(event), stream_key(stream, true))
    })
}

/// `cuEventQuery`: always complete.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventQuery(event: Handle) -> CUresult {
    with_driver("cuEventQuery", |d, _| d.check_event(key(event)))
}

/// `cuEventSynchronize`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventSynchronize(event: Handle) -> CUresult {
    with_driver("cuEventSynchronize", |d, _| d.check_event(key(event)))
}

/// `cuEventDestroy` (CUDA 2.0 name).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventDestroy(event: Handle) -> CUresult {
    with_driver("cuEventDestroy", |d, _| d.event_destroy(key(event)))
}

/// `cuEventDestroy_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventDestroy_v2(event: Handle) -> CUresult {
    with_driver("cuEventDestroy_v2", |d, _| d.event_destroy(key(event)))
}

/// `cuEventElapsedTime` (CUDA 2.0 name).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    with_driver("cuEventElapsedTime", |d, _| {
        let elapsed = d.event_elapsed(key(start), key(end))?;
        // Safety: `ms` is null or writable per the API contract.
        unsafe { store(ms, elapsed) }
    })
}

/// `cuEventElapsedTime_v2`: host milliseconds between the two records.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: Handle,
    end: Handle,
) -> CUresult {
    with_driver("cuEventElapsedTime_v2", |d, _| {
        let elapsed = d.event_elapsed(key(start), key(end))?;
        // Safety: `ms` is null or writable per the API contract.
        unsafe { store(ms, elapsed) }
    })
}
