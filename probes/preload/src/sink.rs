//! The sink: one append-only trace file per process, one `write(2)` per record, and the clock
//! and thread id every record carries.
//!
//! The interface is narrow on purpose, so that the way records reach the disk can change
//! behind it: [`with_file`] (or [`file()`] inside [`guarded`]) hands out the open trace file,
//! [`File::write`] appends one encoded record, [`mono_ns`] and [`tid`] are the clock and the
//! thread, [`active`] says whether recording is on, [`disable`] stops it. Everything above
//! encodes its records itself (`vramtrace_format`) and only ever hands bytes to the sink.
//!
//! State machine ([`STATE`]): `IDLE` (nothing written yet) → `OPENING` (one thread creates the
//! file and writes the header and the driver version) → `RECORDING`; `FAILED` when anything
//! went wrong (recording stops, one warning on stderr, the host carries on). Threads that meet
//! `OPENING` yield until it is over; nothing here ever holds a lock, let alone while the real
//! driver runs.
//!
//! After `fork` the child handler ([`after_fork_child`]) closes the inherited descriptor and goes
//! back to `IDLE`, so the child creates its own file, with its own pid and ppid, on its first
//! record. Once `RECORDING`, the descriptor is never closed (even on a write error: another
//! thread may be writing to it, and the number could be reused under it).

use core::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering};

use vramtrace_format::{Encoder, FRAME_HEADER_LEN, Header, kind, trace_file_name};

use crate::fork::ForkHandler;

const IDLE: u8 = 0;
const OPENING: u8 = 1;
const RECORDING: u8 = 2;
const FAILED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(IDLE);
static FD: AtomicI32 = AtomicI32::new(-1);
static WARNED: AtomicBool = AtomicBool::new(false);
static FORK: ForkHandler = ForkHandler::new(after_fork_child);

thread_local! {
    static TID: core::cell::Cell<u32> = const { core::cell::Cell::new(0) };
}

/// The open trace file, as [`with_file`] and [`file()`] hand it out: the only way to write.
#[derive(Clone, Copy, Debug)]
pub(crate) struct File(c_int);

impl File {
    /// Appends one encoded record (a frame from `vramtrace_format::Encoder`, or an event
    /// record) in one piece; a write error stops recording.
    pub(crate) fn write(self, record: &[u8]) {
        if !write_all(self.0, record) {
            disable(&format!(
                "cannot write the trace file: {}",
                std::io::Error::last_os_error()
            ));
        }
    }

    /// A file on a descriptor the test opened itself.
    #[cfg(test)]
    pub(crate) fn from_raw_fd(fd: c_int) -> File {
        File(fd)
    }
}

/// True when recording is configured on and has not failed.
#[inline]
pub(crate) fn active() -> bool {
    crate::config::enabled() && STATE.load(Ordering::Relaxed) != FAILED
}

/// Runs `f` with the trace file (creating it first if needed), with panics caught and errno
/// preserved. Does nothing when recording is off or has failed.
pub(crate) fn with_file(f: impl FnOnce(File)) {
    if !active() {
        return;
    }
    guarded(|| {
        if let Some(file) = file() {
            f(file)
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

/// The trace file, creating it (header and driver record first) on the first call. `None`
/// when recording is off or failed. Call it inside [`guarded`] (as [`with_file`] does).
pub(crate) fn file() -> Option<File> {
    let mut spins = 0u32;
    loop {
        match STATE.load(Ordering::Acquire) {
            RECORDING => return Some(File(FD.load(Ordering::Acquire))),
            IDLE => {
                if STATE
                    .compare_exchange(IDLE, OPENING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return match open_trace() {
                        Ok(fd) => {
                            FD.store(fd, Ordering::Release);
                            STATE.store(RECORDING, Ordering::Release);
                            Some(File(fd))
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
                // record rather than wait forever if something is badly wrong.
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
    FORK.register();
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
    if let Some(v) = crate::driver::driver_version() {
        let mut buf = [0u8; FRAME_HEADER_LEN + 4];
        let mut e = Encoder::new(&mut buf);
        e.i32(v);
        write_all(fd, e.finish(kind::DRIVER));
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

/// Stops recording for good in this process and says why on stderr, once.
pub(crate) fn disable(why: &str) {
    STATE.store(FAILED, Ordering::Release);
    if !WARNED.swap(true, Ordering::AcqRel) {
        let msg = format!("vramtrace: recording stopped: {why}\n");
        // Safety: writing a valid buffer to stderr; the result is deliberately ignored.
        unsafe { libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len()) };
    }
}

/// In the child after `fork`: forget the parent's file so the child writes its own, and the
/// parent's thread id.
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
    let _ = TID.try_with(|c| c.set(0));
}
