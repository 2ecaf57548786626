//! Arriving late: what `vramtrace attach` calls in a running process after loading this library
//! into it with a remote `dlopen` (the CLI's `vramtrace-attach` crate, `probes/attach/`; design
//! in docs/architecture.md, "Attaching to a running process").
//!
//! Loaded late, nothing interposes: the program and cudart already hold the driver's entry
//! points. The CLI therefore patches the driver's allocation entry points in place (a jump to a
//! pad that jumps to our wrapper of the same name) and copies each entry's first instructions
//! into a trampoline that continues in the driver. Before patching it tells us, entry by entry,
//! where that trampoline is ([`vramtrace_attach_real`]): it becomes the real function of the
//! row, so our wrapper calls the driver through it and never through the patched entry. Then
//! [`vramtrace_attach_start`] turns recording on with the trace directory; detach calls
//! [`vramtrace_attach_stop`] and restores the entry points.
//!
//! Each function is called by the tracer on one thread of a process whose other threads may be
//! stopped anywhere, possibly inside the driver: none of them calls into the driver or takes a
//! lock. The library's lazy initialisation (configuration, file, clock) happens on the first
//! recorded call, as under `LD_PRELOAD`; no constructor is relied on.

use core::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use vramtrace_format::MemKind;

use crate::config::{self, AttachRefusal};
use crate::driver::{self, ENTRIES, Entry};
use crate::labels::{range_pop, range_push};
use crate::recorder::{Call, Dev, Op};

/// The library's attach state, read by `vramtrace attach` from outside (through
/// `/proc/PID/mem`) before it does anything: 0 (loaded by `LD_PRELOAD`, or not yet
/// attached), 1 (attached) or 2 (detached).
#[unsafe(no_mangle)]
pub static vramtrace_attach_state: AtomicU32 = AtomicU32::new(NEVER);

/// The process id of the `vramtrace attach` that attached, for its refusal message.
#[unsafe(no_mangle)]
pub static vramtrace_attach_pid: AtomicU32 = AtomicU32::new(0);

const NEVER: u32 = 0;
const ATTACHED: u32 = 1;
const DETACHED: u32 = 2;

/// [`vramtrace_attach_real`]: no wrapped entry point has that name.
pub const ATTACH_UNKNOWN_ENTRY: c_int = -1;
/// [`vramtrace_attach_real`]: the row already has a real address other than the one given.
pub const ATTACH_ALREADY_RESOLVED: c_int = -2;
/// [`vramtrace_attach_start`]: recording is already on from the environment (`vramtrace run`).
pub const ATTACH_ALREADY_RECORDING: c_int = -3;
/// [`vramtrace_attach_start`]: the process runs in secure mode (set-user-ID and the like).
pub const ATTACH_SECURE_MODE: c_int = -4;
/// [`vramtrace_attach_start`]: the directory is not an absolute path.
pub const ATTACH_BAD_DIRECTORY: c_int = -5;
/// [`vramtrace_attach_start`]: attached already, or attached and detached before.
pub const ATTACH_TWICE: c_int = -6;

/// Makes `trampoline` the real function of the wrapped entry point exported as `name` (a
/// driver function, or libc10's `c10::reportMemoryUsageToProfiler`).
///
/// # Safety
/// `name` is a NUL-terminated string; `trampoline` is code with that entry point's signature.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramtrace_attach_real(
    name: *const c_char,
    trampoline: *mut c_void,
) -> c_int {
    if name.is_null() || trampoline.is_null() {
        return ATTACH_UNKNOWN_ENTRY;
    }
    // Safety: a NUL-terminated string (the caller's promise).
    let name = unsafe { CStr::from_ptr(name) };
    // PyTorch's report of each block (libc10.so), hooked the same way for native capture.
    if crate::torch_tracker::is_report_symbol(name) {
        return if crate::torch_tracker::publish_real_report(trampoline) == trampoline {
            0
        } else {
            ATTACH_ALREADY_RESOLVED
        };
    }
    let Some(row) = ENTRIES.iter().position(|e| e.name == name && e.api.0 != 0) else {
        return ATTACH_UNKNOWN_ENTRY;
    };
    if driver::publish(row, trampoline) == trampoline {
        0
    } else {
        ATTACH_ALREADY_RESOLVED
    }
}

/// Turns recording on into `dir` (absolute, NUL-terminated); `attacher` is the pid of
/// `vramtrace attach`. 0, or one of the `ATTACH_*` refusals.
///
/// # Safety
/// `dir` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramtrace_attach_start(dir: *const c_char, attacher: u32) -> c_int {
    if dir.is_null() {
        return ATTACH_BAD_DIRECTORY;
    }
    if vramtrace_attach_state.load(Ordering::Acquire) != NEVER {
        return ATTACH_TWICE;
    }
    // Safety: a NUL-terminated string (the caller's promise).
    let dir = unsafe { CStr::from_ptr(dir) }.to_bytes();
    match config::start_attached(dir) {
        Ok(()) => {
            vramtrace_attach_pid.store(attacher, Ordering::Release);
            vramtrace_attach_state.store(ATTACHED, Ordering::Release);
            0
        }
        Err(AttachRefusal::AlreadyRecording) => ATTACH_ALREADY_RECORDING,
        Err(AttachRefusal::SecureMode) => ATTACH_SECURE_MODE,
        Err(AttachRefusal::BadDirectory) => ATTACH_BAD_DIRECTORY,
    }
}

/// Turns recording off (the entry points are restored by the caller). Always 0.
#[unsafe(no_mangle)]
pub extern "C" fn vramtrace_attach_stop() -> c_int {
    config::stop_attached();
    vramtrace_attach_state.store(DETACHED, Ordering::Release);
    0
}

/// What the Python probe's `detach()` reported (`vramtrace_torch.py`, its `DETACH_*` bits; 0:
/// not yet), read by `vramtrace attach` from outside (through `/proc/PID/mem`) after it
/// scheduled that call at detach: so it can say when the interpreter did not run it in time.
#[unsafe(no_mangle)]
pub static vramtrace_attach_python_detached: AtomicU32 = AtomicU32::new(0);

/// Called by the Python probe's `detach()` with what it did (its `DETACH_*` bits, 1 always
/// set); [`vramtrace_attach_python_detached`] holds them from then on.
#[unsafe(no_mangle)]
pub extern "C" fn vramtrace_attach_python_done(flags: u32) {
    vramtrace_attach_python_detached.store(flags | 1, Ordering::Release);
}

/// [`vramtrace_attach_python`]: the process has no CPython interpreter (or not initialised).
pub const ATTACH_NO_PYTHON: c_int = 1;

type PendingCall = unsafe extern "C" fn(*mut c_void) -> c_int;
type AddPendingCall = unsafe extern "C" fn(PendingCall, *mut c_void) -> c_int;
type RunSimpleString = unsafe extern "C" fn(*const c_char) -> c_int;
type IsInitialized = unsafe extern "C" fn() -> c_int;

/// `PyRun_SimpleString`, found once by [`vramtrace_attach_python`].
static RUN: std::sync::atomic::AtomicPtr<c_void> =
    std::sync::atomic::AtomicPtr::new(core::ptr::null_mut());

/// Runs in the interpreter's main thread, under the GIL, at a point where the eval loop checks
/// for pending calls (between bytecodes): the memray way of running code in a live
/// interpreter. Errors are printed by `PyRun_SimpleString` itself; 0 keeps them from being
/// raised in the program.
unsafe extern "C" fn run_pending(code: *mut c_void) -> c_int {
    let run = RUN.load(Ordering::Acquire);
    if !run.is_null() {
        // Safety: RUN holds PyRun_SimpleString; `code` is the NUL-terminated string leaked by
        // vramtrace_attach_python; we hold the GIL (a pending call).
        unsafe {
            let run: RunSimpleString = core::mem::transmute::<*mut c_void, RunSimpleString>(run);
            run(code as *const c_char);
        }
    }
    0
}

/// Schedules the Python source `code` to run in the interpreter's main thread under the GIL
/// (`Py_AddPendingCall`). 0 when scheduled, 1 when the process has no
/// initialised CPython, -1 when the interpreter refused (its queue is full).
///
/// # Safety
/// `code` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramtrace_attach_python(code: *const c_char) -> c_int {
    let find = |name: &CStr| crate::real_dlsym::real_dlsym_quiet(libc::RTLD_DEFAULT, name.as_ptr());
    let (add, run, init) = (
        find(c"Py_AddPendingCall"),
        find(c"PyRun_SimpleString"),
        find(c"Py_IsInitialized"),
    );
    if code.is_null() || add.is_null() || run.is_null() || init.is_null() {
        return ATTACH_NO_PYTHON;
    }
    // Safety: Py_IsInitialized has no preconditions and takes no lock.
    if unsafe { core::mem::transmute::<*mut c_void, IsInitialized>(init)() } == 0 {
        return ATTACH_NO_PYTHON;
    }
    RUN.store(run, Ordering::Release);
    // Safety: the caller's NUL-terminated string, copied into one that lives forever (the call
    // runs later).
    let owned = unsafe { CStr::from_ptr(code) }.to_owned().into_raw();
    // Safety: Py_AddPendingCall may be called from any thread without the GIL.
    let add = unsafe { core::mem::transmute::<*mut c_void, AddPendingCall>(add) };
    // Safety: a callback of the right type and its argument.
    let rc = unsafe { add(run_pending, owned as *mut c_void) };
    if rc == 0 { 0 } else { -1 }
}

/// Records a device segment that existed before the attach (PyTorch's snapshot, seen by the
/// Python probe): an allocation of `size` bytes at `ptr` on `device`, labelled
/// `before attach`, so that frees of it pair and every reader shows where it came from.
/// 0, or -1 when recording is off.
#[unsafe(no_mangle)]
pub extern "C" fn vramtrace_attach_seed(device: i32, ptr: u64, size: u64) -> c_int {
    range_push(BEFORE_ATTACH);
    let recorded = match Call::begin() {
        Some(call) => {
            call.seeded(Op {
                ptr,
                size,
                device: Dev::Known(device),
                ..Op::new(ENTRIES[Entry::MemAllocV2 as usize].api, MemKind::Device)
            });
            0
        }
        None => -1,
    };
    range_pop();
    recorded
}

/// Records a block of PyTorch's caching allocator live before the attach (its snapshot, seen by
/// the Python probe): a TENSOR record of `size` bytes (`requested` asked for) at `ptr` in the
/// segment at `segment`, whose operator is `before attach` and which has no Python line (none
/// of now made it). 0, or -1 when recording is off.
#[unsafe(no_mangle)]
pub extern "C" fn vramtrace_attach_seed_block(
    device: i32,
    ptr: u64,
    size: u64,
    requested: u64,
    segment: u64,
) -> c_int {
    use vramtrace_format::{Encoder, TENSOR_RECORD_MAX_LEN, TensorAction, TensorEvent, kind};
    let mut recorded = -1;
    crate::sink::with_file(|file| {
        let t = TensorEvent {
            t_ns: crate::sink::mono_ns(),
            tid: crate::sink::tid(),
            device,
            action: TensorAction::Alloc,
            ptr,
            size,
            segment,
            requested,
            op: crate::intern::intern(file, BEFORE_ATTACH),
            ..TensorEvent::default()
        };
        let mut buf = [0u8; TENSOR_RECORD_MAX_LEN];
        let mut e = Encoder::new(&mut buf);
        t.encode_payload_with_shape(&mut e, &[]);
        file.write(e.finish(kind::TENSOR));
        recorded = 0;
    });
    recorded
}

/// The label of everything the trace holds from before the attach.
pub const BEFORE_ATTACH: &[u8] = b"before attach";
