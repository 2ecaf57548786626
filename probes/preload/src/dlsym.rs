//! The `dlsym` override.
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
//! result through [`crate::routing::route_dlsym`]. Nothing in this library ever calls the
//! exported `dlsym`: its own lookups go to glibc's ([`crate::real_dlsym`]).

use core::ffi::{c_char, c_void};

use crate::real_dlsym::{REAL_DLSYM, real_dlsym, vramtrace_init_real_dlsym};
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

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the vramtrace preload's dlsym override is written for x86-64 and aarch64 only");
