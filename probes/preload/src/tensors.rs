//! The tensor ABI: PyTorch's caching allocator, seen from Python by the probe
//! (`probes/python/vramtrace_torch.py`), reports each block it hands out or takes back and each
//! request it refuses; each report becomes a TENSOR record with the same clock and thread as the
//! driver's events and the Python frames of the reporting thread (read here, not in Python).

use core::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicBool, Ordering};

use vramtrace_format::{
    Encoder, MAX_TENSOR_RANK, TENSOR_RECORD_MAX_LEN, TensorAction, TensorEvent, kind,
};

use crate::labels::c_str;
use crate::live_tensors::Released;
use crate::sink::{mono_ns, tid, with_file};

/// `int vramtrace_tensor(uint32_t action, int32_t device, uint64_t ptr, uint64_t size,
/// uint64_t segment, uint64_t allocated, uint64_t reserved, uint64_t limit, uint64_t free,
/// const char *op, const char *dtype, const int64_t *shape, uint32_t rank, uint64_t requested)`:
/// records a tensor event. `action`: 1 allocated (`size` the block, `requested` the bytes asked
/// for, 0 if unknown), 2 freed, 3 refused (an allocator out-of-memory, `size` the request,
/// `allocated`/`reserved`/`limit`/`free` PyTorch's numbers at that moment). Returns 0, or -1 for
/// an unknown action.
///
/// # Safety
/// `op` and `dtype` are null or NUL-terminated; `shape` is null or points at `rank` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramtrace_tensor(
    action: u32,
    device: i32,
    ptr: u64,
    size: u64,
    segment: u64,
    allocated: u64,
    reserved: u64,
    limit: u64,
    free: u64,
    op: *const c_char,
    dtype: *const c_char,
    shape: *const i64,
    rank: u32,
    requested: u64,
) -> i32 {
    let Some(action) = u8::try_from(action).ok().and_then(TensorAction::from_u8) else {
        return -1;
    };
    // Safety: the caller's strings, valid for the call.
    let (op, dtype) = unsafe { (c_str(op), c_str(dtype)) };
    let mut dims = [0i64; MAX_TENSOR_RANK];
    let rank = if shape.is_null() {
        0
    } else {
        (rank as usize).min(MAX_TENSOR_RANK)
    };
    if rank > 0 {
        // Safety: the caller's array of at least `rank` values; only MAX_TENSOR_RANK are read.
        dims[..rank].copy_from_slice(unsafe { core::slice::from_raw_parts(shape, rank) });
    }
    record(
        TensorEvent {
            device,
            action,
            ptr,
            size,
            segment,
            allocated,
            reserved,
            limit,
            free,
            requested,
            ..TensorEvent::default()
        },
        op,
        dtype,
        &dims[..rank],
    );
    0
}

/// `int vramtrace_tensor_block(uint32_t action, int32_t device, uint64_t ptr, uint64_t size,
/// uint64_t requested)`: [`vramtrace_tensor`] for the two reports made per tensor (1 allocated,
/// 2 freed), with five arguments instead of fourteen: the probe calls it twice per tensor, and
/// converting each argument from Python costs about 0.1 µs. Returns 0, or -1 for another action.
#[unsafe(no_mangle)]
pub extern "C" fn vramtrace_tensor_block(
    action: u32,
    device: i32,
    ptr: u64,
    size: u64,
    requested: u64,
) -> i32 {
    let action = match action {
        1 => TensorAction::Alloc,
        2 => TensorAction::Free,
        _ => return -1,
    };
    record(
        TensorEvent {
            device,
            action,
            ptr,
            size,
            requested,
            ..TensorEvent::default()
        },
        None,
        None,
        &[],
    );
    0
}

/// Whether tensor capture is paused ([`vramtrace_tensor_pause`]).
static PAUSED: AtomicBool = AtomicBool::new(false);

/// `int vramtrace_tensor_pause(int paused, const char *why)`: pauses tensor capture (`paused`
/// nonzero) or resumes it, for any source (native capture or the probe's callbacks), and says so
/// in the trace as a NOTE (with `why`, if not null). While paused, no block handed out is
/// recorded; a release is, paused or not, when its block's allocation was (the live-tensor
/// table knows it; without a table every release is), so that no tensor stays live for a reader
/// for good; the allocator's refusals and the driver's events are recorded as always. Returns 1
/// if capture was paused before the call, else 0. `vramtrace_torch.pause()` and `resume()` call
/// it (docs/architecture.md, "Pausing").
///
/// # Safety
/// `why` is null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramtrace_tensor_pause(paused: c_int, why: *const c_char) -> c_int {
    let was = PAUSED.swap(paused != 0, Ordering::AcqRel);
    if was != (paused != 0) {
        let mut text = Vec::with_capacity(96);
        text.extend_from_slice(if paused != 0 {
            b"tensor capture paused: tensor detail is missing until it resumes"
        } else {
            b"tensor capture resumed"
        });
        // Safety: the caller's string.
        if let Some(why) = unsafe { c_str(why) } {
            text.extend_from_slice(b" (");
            text.extend_from_slice(why);
            text.push(b')');
        }
        crate::recorder::note(&text);
    }
    c_int::from(was)
}

/// Whether tensor capture is paused: a block handed out now is not recorded.
#[inline]
pub(crate) fn paused() -> bool {
    PAUSED.load(Ordering::Relaxed)
}

/// Writes `t` (its time, thread and Python frames filled in here) with its operator, dtype and
/// shape. Also the native capture's writer (`src/torch_tracker.rs`).
pub(crate) fn record(mut t: TensorEvent, op: Option<&[u8]>, dtype: Option<&[u8]>, shape: &[i64]) {
    // A release leaves the live-tensor table first: what the table knew decides where it goes.
    let released = (t.action == TensorAction::Free).then(|| released(t.ptr));
    // A release whose allocation was never recorded (before capture started, or paused) is
    // not either: the reader would ignore it.
    if released == Some(Released::Unrecorded)
        || (released.is_none() && t.action != TensorAction::AllocFailed && paused())
    {
        return;
    }
    with_file(|file| {
        t.t_ns = mono_ns();
        t.tid = tid();
        // A free needs no frames: the reader pairs it with its allocation.
        if t.action != TensorAction::Free {
            let _timer = crate::self_time::start(crate::self_time::Step::Frames);
            t.stack = crate::stacks::capture_python(file);
        }
        t.op = op.map_or(0, |o| crate::intern::intern(file, o));
        t.dtype = dtype.map_or(0, |d| crate::intern::intern(file, d));
        let write_timer = crate::self_time::start(crate::self_time::Step::Write);
        let mut buf = [0u8; TENSOR_RECORD_MAX_LEN];
        let mut e = Encoder::new(&mut buf);
        // A block handed out or taken back in about 30 bytes instead of 97 (docs/performance.md).
        let frame = if shape.is_empty() && t.is_compact() {
            t.encode_compact_payload(&mut e);
            file.frame(&mut e, kind::TENSOR_COMPACT)
        } else {
            t.encode_payload_with_shape(&mut e, shape);
            file.frame(&mut e, kind::TENSOR)
        };
        if t.action == TensorAction::AllocFailed {
            // A refusal is never dropped, and the live set it met is written just before it.
            crate::live_tensors::flight_record(
                file,
                b"PyTorch's allocator refused a request",
                true,
                t.t_ns,
            );
            file.write(frame);
        } else if released == Some(Released::Kept) {
            // Its statement was kept (restated): so is its release.
            file.write(frame);
            crate::live_tensors::serve_pending(file);
        } else if let Some((block, reused)) = file.write_droppable(frame) {
            drop(write_timer);
            let _timer = crate::self_time::start(crate::self_time::Step::Table);
            crate::live_tensors::on_report(file, &t, block, reused);
        }
    });
}

/// [`crate::live_tensors::on_release`], timed as the table's step.
fn released(ptr: u64) -> Released {
    let _timer = crate::self_time::start(crate::self_time::Step::Table);
    crate::live_tensors::on_release(ptr)
}
