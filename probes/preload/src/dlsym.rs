//! The `dlsym` and `dlvsym` overrides.
//!
//! The CUDA runtime and cudarc find the driver with `dlopen` + `dlsym(handle, …)`; a lookup on
//! a handle never sees LD_PRELOAD symbols, so the only way to hand them our wrappers is to be
//! `dlsym`. The export is a naked function so that for the pseudo-handles it is not there at
//! all: `RTLD_NEXT` and `RTLD_DEFAULT` lookups are resolved relative to the *caller's* object
//! (its position in the search order, its local scope), and a C-level forwarder would make the
//! preload the caller (the OpenMP loop of HAMi-core PR #315). It tail-jumps to the real `dlsym`
//! with the registers and return address untouched. `RTLD_DEFAULT` needs no substitution anyway:
//! the preload comes first in the global scope, so the real lookup already finds our exports.
//!
//! Every other handle goes to [`dlsym_on_handle`], which calls the real `dlsym` (for a real
//! handle the result does not depend on the caller) and, for `cu[A-Z]…` names only, routes the
//! result through [`crate::routing::route_dlsym`].
//!
//! # `dlvsym`
//! Another library that interposes `dlsym` and is loaded before ours (HAMi-core and other
//! shims) finds "the next `dlsym`" with `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")` (or
//! `GLIBC_2.2.5`). glibc marks a version asked for that way hidden, so it skips our unversioned
//! `dlsym` and hands over its own: the program's lookups would bypass us. Our export cannot be
//! versioned (rustc writes an anonymous version script, which cannot be combined with named
//! version nodes), so the preload exports `dlvsym` too, also naked: it asks
//! [`vramtrace_dlvsym_pick`] which function should answer, then jumps there with the caller's
//! arguments and return address, so glibc still sees the real caller:
//! - `"dlsym"` on a pseudo-handle: our `dlsym` (if glibc has a `dlsym` of that version). It is
//!   transparent for pseudo-handles, so it is safe to hand to anyone, before or after us.
//! - `"dlsym"` on a real handle: glibc's answer, with our `dlsym` in place of glibc's.
//! - A `cu[A-Z]…` name on a real handle: glibc's answer, routed as `dlsym` routes it.
//! - Anything else: glibc's `dlvsym` itself (a pure tail jump).
//!
//! Nothing in this library ever calls the exported `dlsym` or `dlvsym` (a call from here would
//! bind to our own export): its own lookups go to glibc's ([`crate::real_dlsym`]), found in
//! glibc's symbol table ([`crate::elf_lookup`]).

use core::ffi::{c_char, c_void};

use std::sync::atomic::Ordering;

use crate::real_dlsym::{
    REAL_DLSYM, real_dlsym, real_dlvsym, real_dlvsym_ptr, vramtrace_init_real_dlsym,
};
use crate::routing::{name_bytes, route_dlsym};

/// Cheap filter run on every lookup before any table work: driver API names are `cu[A-Z]…`.
#[inline]
// `c_char` is `u8` on aarch64, `i8` on x86-64: the cast is needed on one of them.
#[allow(clippy::unnecessary_cast)]
fn is_driver_name(s: *const c_char) -> bool {
    // Safety: `s` is a NUL-terminated string (dlsym's contract); the && chain stops at the NUL
    // before reading past it.
    unsafe {
        *s == b'c' as c_char
            && *s.add(1) == b'u' as c_char
            && (*s.add(2) as u8).is_ascii_uppercase()
    }
}

/// `dlsym` on a real handle: the real lookup, then our wrapper if the result is a driver entry
/// point we wrap. Called only from the naked `dlsym`.
extern "C" fn vramtrace_dlsym_on_handle(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    dlsym_on_handle(handle, symbol)
}

fn dlsym_on_handle(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let p = real_dlsym(handle, symbol);
    route_found(handle, symbol, p)
}

/// `p`, the real lookup's answer for `symbol` on a real `handle`, or our wrapper if it is a
/// driver entry point we wrap.
fn route_found(handle: *mut c_void, symbol: *const c_char, p: *mut c_void) -> *mut c_void {
    if p.is_null() || symbol.is_null() || !is_driver_name(symbol) || !crate::config::enabled() {
        return p;
    }
    std::panic::catch_unwind(|| {
        // Safety: non-null, NUL-terminated (dlsym's contract).
        let name = unsafe { name_bytes(symbol) };
        route_dlsym(handle, name, p)
    })
    .unwrap_or_else(|_| {
        crate::sink::disable("internal error while routing dlsym");
        p
    })
}

/// Whether `s` is `"dlsym"`.
// `c_char` is `u8` on aarch64, `i8` on x86-64: the cast is needed on one of them.
#[allow(clippy::unnecessary_cast)]
fn is_dlsym_name(s: *const c_char) -> bool {
    // Safety: `s` is NUL-terminated; the comparison stops at the first byte that differs, so
    // it never reads past the NUL.
    b"dlsym\0"
        .iter()
        .enumerate()
        .all(|(i, &b)| unsafe { *s.add(i) } as u8 == b)
}

fn is_pseudo_handle(handle: *mut c_void) -> bool {
    handle.is_null() || handle == libc::RTLD_NEXT
}

unsafe extern "C" {
    /// A hidden alias of the exported `dlsym` (a label at its first instruction, set in its
    /// `naked_asm!`). Taking the address of `dlsym` itself could give another library's: the
    /// export is preemptible, so a reference to it goes through the global scope, where a
    /// `dlsym` interposer loaded before ours comes first.
    fn vramtrace_own_dlsym();
}

/// The exported `dlsym`'s address, as [`dlvsym()`] hands it out.
fn own_dlsym() -> *mut c_void {
    vramtrace_own_dlsym as *mut c_void
}

/// `dlvsym(RTLD_NEXT or RTLD_DEFAULT, "dlsym", version)`: our `dlsym` if glibc has a `dlsym`
/// of that version. For `RTLD_NEXT` always ours: it is transparent for pseudo-handles (the
/// lookup stays relative to whoever calls it), so it is safe to hand to a library before or
/// after ours in the order, and answering what comes next *after the preload* could hand a
/// versioned `dlsym` interposer itself (an endless loop). For `RTLD_DEFAULT` what glibc finds,
/// with ours in place of glibc's own.
extern "C" fn vramtrace_dlvsym_dlsym_pseudo(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    let p = real_dlvsym(libc::RTLD_DEFAULT, symbol, version);
    if p.is_null() {
        // No dlsym of that version: glibc's error is pending, as it would have been.
        return p;
    }
    if handle == libc::RTLD_NEXT || p == REAL_DLSYM.load(Ordering::Acquire) {
        own_dlsym()
    } else {
        p
    }
}

/// `dlvsym(handle, "dlsym", version)` on a real handle: glibc's answer, with our `dlsym` in
/// place of glibc's.
extern "C" fn vramtrace_dlvsym_dlsym_on_handle(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    let p = real_dlvsym(handle, symbol, version);
    if !p.is_null() && p == REAL_DLSYM.load(Ordering::Acquire) {
        own_dlsym()
    } else {
        p
    }
}

/// `dlvsym(handle, "cu…", version)` on a real handle: routed as [`dlsym_on_handle`] routes.
extern "C" fn vramtrace_dlvsym_driver_on_handle(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    route_found(handle, symbol, real_dlvsym(handle, symbol, version))
}

/// `dlvsym` when glibc's could not be found.
extern "C" fn vramtrace_dlvsym_null(
    _handle: *mut c_void,
    _symbol: *const c_char,
    _version: *const c_char,
) -> *mut c_void {
    core::ptr::null_mut()
}

/// Which function the naked `dlvsym` jumps to with its caller's arguments and return address.
/// Never null. Cheap: a few comparisons and, the first time, the lookup of glibc's functions.
extern "C" fn vramtrace_dlvsym_pick(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *const c_void {
    let real = real_dlvsym_ptr();
    if real.is_null() {
        return vramtrace_dlvsym_null as *const c_void;
    }
    if symbol.is_null() || version.is_null() {
        return real;
    }
    let pseudo = is_pseudo_handle(handle);
    if is_dlsym_name(symbol) {
        if pseudo {
            vramtrace_dlvsym_dlsym_pseudo as *const c_void
        } else {
            vramtrace_dlvsym_dlsym_on_handle as *const c_void
        }
    } else if !pseudo && is_driver_name(symbol) {
        vramtrace_dlvsym_driver_on_handle as *const c_void
    } else {
        // Everything else, pseudo-handles included: glibc's, with the caller untouched.
        real
    }
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
/// The exported `dlsym`. See the module docs.
///
/// # Safety
/// Same contract as glibc's `dlsym`.
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // rdi = handle, rsi = symbol. RTLD_NEXT is -1, RTLD_DEFAULT is 0.
    core::arch::naked_asm!(
        ".globl vramtrace_own_dlsym",
        ".hidden vramtrace_own_dlsym",
        "vramtrace_own_dlsym:",
        "cmp rdi, -1",
        "je 2f",
        "test rdi, rdi",
        "je 2f",
        "jmp {on_handle}",
        "2:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "je 3f",
        "jmp rax",
        "3:",
        // First use: find the real dlsym, keeping the arguments. Entry rsp is 8 mod 16;
        // two pushes and 8 more bytes align it for the call.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {init}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "je 4f",
        "jmp rax",
        "4:",
        "ret",
        on_handle = sym vramtrace_dlsym_on_handle,
        real = sym REAL_DLSYM,
        init = sym vramtrace_init_real_dlsym,
    )
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
/// The exported `dlsym` (aarch64). See the module docs: the same routing as on x86-64, ending
/// in `br` with x30 (the link register, the caller's return address that glibc reads for
/// `RTLD_NEXT`) untouched.
///
/// # Safety
/// Same contract as glibc's `dlsym`.
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // x0 = handle, x1 = symbol. RTLD_NEXT is -1, RTLD_DEFAULT is 0. x16 is the intra-procedure
    // scratch register (and a `br x16` lands on a BTI `bti c` pad).
    core::arch::naked_asm!(
        ".globl vramtrace_own_dlsym",
        ".hidden vramtrace_own_dlsym",
        "vramtrace_own_dlsym:",
        "cmn x0, #1",
        "b.eq 2f",
        "cbz x0, 2f",
        "b {on_handle}",
        "2:",
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "cbz x16, 3f",
        "br x16",
        "3:",
        // First use: find the real dlsym, keeping the arguments and x30 (the bl below
        // overwrites it; it is restored before the branch, so the caller glibc sees stays ours').
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {init}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbz x16, 4f",
        "br x16",
        "4:",
        "mov x0, xzr",
        "ret",
        on_handle = sym vramtrace_dlsym_on_handle,
        real = sym REAL_DLSYM,
        init = sym vramtrace_init_real_dlsym,
    )
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
/// The exported `dlvsym`. See the module docs: `vramtrace_dlvsym_pick` chooses the function,
/// which is entered with the caller's arguments and return address, as if called directly.
///
/// # Safety
/// Same contract as glibc's `dlvsym`.
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    // rdi = handle, rsi = symbol, rdx = version. Entry rsp is 8 mod 16; three pushes align it
    // for the call. The return address stays at the caller's [rsp] for the jump.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "push rdx",
        "call {pick}",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        pick = sym vramtrace_dlvsym_pick,
    )
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
/// The exported `dlvsym` (aarch64). See the x86-64 one: the chosen function is entered with
/// the caller's arguments and x30 untouched.
///
/// # Safety
/// Same contract as glibc's `dlvsym`.
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    // x0 = handle, x1 = symbol, x2 = version. The frame keeps x29/x30 (the bl overwrites x30;
    // it is restored before the branch) and the three arguments; 48 bytes keep sp 16-aligned.
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-48]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "str x2, [sp, #32]",
        "bl {pick}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldr x2, [sp, #32]",
        "ldp x29, x30, [sp], #48",
        "br x16",
        pick = sym vramtrace_dlvsym_pick,
    )
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the vramtrace preload's dlsym override is written for x86-64 and aarch64 only");
