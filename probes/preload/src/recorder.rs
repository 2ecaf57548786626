//! The recorder: one body per family that turns a hooked call into an event, with the
//! device it concerns, the native stack and the label of the thread's open ranges, and
//! hands the encoded record to the sink.
//!
//! A hook takes a [`Call`] before the real call (recording on, the thread's guard taken) and
//! consumes it after with the call's operands ([`Op`]): [`Call::alloc`], [`Call::free`],
//! [`Call::map`], [`Call::unmap`]. A failed allocation also carries the device's free and
//! total memory, from our own `cuMemGetInfo_v2`. The first event on a device is preceded by
//! a DEVICE record (name, total memory). [`note`] writes a NOTE: something the preload wants
//! the reader to know.

use core::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicU64, Ordering};

use vramtrace_format::{Encoder, Event, EventKind, FRAME_HEADER_LEN, MemKind, kind};

use crate::driver::{Entry, real_fn};
use crate::ffi::{CuDevice, FnCtxGetDevice, FnDeviceGetName, FnDeviceTotalMem, FnMemGetInfo};
use crate::fork::ForkHandler;
use crate::guard::ReentrancyGuard;
use crate::sink::{self, File, guarded, mono_ns, tid};

/// Device ordinals 0..256 whose DEVICE record has been written.
static DEVICES_SEEN: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
static FORK: ForkHandler = ForkHandler::new(after_fork_child);

/// Where an event's device ordinal comes from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Dev {
    /// The calling thread's current context (`cuCtxGetDevice`).
    Current,
    /// Known from the call's arguments (`cuMemCreate`'s location); -1 for host memory.
    Known(i32),
}

/// The operands of one recorded driver call, before the recorder adds time, thread and device.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op {
    pub(crate) api: vramtrace_format::Api,
    pub(crate) mem: MemKind,
    pub(crate) device: Dev,
    pub(crate) ptr: u64,
    pub(crate) size: u64,
    pub(crate) stream: u64,
    pub(crate) aux: u64,
}

impl Op {
    /// An operation of `api` on `mem`, every operand zero, device from the current context.
    pub(crate) fn new(api: vramtrace_format::Api, mem: MemKind) -> Op {
        Op {
            api,
            mem,
            device: if mem == MemKind::Host {
                Dev::Known(-1)
            } else {
                Dev::Current
            },
            ptr: 0,
            size: 0,
            stream: 0,
            aux: 0,
        }
    }
}

/// One hooked call being recorded. Taken before the real call (it only checks that recording
/// is on and takes the thread's guard), consumed after it by one of the family functions.
pub(crate) struct Call {
    _guard: ReentrancyGuard,
}

impl Call {
    /// `None` when recording is off, has failed, or this thread is already inside a hook.
    #[inline]
    pub(crate) fn begin() -> Option<Call> {
        if !sink::active() {
            return None;
        }
        Some(Call {
            _guard: ReentrancyGuard::acquire()?,
        })
    }

    /// The allocation family: `Alloc` on success, a failed allocation otherwise.
    pub(crate) fn alloc(self, result: c_int, op: Op) {
        self.acquired(EventKind::Alloc, result, op);
    }

    /// The release family: `Free` (size 0; the reader pairs it) or `FreeFailed`.
    pub(crate) fn free(self, result: c_int, op: Op) {
        self.released(EventKind::Free, result, op);
    }

    /// The mapping family: `Map` on success; a failed map is a failed allocation of mapping.
    pub(crate) fn map(self, result: c_int, op: Op) {
        self.acquired(EventKind::Map, result, op);
    }

    /// `Unmap` (size 0, the range's size in `aux`) or `FreeFailed`.
    pub(crate) fn unmap(self, result: c_int, op: Op) {
        self.released(EventKind::Unmap, result, op);
    }

    /// An allocation that existed before the recorder arrived (`vramtrace attach`'s seeds):
    /// recorded as made now, without a stack, since no frame of now made it.
    pub(crate) fn seeded(self, op: Op) {
        guarded(|| emit(EventKind::Alloc, 0, op, 0, 0, false));
    }

    /// `kind` on success; otherwise `AllocFailed`, with the device's free and total memory as
    /// `cuMemGetInfo_v2` reports them now (called by us; nothing the program sees changes).
    fn acquired(self, kind: EventKind, result: c_int, op: Op) {
        guarded(|| {
            if result == 0 {
                emit(kind, result, op, 0, 0, true)
            } else {
                let (free, total) = mem_info();
                // Under a size budget, the tensors live at the failure whatever was dropped,
                // just before it (a reader has them when it meets the failure).
                if let Some(file) = crate::sink::file() {
                    crate::live_tensors::flight_record(
                        file,
                        b"a failed driver allocation",
                        true,
                        mono_ns(),
                    );
                }
                emit(EventKind::AllocFailed, result, op, free, total, true)
            }
        });
    }

    /// `kind` on success, `FreeFailed` otherwise; size 0 either way.
    ///
    /// A successful release's device is recorded as unknown (-1) unless the call names it:
    /// the reader takes it from the allocation the release pairs with (the replay's live
    /// allocation), which is also right when the memory belongs to another device than the
    /// current context's. Not asking the driver saves a `cuCtxGetDevice` per release. A failed
    /// release pairs with nothing, so it keeps the current context's device.
    ///
    /// Its native stack likewise: attribution needs the allocation's, and the unwind is most of
    /// a hook's cost, so a successful release gets one only with `VRAMTRACE_FREE_STACKS=1`; a
    /// failed release (rare, and worth seeing where) always does.
    fn released(self, kind: EventKind, result: c_int, op: Op) {
        let (kind, device, stack) = if result == 0 {
            let device = match op.device {
                Dev::Current => Dev::Known(-1),
                known => known,
            };
            (kind, device, crate::config::free_stacks())
        } else {
            (EventKind::FreeFailed, op.device, true)
        };
        guarded(|| {
            emit(
                kind,
                result,
                Op {
                    size: 0,
                    device,
                    ..op
                },
                0,
                0,
                stack,
            )
        });
    }
}

fn current_device() -> i32 {
    // Safety: FnCtxGetDevice is cuCtxGetDevice's signature.
    let Some(f) = (unsafe { real_fn::<FnCtxGetDevice>(Entry::CtxGetDevice) }) else {
        return -1;
    };
    let mut dev: CuDevice = -1;
    // Safety: the driver's cuCtxGetDevice with a valid out-pointer.
    let r = unsafe { f(&mut dev) };
    if r == 0 { dev } else { -1 }
}

fn mem_info() -> (u64, u64) {
    // Safety: FnMemGetInfo is cuMemGetInfo_v2's signature.
    let Some(f) = (unsafe { real_fn::<FnMemGetInfo>(Entry::MemGetInfoV2) }) else {
        return (0, 0);
    };
    let (mut free, mut total) = (0usize, 0usize);
    // Safety: the driver's cuMemGetInfo_v2 with valid out-pointers.
    let r = unsafe { f(&mut free, &mut total) };
    if r == 0 {
        (free as u64, total as u64)
    } else {
        (0, 0)
    }
}

/// Builds and writes one event, with its native stack if `stack` (and stacks are on).
fn emit(kind: EventKind, result: c_int, op: Op, free_bytes: u64, total_bytes: u64, stack: bool) {
    FORK.register();
    let device = match op.device {
        Dev::Known(d) => d,
        Dev::Current => current_device(),
    };
    // After the open, so that the header's start time never follows the first event.
    let Some(file) = sink::file() else { return };
    let t_ns = mono_ns();
    if device >= 0 {
        note_device(file, device);
    }
    let ev = Event {
        t_ns,
        tid: tid(),
        device,
        kind,
        mem: op.mem,
        api: op.api,
        result,
        ptr: op.ptr,
        size: op.size,
        stream: op.stream,
        aux: op.aux,
        free_bytes,
        total_bytes,
        stack: if stack {
            crate::stacks::capture(file)
        } else {
            0
        },
        label: crate::labels::current_label(file),
    };
    file.write_event(&ev);
}

/// Writes a DEVICE record the first time an ordinal appears.
fn note_device(file: File, device: i32) {
    let d = device as usize;
    if d >= DEVICES_SEEN.len() * 64 {
        return;
    }
    let bit = 1u64 << (d % 64);
    // A plain load first: an atomic read-modify-write on every event cost a fifth of the
    // recorder's own time (a locked instruction, and one cache line shared by all threads).
    if DEVICES_SEEN[d / 64].load(Ordering::Acquire) & bit != 0
        || DEVICES_SEEN[d / 64].fetch_or(bit, Ordering::AcqRel) & bit != 0
    {
        return;
    }
    let mut name = [0u8; 256];
    // Safety: FnDeviceGetName is cuDeviceGetName's signature.
    if let Some(get_name) = unsafe { real_fn::<FnDeviceGetName>(Entry::DeviceGetName) } {
        // Safety: the driver's cuDeviceGetName with a buffer of the length we pass.
        unsafe {
            get_name(
                name.as_mut_ptr() as *mut c_char,
                name.len() as c_int - 1,
                device,
            )
        };
    }
    let name_len = name.iter().position(|&b| b == 0).unwrap_or(0);
    let mut total = 0usize;
    // Safety: FnDeviceTotalMem is cuDeviceTotalMem_v2's signature.
    if let Some(get_total) = unsafe { real_fn::<FnDeviceTotalMem>(Entry::DeviceTotalMemV2) } {
        // Safety: the driver's cuDeviceTotalMem_v2 with a valid out-pointer.
        unsafe { get_total(&mut total, device) };
    }
    let mut buf = [0u8; FRAME_HEADER_LEN + 4 + 8 + 2 + 256];
    let mut e = Encoder::new(&mut buf);
    e.i32(device)
        .u64(total as u64)
        .str(core::str::from_utf8(&name[..name_len]).unwrap_or("?"));
    file.write(e.finish(kind::DEVICE));
}

/// Writes a NOTE record: something the recorder wants the reader to know.
pub(crate) fn note(text: &[u8]) {
    sink::with_file(|file| {
        let mut buf = [0u8; FRAME_HEADER_LEN + 8 + 512];
        let mut e = Encoder::new(&mut buf);
        e.u64(mono_ns()).bytes(&text[..text.len().min(512)]);
        file.write(e.finish(kind::NOTE));
    });
}

/// In the child after `fork`: the child's file has no DEVICE records yet, and its one thread
/// is inside no hook of ours.
extern "C" fn after_fork_child() {
    for seen in &DEVICES_SEEN {
        seen.store(0, Ordering::Release);
    }
    ReentrancyGuard::reset_after_fork();
}
