//! Configuration from the environment, read once, lazily, on the first CUDA activity.
//!
//! - `VRAMTRACE_DIR`: the trace directory. A relative one is resolved once, against the working
//!   directory at the first CUDA activity, so a later `chdir` does not move the trace. Unset or
//!   empty: the library only passes calls through.
//! - `VRAMTRACE_DISABLE`: any value but empty or `0` turns recording off.
//! - `VRAMTRACE_STACKS`: `0`, `off`, `false` or `no` records no native stacks; `1`, `on`, `true`
//!   or `yes` (the default) records them.
//! - `VRAMTRACE_FREE_STACKS`: `1`, `on`, `true` or `yes` records native stacks on successful
//!   releases too; `0`, `off`, `false` or `no` (the default) does not (allocations, mappings and
//!   failures always get theirs).
//! - `VRAMTRACE_PYTHON`: `0`, `off`, `false` or `no` records no Python frames; `1`, `on`, `true`
//!   or `yes` (the default) records them.
//! - `VRAMTRACE_SELF_TIME`: `1`, `on`, `true` or `yes` times native tensor capture's own steps
//!   (the tracker, the frames, the record) for the probe's `VRAMTRACE_TORCH_PROBE_STATS` line;
//!   off by default (two clock readings per step).
//!
//! - `VRAMTRACE_MAX_SIZE`: a size budget for the trace file, in bytes (a plain number; `vramtrace
//!   run --max-size` passes one). Tensor-level records are then kept in a ring of blocks whose
//!   oldest are reused once the file would pass the budget (`src/sink.rs`; at least four blocks
//!   of 64 KiB beside the header); unset, empty or `0`: no budget. Anything else is one line on stderr and no budget.
//!
//! Any other value of a switch is one line on stderr ("vramtrace: ignoring VRAMTRACE_STACKS=…")
//! and its default; the value itself is not echoed past 64 bytes.
//!
//! A process the kernel runs in secure mode (`getauxval(AT_SECURE)`: set-user-ID or
//! set-group-ID, or file capabilities) is never traced: its environment comes from a less
//! privileged caller, so the library only passes calls through and writes nothing.
//!
//! Read with `getenv` on first use, never in a constructor: constructors run while the dynamic
//! linker is still setting the process up.

use core::ffi::{CStr, c_char, c_int};
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicU64, Ordering};

const UNREAD: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNREAD);
static STACKS: AtomicU8 = AtomicU8::new(UNREAD);
static FREE_STACKS: AtomicU8 = AtomicU8::new(UNREAD);
static PYTHON: AtomicU8 = AtomicU8::new(UNREAD);
static SELF_TIME: AtomicU8 = AtomicU8::new(UNREAD);
/// The trace directory, NUL-terminated, leaked once (`Box<[u8]>` turned raw).
static DIR: AtomicPtr<u8> = AtomicPtr::new(core::ptr::null_mut());

/// True when recording is configured on. Cheap after the first call.
#[inline]
pub(crate) fn enabled() -> bool {
    match STATE.load(Ordering::Acquire) {
        ON => true,
        OFF => false,
        _ => read(),
    }
}

/// True when native stacks are to be recorded (`VRAMTRACE_STACKS` is not `0`/`off`/`false`).
#[inline]
pub(crate) fn stacks() -> bool {
    switch(&STACKS, c"VRAMTRACE_STACKS", true)
}

/// A documented value of a switch: `Some(true)` for `1`/`on`/`true`/`yes`, `Some(false)` for
/// `0`/`off`/`false`/`no`, `None` for anything else.
fn parse_switch(v: &[u8]) -> Option<bool> {
    match v {
        b"1" | b"on" | b"true" | b"yes" => Some(true),
        b"0" | b"off" | b"false" | b"no" => Some(false),
        _ => None,
    }
}

/// Reads switch `name` once into `slot`: unset or empty is `default`; a value that is not one
/// of [`parse_switch`]'s is one line on stderr and `default`.
#[inline]
fn switch(slot: &AtomicU8, name: &CStr, default: bool) -> bool {
    match slot.load(Ordering::Acquire) {
        ON => true,
        OFF => false,
        _ => read_switch(slot, name, default),
    }
}

/// [`switch`]'s first read, kept out of line.
#[cold]
fn read_switch(slot: &AtomicU8, name: &CStr, default: bool) -> bool {
    let on = match env(name) {
        None | Some(b"") => default,
        Some(v) => parse_switch(v).unwrap_or_else(|| {
            warn_value(name, v, default);
            default
        }),
    };
    slot.store(if on { ON } else { OFF }, Ordering::Release);
    on
}

/// One line on stderr for an undocumented value (at most its first 64 bytes, control bytes
/// shown as `?`). Threads racing on the first read may each print it; that is the only repeat.
#[cold]
fn warn_value(name: &CStr, v: &[u8], default: bool) {
    let mut line = Vec::with_capacity(160);
    line.extend_from_slice(b"vramtrace: ignoring ");
    line.extend_from_slice(name.to_bytes());
    line.push(b'=');
    line.extend(v.iter().take(64).map(|&b| {
        if b.is_ascii_graphic() || b == b' ' {
            b
        } else {
            b'?'
        }
    }));
    line.extend_from_slice(if default {
        b" (expected 1/on/true/yes or 0/off/false/no); using the default, on\n"
    } else {
        b" (expected 1/on/true/yes or 0/off/false/no); using the default, off\n"
    });
    // Safety: writing a valid buffer to stderr; the result is deliberately ignored.
    unsafe { libc::write(2, line.as_ptr() as *const libc::c_void, line.len()) };
}

/// True when successful releases get native stacks too (`VRAMTRACE_FREE_STACKS` is `1`, `on`,
/// `true` or `yes`, and stacks are on). Off by default: attribution needs the allocation's
/// stack, and the unwind is most of a hook's cost.
#[inline]
pub(crate) fn free_stacks() -> bool {
    switch(&FREE_STACKS, c"VRAMTRACE_FREE_STACKS", false)
}

/// True when the Python frames of events are to be recorded (`VRAMTRACE_PYTHON` is not
/// `0`/`off`/`false`/`no`).
#[inline]
pub(crate) fn python() -> bool {
    switch(&PYTHON, c"VRAMTRACE_PYTHON", true)
}

/// True when native tensor capture times its own steps (`VRAMTRACE_SELF_TIME` is `1`, `on`,
/// `true` or `yes`).
#[inline]
pub(crate) fn self_time() -> bool {
    switch(&SELF_TIME, c"VRAMTRACE_SELF_TIME", false)
}

/// `VRAMTRACE_MAX_SIZE` read (`u64::MAX`: not read yet; 0: no budget).
static MAX_SIZE: AtomicU64 = AtomicU64::new(u64::MAX);

/// The trace file's size budget in bytes (`VRAMTRACE_MAX_SIZE`); 0 for none.
pub(crate) fn max_size() -> u64 {
    let v = MAX_SIZE.load(Ordering::Relaxed);
    if v != u64::MAX {
        return v;
    }
    let v = match env(c"VRAMTRACE_MAX_SIZE") {
        None | Some(b"") => 0,
        Some(s) => match parse_decimal(s) {
            Some(v) if v != u64::MAX => v,
            _ => {
                let shown = &s[..s.len().min(64)];
                let mut line = [0u8; 160];
                let mut n = 0;
                for part in [
                    &b"vramtrace: ignoring VRAMTRACE_MAX_SIZE="[..],
                    shown,
                    b" (a number of bytes): no size budget\n",
                ] {
                    line[n..n + part.len()].copy_from_slice(part);
                    n += part.len();
                }
                // Safety: writing a valid buffer to stderr; the result is ignored.
                unsafe { libc::write(2, line.as_ptr() as *const libc::c_void, n) };
                0
            }
        },
    };
    MAX_SIZE.store(v, Ordering::Relaxed);
    v
}

/// A plain decimal number, `None` for anything else or an overflow.
fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &c| {
        c.is_ascii_digit()
            .then(|| acc.checked_mul(10)?.checked_add((c - b'0') as u64))
            .flatten()
    })
}

/// The trace directory (without its NUL), if recording is on.
pub(crate) fn dir() -> Option<&'static [u8]> {
    if !enabled() {
        return None;
    }
    let p = DIR.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    // Safety: DIR only ever holds a leaked, NUL-terminated buffer that is never freed.
    Some(unsafe { CStr::from_ptr(p as *const c_char) }.to_bytes())
}

fn env(name: &CStr) -> Option<&'static [u8]> {
    // Safety: getenv with a valid C string; the result points into the environment, which we
    // only read (a concurrent setenv is the host's own race, as for any getenv).
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        None
    } else {
        // Safety: getenv returns a NUL-terminated string.
        Some(unsafe { CStr::from_ptr(p) }.to_bytes())
    }
}

/// True when the kernel started this process in secure mode (`AT_SECURE`: set-user-ID or
/// set-group-ID, or file capabilities). Such a program's environment is chosen by a less
/// privileged caller, so it is not traced at all: no file is created with its privileges.
fn secure_mode() -> bool {
    // Safety: getauxval has no preconditions; an absent entry reads 0.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// Reads the environment. Threads racing here compute the same answer; the first to publish
/// the directory wins and the others free theirs.
#[cold]
fn read() -> bool {
    let disabled = matches!(env(c"VRAMTRACE_DISABLE"), Some(v) if !v.is_empty() && v != b"0");
    let dir = env(c"VRAMTRACE_DIR").filter(|d| !d.is_empty());
    let on = match (disabled || secure_mode(), dir) {
        (false, Some(d)) => {
            let mut owned = Vec::with_capacity(d.len() + 1);
            // A relative directory is taken relative to the working directory of now, so that
            // a later chdir does not move the trace.
            // Without a working directory to resolve it against, a relative one is refused.
            if d[0] != b'/' {
                let Ok(cwd) = std::env::current_dir() else {
                    let msg = b"vramtrace: VRAMTRACE_DIR is relative and the working directory cannot be read; not recording\n";
                    // Safety: writing a valid buffer to stderr; the result is ignored.
                    unsafe { libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len()) };
                    STATE.store(OFF, Ordering::Release);
                    return false;
                };
                use std::os::unix::ffi::OsStrExt;
                owned.extend_from_slice(cwd.as_os_str().as_bytes());
                owned.push(b'/');
            }
            owned.extend_from_slice(d);
            owned.push(0);
            let len = owned.len();
            let raw = Box::into_raw(owned.into_boxed_slice()) as *mut u8;
            if DIR
                .compare_exchange(
                    core::ptr::null_mut(),
                    raw,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
            {
                // Safety: `raw` came from Box::into_raw just above with this length and was
                // never published.
                drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(raw, len)) });
            }
            true
        }
        _ => false,
    };
    if on {
        // Our panics are caught and end recording with one line on stderr; the default hook
        // (of this library's own copy of std) would print more.
        std::panic::set_hook(Box::new(|_| {}));
    }
    STATE.store(if on { ON } else { OFF }, Ordering::Release);
    on
}

/// Why [`start_attached`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttachRefusal {
    /// Recording is already on from the environment (`vramtrace run`'s `LD_PRELOAD`).
    AlreadyRecording,
    /// The process runs in secure mode (set-user-ID, set-group-ID, file capabilities).
    SecureMode,
    /// The directory is empty or not absolute.
    BadDirectory,
}

/// Turns recording on for a library loaded late by `vramtrace attach` (`src/attach.rs`), with
/// `dir` (absolute) as the trace directory, whatever the environment says. Refuses when the
/// environment already turned recording on, or in secure mode.
pub(crate) fn start_attached(dir: &[u8]) -> Result<(), AttachRefusal> {
    if dir.first() != Some(&b'/') {
        return Err(AttachRefusal::BadDirectory);
    }
    if enabled() {
        return Err(AttachRefusal::AlreadyRecording);
    }
    if secure_mode() {
        return Err(AttachRefusal::SecureMode);
    }
    let mut owned = Vec::with_capacity(dir.len() + 1);
    owned.extend_from_slice(dir);
    owned.push(0);
    let raw = Box::into_raw(owned.into_boxed_slice()) as *mut u8;
    // A directory from an earlier attach (or none) is replaced; the old one is leaked, as a
    // reader on another thread may still hold it.
    DIR.store(raw, Ordering::Release);
    std::panic::set_hook(Box::new(|_| {}));
    STATE.store(ON, Ordering::Release);
    Ok(())
}

/// Turns recording off again (`vramtrace detach`): hooked calls from now on pass straight
/// through. A call already past its check finishes its record.
pub(crate) fn stop_attached() {
    STATE.store(OFF, Ordering::Release);
}

/// Writes `line` (one line, at most `PIPE_BUF` bytes, so it arrives whole) to the status pipe
/// that `vramtrace run` passes as `VRAMTRACE_STATUS_FD=<fd>:<inode>`, if that descriptor is
/// still that pipe (`/proc/self/fd/<fd>` reads `pipe:[<inode>]`): a program that closed it and
/// reused the number for a pipe of its own never gets our line. The pipe is non-blocking (set
/// by `run`), so a full pipe drops the line instead of stalling the program. Anything else
/// (unset, malformed, another file) writes nothing.
pub(crate) fn report_status(line: &[u8]) {
    let Some(v) = env(c"VRAMTRACE_STATUS_FD") else {
        return;
    };
    let Some((fd, ino)) = parse_status_fd(v) else {
        return;
    };
    let mut path = [0u8; 40];
    let mut n = 0;
    for &b in b"/proc/self/fd/" {
        path[n] = b;
        n += 1;
    }
    n += put_decimal(&mut path[n..], fd as u64);
    path[n] = 0;
    let mut want = [0u8; 32];
    let mut w = 0;
    for &b in b"pipe:[" {
        want[w] = b;
        w += 1;
    }
    w += put_decimal(&mut want[w..], ino);
    want[w] = b']';
    w += 1;
    let mut got = [0u8; 32];
    // Safety: a NUL-terminated path and a buffer of the length given.
    let len = unsafe {
        libc::readlink(
            path.as_ptr() as *const c_char,
            got.as_mut_ptr() as *mut c_char,
            got.len(),
        )
    };
    if len < 0 || got[..len as usize] != want[..w] {
        return;
    }
    let line = &line[..line.len().min(libc::PIPE_BUF)];
    // Safety: the descriptor is the pipe named above; a valid buffer. A failure (full pipe,
    // reader gone: SIGPIPE is the program's own business only if it writes there itself, and
    // EPIPE here is ignored) leaves the program unaffected.
    unsafe { libc::write(fd, line.as_ptr() as *const libc::c_void, line.len()) };
}

/// `<fd>:<inode>`, both decimal.
fn parse_status_fd(v: &[u8]) -> Option<(c_int, u64)> {
    let colon = v.iter().position(|&b| b == b':')?;
    let num = |s: &[u8]| -> Option<u64> {
        if s.is_empty() || s.len() > 19 || !s.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(s.iter().fold(0u64, |a, &d| a * 10 + u64::from(d - b'0')))
    };
    let fd = num(&v[..colon])?;
    let ino = num(&v[colon + 1..])?;
    (fd <= c_int::MAX as u64).then_some((fd as c_int, ino))
}

/// Writes `v` in decimal into `out`; returns its length.
fn put_decimal(out: &mut [u8], mut v: u64) -> usize {
    let mut digits = [0u8; 20];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in 0..n {
        out[i] = digits[n - 1 - i];
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_accept_only_documented_values() {
        for v in [&b"1"[..], b"on", b"true", b"yes"] {
            assert_eq!(parse_switch(v), Some(true));
        }
        for v in [&b"0"[..], b"off", b"false", b"no"] {
            assert_eq!(parse_switch(v), Some(false));
        }
        for v in [&b"2"[..], b"ON", b"of", b" 0", b"enable"] {
            assert_eq!(parse_switch(v), None);
        }
    }

    #[test]
    fn the_status_descriptor_is_a_number_and_an_inode() {
        assert_eq!(parse_status_fd(b"5:123"), Some((5, 123)));
        for v in [
            &b""[..],
            b"5",
            b":1",
            b"5:",
            b"-1:3",
            b"5:x",
            b"99999999999:1",
        ] {
            assert_eq!(parse_status_fd(v), None, "{}", String::from_utf8_lossy(v));
        }
        let mut b = [0u8; 20];
        let n = put_decimal(&mut b, 18446744073709551615);
        assert_eq!(&b[..n], b"18446744073709551615");
        assert_eq!(put_decimal(&mut b, 0), 1);
    }
}
