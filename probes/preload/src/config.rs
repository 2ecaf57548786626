//! Configuration from the environment, read once, lazily, on the first CUDA activity.
//!
//! - `VRAMTRACE_DIR`: the trace directory (a relative one is taken from the working directory
//!   at the first CUDA activity). Unset or empty: the library only passes calls through.
//! - `VRAMTRACE_DISABLE`: any value but empty or `0` turns recording off.
//! - `VRAMTRACE_STACKS`: `0` (or `off`, `false`) records no native stacks; on by default.
//! - `VRAMTRACE_FREE_STACKS`: `1` (or `on`, `true`, `yes`) records native stacks on successful
//!   releases too; off by default (allocations, mappings and failures always get theirs).
//!
//! - `VRAMTRACE_PYTHON`: `0` (or `off`, `false`, `no`) records no Python frames; on by default.
//!
//! Read with `getenv` on first use, never in a constructor: constructors run while the dynamic
//! linker is still setting the process up.

use core::ffi::{CStr, c_char};
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

const UNREAD: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNREAD);
static STACKS: AtomicU8 = AtomicU8::new(UNREAD);
static FREE_STACKS: AtomicU8 = AtomicU8::new(UNREAD);
static PYTHON: AtomicU8 = AtomicU8::new(UNREAD);
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
    match STACKS.load(Ordering::Acquire) {
        ON => true,
        OFF => false,
        _ => {
            let off = matches!(
                env(c"VRAMTRACE_STACKS"),
                Some(b"0") | Some(b"off") | Some(b"false") | Some(b"no")
            );
            STACKS.store(if off { OFF } else { ON }, Ordering::Release);
            !off
        }
    }
}

/// True when successful releases get native stacks too (`VRAMTRACE_FREE_STACKS` is `1`, `on`,
/// `true` or `yes`, and stacks are on). Off by default: attribution needs the allocation's
/// stack, and the unwind is most of a hook's cost.
#[inline]
pub(crate) fn free_stacks() -> bool {
    match FREE_STACKS.load(Ordering::Acquire) {
        ON => true,
        OFF => false,
        _ => {
            let on = matches!(
                env(c"VRAMTRACE_FREE_STACKS"),
                Some(b"1") | Some(b"on") | Some(b"true") | Some(b"yes")
            );
            FREE_STACKS.store(if on { ON } else { OFF }, Ordering::Release);
            on
        }
    }
}

/// True when the Python frames of events are to be recorded (`VRAMTRACE_PYTHON` is not
/// `0`/`off`/`false`/`no`).
#[inline]
pub(crate) fn python() -> bool {
    match PYTHON.load(Ordering::Acquire) {
        ON => true,
        OFF => false,
        _ => {
            let off = matches!(
                env(c"VRAMTRACE_PYTHON"),
                Some(b"0") | Some(b"off") | Some(b"false") | Some(b"no")
            );
            PYTHON.store(if off { OFF } else { ON }, Ordering::Release);
            !off
        }
    }
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

/// Reads the environment. Threads racing here compute the same answer; the first to publish
/// the directory wins and the others free theirs.
#[cold]
fn read() -> bool {
    let disabled = matches!(env(c"VRAMTRACE_DISABLE"), Some(v) if !v.is_empty() && v != b"0");
    let dir = env(c"VRAMTRACE_DIR").filter(|d| !d.is_empty());
    let on = match (disabled, dir) {
        (false, Some(d)) => {
            let mut owned = Vec::with_capacity(d.len() + 1);
            // A relative directory is taken relative to the working directory of now, so that
            // a later chdir does not move the trace.
            if d[0] != b'/'
                && let Ok(cwd) = std::env::current_dir()
            {
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
