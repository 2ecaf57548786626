//! The recorder: one append-only trace file per process, one `write(2)` per record.
//!
//! State machine ([`STATE`]): `IDLE` (nothing written yet) → `OPENING` (one thread creates the
//! file and writes the header) → `RECORDING`; `FAILED` when anything went wrong (recording stops,
//! one warning on stderr, the host carries on). Threads that meet `OPENING` yield until it is
//! over; nothing here ever holds a lock, let alone while the real driver runs.
//!
//! After `fork` the child handler ([`after_fork_child`]) closes the inherited descriptor and goes
//! back to `IDLE`, so the child creates its own file, with its own pid and ppid, on its first
//! event. Once `RECORDING`, the descriptor is never closed (even on a write error: another
//! thread may be writing to it, and the number could be reused under it).

use core::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU64, Ordering};

use vramtrace_format::{
    EVENT_RECORD_LEN, Encoder, Event, EventKind, FRAME_HEADER_LEN, Header, MemKind, kind,
    trace_file_name,
};

use crate::driver::{Entry, real_fn};
use crate::ffi::{
    CuDevice, FnCtxGetDevice, FnDeviceGetName, FnDeviceTotalMem, FnDriverGetVersion, FnMemGetInfo,
};
use crate::guard::ReentrancyGuard;

const IDLE: u8 = 0;
const OPENING: u8 = 1;
const RECORDING: u8 = 2;
const FAILED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(IDLE);
static FD: AtomicI32 = AtomicI32::new(-1);
static WARNED: AtomicBool = AtomicBool::new(false);
static ATFORK_REGISTERED: AtomicBool = AtomicBool::new(false);
/// Device ordinals 0..256 whose DEVICE record has been written.
static DEVICES_SEEN: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

thread_local! {
    static TID: core::cell::Cell<u32> = const { core::cell::Cell::new(0) };
}

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
        if !active() {
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

    /// `kind` on success; otherwise `AllocFailed`, with the device's free and total memory as
    /// `cuMemGetInfo_v2` reports them now (called by us; nothing the program sees changes).
    fn acquired(self, kind: EventKind, result: c_int, op: Op) {
        guarded(|| {
            if result == 0 {
                emit(kind, result, op, 0, 0)
            } else {
                let (free, total) = mem_info();
                emit(EventKind::AllocFailed, result, op, free, total)
            }
        });
    }

    /// `kind` on success, `FreeFailed` otherwise; size 0 either way.
    fn released(self, kind: EventKind, result: c_int, op: Op) {
        let kind = if result == 0 {
            kind
        } else {
            EventKind::FreeFailed
        };
        guarded(|| emit(kind, result, Op { size: 0, ..op }, 0, 0));
    }
}

/// True when recording is configured on and has not failed.
#[inline]
pub(crate) fn active() -> bool {
    crate::config::enabled() && STATE.load(Ordering::Relaxed) != FAILED
}

/// Runs `f` with the trace file's descriptor (creating the file first if needed), with panics
/// caught and errno preserved. Does nothing when recording is off or has failed.
pub(crate) fn with_file(f: impl FnOnce(c_int)) {
    if !active() {
        return;
    }
    guarded(|| {
        if let Some(fd) = ensure_open() {
            f(fd)
        }
    });
}

/// Runs recorder code with panics caught and errno preserved: a bug here disables recording
/// and never unwinds into the host or changes what it sees.
pub(crate) fn guarded(f: impl FnOnce()) {
    let saved = errno();
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        disable("internal error in the recorder");
    }
    set_errno(saved);
}

fn errno() -> c_int {
    // Safety: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

fn set_errno(v: c_int) {
    // Safety: as above.
    unsafe { *libc::__errno_location() = v }
}

/// `CLOCK_MONOTONIC` in nanoseconds.
pub(crate) fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // Safety: valid clock id and out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The kernel thread id, cached per thread (reset in a fork child).
pub(crate) fn tid() -> u32 {
    TID.try_with(|c| {
        let t = c.get();
        if t != 0 {
            return t;
        }
        // Safety: gettid has no preconditions.
        let t = unsafe { libc::gettid() } as u32;
        c.set(t);
        t
    })
    // Safety: as above (thread-local storage already torn down).
    .unwrap_or_else(|_| unsafe { libc::gettid() } as u32)
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

/// Builds and writes one event.
fn emit(kind: EventKind, result: c_int, op: Op, free_bytes: u64, total_bytes: u64) {
    let device = match op.device {
        Dev::Known(d) => d,
        Dev::Current => current_device(),
    };
    // After the open, so that the header's start time never follows the first event.
    let Some(fd) = ensure_open() else { return };
    let t_ns = mono_ns();
    if device >= 0 {
        note_device(fd, device);
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
        stack: crate::stacks::capture(fd),
        label: crate::labels::current_label(fd),
    };
    let mut rec = [0u8; EVENT_RECORD_LEN];
    ev.encode(&mut rec);
    write_record(fd, &rec);
}

/// Writes a DEVICE record the first time an ordinal appears.
fn note_device(fd: c_int, device: i32) {
    let d = device as usize;
    if d >= DEVICES_SEEN.len() * 64 {
        return;
    }
    let bit = 1u64 << (d % 64);
    if DEVICES_SEEN[d / 64].fetch_or(bit, Ordering::AcqRel) & bit != 0 {
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
    write_record(fd, e.finish(kind::DEVICE));
}

/// The descriptor of the trace file, creating it (header and driver record first) on the
/// first call. `None` when recording is off or failed.
fn ensure_open() -> Option<c_int> {
    let mut spins = 0u32;
    loop {
        match STATE.load(Ordering::Acquire) {
            RECORDING => return Some(FD.load(Ordering::Acquire)),
            IDLE => {
                if STATE
                    .compare_exchange(IDLE, OPENING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return match open_trace() {
                        Ok(fd) => {
                            FD.store(fd, Ordering::Release);
                            STATE.store(RECORDING, Ordering::Release);
                            Some(fd)
                        }
                        Err(why) => {
                            disable(&why);
                            None
                        }
                    };
                }
            }
            OPENING => {
                // Another thread is creating the file: a few system calls. Give up on this
                // event rather than wait forever if something is badly wrong.
                spins += 1;
                if spins > 100_000 {
                    return None;
                }
                // Safety: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
            _ => return None,
        }
    }
}

/// Creates `<dir>/<pid>[-n].vtr` exclusively and writes the header and the driver version.
fn open_trace() -> Result<c_int, String> {
    register_atfork();
    let dir = crate::config::dir().ok_or("no trace directory")?;
    // Like `mkdir -p`. EEXIST (the usual case) and other errors are ignored here: the open
    // below reports what matters.
    let mut prefix = Vec::with_capacity(dir.len() + 1);
    for (i, &b) in dir.iter().enumerate() {
        if b == b'/' && i > 0 || i + 1 == dir.len() {
            prefix.clear();
            prefix.extend_from_slice(&dir[..if b == b'/' { i } else { i + 1 }]);
            prefix.push(0);
            // Safety: a valid C string.
            unsafe { libc::mkdir(prefix.as_ptr() as *const c_char, 0o755) };
        }
    }
    // Safety: no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let mut fd = -1;
    for attempt in 0..10_000 {
        let mut path = dir.to_vec();
        path.push(b'/');
        path.extend_from_slice(trace_file_name(pid, attempt).as_bytes());
        path.push(0);
        // Safety: valid C string, plain flags.
        fd = unsafe {
            libc::open(
                path.as_ptr() as *const c_char,
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC,
                0o644,
            )
        };
        if fd >= 0 || errno() != libc::EEXIST {
            break;
        }
    }
    if fd < 0 {
        return Err(format!(
            "cannot create a trace file in {}: {}",
            String::from_utf8_lossy(dir),
            std::io::Error::last_os_error()
        ));
    }
    let header = Header {
        version: vramtrace_format::VERSION,
        pid,
        // Safety: no preconditions.
        ppid: unsafe { libc::getppid() } as u32,
        start_unix_ns: clock_ns(libc::CLOCK_REALTIME),
        start_mono_ns: mono_ns(),
        hostname: hostname(),
        cmdline: cmdline(),
    };
    let mut bytes = Vec::with_capacity(512);
    header.encode(&mut bytes);
    if !write_all(fd, &bytes) {
        return Err(format!(
            "cannot write the trace header: {}",
            std::io::Error::last_os_error()
        ));
    }
    // Safety: FnDriverGetVersion is cuDriverGetVersion's signature.
    if let Some(version) = unsafe { real_fn::<FnDriverGetVersion>(Entry::DriverGetVersion) } {
        let mut v: c_int = 0;
        // Safety: the driver's cuDriverGetVersion with a valid out-pointer.
        if unsafe { version(&mut v) } == 0 {
            let mut buf = [0u8; FRAME_HEADER_LEN + 4];
            let mut e = Encoder::new(&mut buf);
            e.i32(v);
            write_all(fd, e.finish(kind::DRIVER));
        }
    }
    Ok(fd)
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // Safety: buffer and its length.
    if unsafe { libc::gethostname(buf.as_mut_ptr() as *mut c_char, buf.len()) } != 0 {
        return String::new();
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn cmdline() -> Vec<String> {
    std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `bytes` completely (retrying on EINTR and short writes). False on error.
fn write_all(fd: c_int, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        // Safety: valid buffer and length.
        let n = unsafe { libc::write(fd, bytes.as_ptr() as *const libc::c_void, bytes.len()) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return false;
        }
        bytes = &bytes[n as usize..];
    }
    true
}

/// Appends one record; a write error stops recording.
pub(crate) fn write_record(fd: c_int, rec: &[u8]) {
    if !write_all(fd, rec) {
        disable(&format!(
            "cannot write the trace file: {}",
            std::io::Error::last_os_error()
        ));
    }
}

/// Writes a NOTE record: something the recorder wants the reader to know.
pub(crate) fn note(text: &[u8]) {
    with_file(|fd| {
        let mut buf = [0u8; FRAME_HEADER_LEN + 8 + 512];
        let mut e = Encoder::new(&mut buf);
        e.u64(mono_ns()).bytes(&text[..text.len().min(512)]);
        write_record(fd, e.finish(kind::NOTE));
    });
}

/// Stops recording for good in this process and says why on stderr, once.
pub(crate) fn disable(why: &str) {
    STATE.store(FAILED, Ordering::Release);
    if !WARNED.swap(true, Ordering::AcqRel) {
        let msg = format!("vramtrace: recording stopped: {why}\n");
        // Safety: writing a valid buffer to stderr; the result is deliberately ignored.
        unsafe { libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len()) };
    }
}

fn register_atfork() {
    if !ATFORK_REGISTERED.swap(true, Ordering::AcqRel) {
        // Safety: registering a child handler that only touches atomics and this thread's TLS.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
    }
}

/// In the child after `fork`: forget the parent's file so the child writes its own.
extern "C" fn after_fork_child() {
    let fd = FD.swap(-1, Ordering::AcqRel);
    let state = STATE.load(Ordering::Acquire);
    if state == RECORDING || state == OPENING {
        if fd >= 0 {
            // Safety: the child's copy of the parent's descriptor; the child is single-threaded
            // now, so nobody else is using it.
            unsafe { libc::close(fd) };
        }
        STATE.store(IDLE, Ordering::Release);
    }
    for seen in &DEVICES_SEEN {
        seen.store(0, Ordering::Release);
    }
    let _ = TID.try_with(|c| c.set(0));
    ReentrancyGuard::reset_after_fork();
    crate::labels::after_fork_child();
    crate::stacks::after_fork_child();
}
